"""Checkpoints and expired-log clean-up of a table, off the commit path.

A checkpoint (delta-rs ``create_checkpoint``) and a clean-up (``cleanup_metadata``) both read the
whole log; inside a commit they made one commit in ten (or a hundred) take seconds on a long
history. :class:`LogMaintenance` runs them on a worker thread of its own instead: a commit only
tells it the version it wrote (:meth:`LogMaintenance.committed`) and returns at once.

Guarantees:
    * a checkpoint is written once the table crossed a multiple of its
      ``delta.checkpointInterval`` (default 100, as delta-rs) since the last one written here,
      at the newest version the worker reads (any version is a valid checkpoint version);
    * expired log files are cleaned up every ``cleanup_every`` versions, honouring
      ``delta.enableExpiredLogCleanup`` and ``delta.logRetentionDuration`` (delta-rs's rules);
    * a failure is logged and retried (after a pause that grows to :data:`MAX_RETRY_DELAY`), never
      raised into a commit; work that is due stays due until it succeeds or the process ends (a
      process that ends first leaves the table as after a commit without a checkpoint: valid,
      and the next interval writes one);
    * the worker never waits for a commit nor a commit for it; one checkpoint at a time;
    * the process never exits in the middle of a step: at interpreter exit every worker is
      stopped and the step it is in (delta-rs native code, which crashed the interpreter
      with SIGSEGV when it was still running during finalisation) is waited for, up to
      :data:`EXIT_WAIT` seconds; work still due is left undone (the next process does it).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections.abc import Mapping

from deltalake import DeltaTable

from committers.delta.storage._storage import TableLocation
from framework.connector import crash_point

__all__ = ["DEFAULT_CHECKPOINT_INTERVAL", "LogMaintenance", "checkpoint_interval", "newest_handle"]

log = logging.getLogger("committers.delta")

DEFAULT_CHECKPOINT_INTERVAL = 100  # delta-rs's default for delta.checkpointInterval
FIRST_RETRY_DELAY = 1.0
MAX_RETRY_DELAY = 60.0
EXIT_WAIT = 120.0  # seconds, for all workers together, at interpreter exit


class LogMaintenance:
    """The background checkpoints and log clean-up of one table (see the module docstring)."""

    def __init__(self, location: TableLocation, *, cleanup_every: int = 100) -> None:
        self._location = location
        self._cleanup_every = cleanup_every
        self._changed = threading.Condition()
        self._latest = -1  # newest version a commit reported
        self._checkpoint_due = False
        self._cleanup_due = False
        self._checkpointed = -1  # version of the last checkpoint written here
        self._busy = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._table: DeltaTable | None = None  # the worker's own handle
        self.failures = 0  # failed attempts so far (for logs and tests)

    def committed(self, version: int, configuration: Mapping[str, str]) -> None:
        """Note that ``version`` was committed (``configuration``: the table's properties at
        that version); schedules what became due. Never blocks on the work itself."""
        interval = checkpoint_interval(configuration)
        with self._changed:
            if version <= self._latest:
                return
            previous, self._latest = self._latest, version
            base = max(previous, self._checkpointed)
            if base >= 0 and version // interval > base // interval:
                self._checkpoint_due = True
            if base < 0 and version and version % interval == 0:
                self._checkpoint_due = True
            cleanup_enabled = (
                str(configuration.get("delta.enableExpiredLogCleanup", "true")).lower() != "false"
            )
            every = self._cleanup_every
            if cleanup_enabled and previous >= 0 and version // every > previous // every:
                self._cleanup_due = True
            if self._checkpoint_due or self._cleanup_due:
                self._start()
                self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no work is due or running (or ``timeout`` seconds); whether it is so."""
        with self._changed:
            return self._changed.wait_for(
                lambda: not (self._busy or self._checkpoint_due or self._cleanup_due), timeout
            )

    def stop(self) -> None:
        """Let the worker end after its current step (work still due is left undone)."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()

    def stop_and_wait(self, timeout: float) -> bool:
        """:meth:`stop`, then wait for the step in progress (if any); whether it ended."""
        self.stop()
        with self._changed:
            return self._changed.wait_for(lambda: not self._busy, timeout)

    def _start(self) -> None:
        _RUNNING.add(self)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name=f"delta-log-maintenance {self._location.uri}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        delay = FIRST_RETRY_DELAY
        while True:
            with self._changed:
                self._changed.wait_for(
                    lambda: self._stopped or self._checkpoint_due or self._cleanup_due
                )
                if self._stopped:
                    return
                checkpoint, cleanup = self._checkpoint_due, self._cleanup_due
                self._busy = True
            try:
                self._work(checkpoint, cleanup)
                delay = FIRST_RETRY_DELAY
            except Exception as err:  # housekeeping: never lost, retried, never raised
                self.failures += 1
                log.warning(
                    "log maintenance of %s failed (retrying in %.0fs): %s",
                    self._location,
                    delay,
                    err,
                )
                self._table = None
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()
                    self._changed.wait_for(lambda: self._stopped, delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
                continue
            with self._changed:
                self._busy = False
                self._changed.notify_all()

    def _work(self, checkpoint: bool, cleanup: bool) -> None:
        table = self._handle()
        if checkpoint:
            crash_point("checkpoint_started", table.version())
            table.create_checkpoint()
            log.info("checkpoint of %s at version %d", self._location, table.version())
            with self._changed:
                self._checkpointed = max(self._checkpointed, table.version())
                self._checkpoint_due = False
        if cleanup:
            config = table.metadata().configuration
            if str(config.get("delta.enableExpiredLogCleanup", "true")).lower() != "false":
                table.cleanup_metadata()
                log.info("cleaned up expired log files of %s", self._location)
            with self._changed:
                self._cleanup_due = False

    def _handle(self) -> DeltaTable:
        """The worker's handle at the newest version (read here, off the commit path)."""
        self._table = newest_handle(self._location, self._table)
        return self._table


#: Every maintenance that started a worker in this process (see :func:`_stop_all_at_exit`).
_RUNNING: weakref.WeakSet[LogMaintenance] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    """Let no worker be inside a step when the interpreter finalises (see the module
    docstring): atexit runs while daemon threads still run normally."""
    deadline = time.monotonic() + EXIT_WAIT
    for maintenance in list(_RUNNING):
        if not maintenance.stop_and_wait(max(0.0, deadline - time.monotonic())):
            log.warning(
                "log maintenance of %s still running at exit after %.0fs",
                maintenance._location,
                EXIT_WAIT,
            )


def newest_handle(location: TableLocation, table: DeltaTable | None) -> DeltaTable:
    """``table`` advanced to the newest version, or a new handle of ``location`` when there is
    none yet (a worker thread's own handle: the committer's is never shared across threads)."""
    if table is None:
        return DeltaTable(location.uri, storage_options=location.delta_storage_options())
    table.update_incremental()
    return table


def checkpoint_interval(configuration: Mapping[str, str]) -> int:
    """The table's ``delta.checkpointInterval``: delta-rs's default when unset or malformed."""
    try:
        return max(1, int(configuration.get("delta.checkpointInterval", "")))
    except ValueError:
        return DEFAULT_CHECKPOINT_INTERVAL
