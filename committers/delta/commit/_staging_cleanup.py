"""Removing what a batch staged and did not commit; on object stores, off the commit path.

:func:`remove_leftovers` deletes an epoch's staged files that its commit does not reference,
then its manifests. On an object store that is a listing of the epoch's manifests and a
batch delete, about as long as the commit itself; :class:`StagingCleaner` runs it on a worker
thread for micro-batches that are committed, so the batch's commit step only hands over what
the commit referenced.

Guarantees of :class:`StagingCleaner`:
    * only committed epochs are handed over, and the worker deletes exactly what the
      synchronous clean-up would: the epoch's staged files no commit of it references, then its
      manifests; hand-overs are done in order, one at a time;
    * at most :data:`MAX_PENDING` hand-overs wait; one more waits for the worker (a clean-up
      slower than the batches slows the batches down instead of piling up);
    * a process that ends before its worker is done (killed, or its exit wait ran out) leaves
      the epoch's staging behind; Spark does not run that batch again, so the worker *sweeps*:
      the first hand-over of a writer in a process, and the first after a failed clean-up,
      also clean the writer's older epochs still staged. Their commits are looked up in the
      table's recent history (the worker's own handle); an epoch whose commit is not found there
      is left to ``remove_orphan_files()``, as the synchronous clean-up does;
    * a failure is logged, never raised into a batch, and retried under :data:`RETRY_BACKOFF`
      (three tries in all); after the last one the writer's next hand-over sweeps that epoch
      again;
    * :meth:`StagingCleaner.wait_idle` (the committer's ``close``) and interpreter exit wait for
      the work handed over (exit: up to :data:`EXIT_WAIT` seconds for all workers).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, replace

from deltalake import DeltaTable

from committers.delta.commit._log_commits import epoch_key
from committers.delta.commit._log_maintenance import newest_handle
from committers.delta.storage._staging import (
    epoch_staging_dir,
    is_run_manifest,
    read_manifests,
    remove_empty_directories,
    remove_empty_staging_dirs,
)
from committers.delta.storage._storage import TableLocation
from committers.delta.storage._upload import abort_incomplete_uploads
from committers.delta.table._table import added_paths, delete_files, find_commit
from framework.connector import crash_point
from framework.retry import Backoff, Verdict, retry_call
from framework.sink import Epoch

__all__ = [
    "EXIT_WAIT",
    "MAX_PENDING",
    "StagingCleaner",
    "StagingCleanups",
    "remove_leftovers",
    "wait_all_idle",
]

log = logging.getLogger("committers.delta")

MAX_PENDING = 8
EXIT_WAIT = 60.0  # seconds, for all workers together, at interpreter exit
IDLE_EXIT = 60.0  # seconds without work after which a worker thread ends
# A failed clean-up is tried twice more, 1 s then 2 s later.
RETRY_BACKOFF = Backoff(max_attempts=3, initial_delay=1.0, max_delay=2.0, jitter=0.0, deadline=None)


def remove_leftovers(
    location: TableLocation,
    epoch: Epoch,
    *,
    committed: bool,
    committed_files: set[str] | None,
    committed_attempts: Collection[int] = (),
) -> None:
    """Delete ``epoch``'s staged files that no commit references, then their manifests.

    ``committed``: whether the epoch is committed; ``committed_files``: the files its commit
    references (``None``: committed, but the commit is no longer in recent history, so nothing
    is deleted). Once the epoch is committed, leftovers of *every* run of it are deleted (failed
    task attempts, a crashed earlier run, a zombie's copy). While it is not committed, only this
    run's own staging is deleted: another run of the same writer (a zombie driver, a concurrent
    re-run of a bounded write) may still be about to commit its files. ``committed_attempts``:
    task attempts of this run whose every file is committed (their manifests are not read).
    """
    manifests = read_manifests(location, epoch, committed_attempts=committed_attempts)
    if not manifests:
        return
    if committed and committed_files is None:
        log.warning(
            "batch %s is committed but its commit is not in recent history; leaving its "
            "staged files for remove_orphan_files()",
            epoch.epoch_id,
        )
        return
    if not committed:
        manifests = {m: f for m, f in manifests.items() if is_run_manifest(m, epoch)}
    orphans = set().union(*(m.files for m in manifests.values())) - (committed_files or set())
    fs = location.filesystem()
    delete_files(fs, [location.path(relative) for relative in sorted(orphans)])
    crash_point("clean_up", epoch.epoch_id)
    abort_incomplete_uploads(location, orphans)  # of attempts killed mid-upload
    for directory in set().union(*(m.directories for m in manifests.values())):
        remove_empty_directories(location, directory)
    delete_files(fs, sorted(manifests))
    remove_empty_staging_dirs(location, epoch_staging_dir(epoch))


@dataclass(frozen=True)
class _HandOver:
    epoch: Epoch
    committed_files: set[str]
    committed_attempts: frozenset[int]


class StagingCleaner:
    """The background clean-up of one table's committed epochs (see the module docstring)."""

    def __init__(self, location: TableLocation) -> None:
        self._location = location
        self._changed = threading.Condition()
        self._queue: deque[_HandOver] = deque()
        self._busy = False
        self._stopped = False
        self._swept: set[tuple[str, str]] = set()  # (app id, writer) swept in this process
        self._thread: threading.Thread | None = None
        self._table: DeltaTable | None = None  # the worker's own handle, for sweeps only
        self.failures = 0  # failed clean-ups so far (for logs and tests)

    def hand_over(
        self, epoch: Epoch, committed_files: set[str], committed_attempts: Collection[int]
    ) -> None:
        """Clean up the committed ``epoch`` in the background; waits only while
        :data:`MAX_PENDING` hand-overs are already waiting."""
        job = _HandOver(epoch, set(committed_files), frozenset(committed_attempts))
        with self._changed:
            self._changed.wait_for(lambda: len(self._queue) < MAX_PENDING or self._stopped)
            self._queue.append(job)
            _RUNNING.add(self)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run,
                    name=f"delta-staging-cleanup {self._location.uri}",
                    daemon=True,
                )
                self._thread.start()
            self._changed.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every hand-over is done (or ``timeout`` seconds); whether they are."""
        with self._changed:
            return self._changed.wait_for(lambda: not (self._busy or self._queue), timeout)

    def stop_and_wait(self, timeout: float) -> bool:
        """Let the worker end after its current step (what is still queued is left to a later
        sweep), and wait for that step; whether it ended."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
            return self._changed.wait_for(lambda: not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._stopped or bool(self._queue), IDLE_EXIT)
                if self._stopped or not self._queue:  # stopped, or idle: the next hand-over
                    self._thread = None  # starts a new worker
                    return
                job = self._queue.popleft()
                self._busy = True
                self._changed.notify_all()
            self._clean_with_retries(job)
            with self._changed:
                self._busy = False
                self._changed.notify_all()

    def _clean_with_retries(self, job: _HandOver) -> None:
        """Clean up ``job`` under :data:`RETRY_BACKOFF` (no retry once stopped); the last
        failure is logged and left to the writer's next hand-over (housekeeping never raises)."""

        def attempt() -> None:
            try:
                self._clean(job)
            except Exception:
                self.failures += 1
                self._table = None  # reopened by the next attempt
                raise

        try:
            retry_call(
                attempt,
                classify=lambda _: Verdict.FAIL if self._stopped else Verdict.RETRY,
                backoff=RETRY_BACKOFF,
                description=f"clean-up of batch {job.epoch.epoch_id}'s staging",
                sleep=self._pause,
            )
        except Exception as err:
            self._swept.discard(_writer(job.epoch))
            log.warning(
                "clean-up of batch %s's staging in %s failed; the writer's next batch sweeps "
                "it: %s",
                job.epoch.epoch_id,
                self._location,
                err,
            )

    def _pause(self, seconds: float) -> None:
        """A pause between attempts that :meth:`stop_and_wait` cuts short."""
        with self._changed:
            self._changed.wait_for(lambda: self._stopped, seconds)

    def _clean(self, job: _HandOver) -> None:
        remove_leftovers(
            self._location,
            job.epoch,
            committed=True,
            committed_files=job.committed_files,
            committed_attempts=job.committed_attempts,
        )
        writer = _writer(job.epoch)
        if writer not in self._swept:
            self._sweep(job.epoch)
            self._swept.add(writer)

    def _sweep(self, current: Epoch) -> None:
        """Clean the epochs of ``current``'s writer below it that are still staged."""
        writer_dir = epoch_staging_dir(current).rsplit("/", 1)[0]
        fs = self._location.filesystem()
        try:
            entries = fs.ls(self._location.path(writer_dir), detail=False, refresh=True)
        except FileNotFoundError:
            return
        older = sorted(
            int(name)
            for name in (entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries)
            if name.isdigit() and int(name) < current.epoch_id
        )
        if not older:
            return
        table = self._table = newest_handle(self._location, self._table)
        for epoch_id in older:
            epoch = replace(current, epoch_id=epoch_id, run_id="")
            committed_through = table.transaction_version(epoch.app_id)
            if committed_through is None or committed_through < epoch_id:
                continue  # not committed: another run may still commit it
            record, _ = find_commit(table, epoch.app_id, epoch_id)
            files = None if record is None else added_paths(self._location, record.version)
            log.info("sweeping the staging left by batch %s in %s", epoch_id, self._location)
            remove_leftovers(self._location, epoch, committed=True, committed_files=files)


def _writer(epoch: Epoch) -> tuple[str, str]:
    return epoch.app_id, epoch.writer_identity


#: Every cleaner that started a worker in this process (see :func:`_stop_all_at_exit`).
_RUNNING: weakref.WeakSet[StagingCleaner] = weakref.WeakSet()


def wait_all_idle(timeout: float) -> bool:
    """Wait until every cleaner of this process is idle (or ``timeout`` seconds in all);
    whether they are. For callers that inspect a table's staging right after a stream's batch."""
    deadline = time.monotonic() + timeout
    return all(c.wait_idle(max(0.0, deadline - time.monotonic())) for c in list(_RUNNING))


@atexit.register
def _stop_all_at_exit() -> None:
    """Finish the work handed over while the interpreter is whole (atexit runs while daemon
    threads still run normally); what is left after :data:`EXIT_WAIT` is swept by the writer's
    next process."""
    deadline = time.monotonic() + EXIT_WAIT
    for cleaner in list(_RUNNING):
        idle = cleaner.wait_idle(max(0.0, deadline - time.monotonic()))
        if not cleaner.stop_and_wait(max(0.0, deadline - time.monotonic())) or not idle:
            log.warning(
                "staging clean-up of %s unfinished at exit after %.0fs; the next run sweeps it",
                cleaner._location,
                EXIT_WAIT,
            )


class StagingCleanups:
    """The clean-up of an epoch's staging by the Delta global committer, mixed into
    :class:`~committers.delta.commit._committer.DeltaGlobalCommitter`, which defines the
    attributes and the methods declared here."""

    _location: TableLocation
    _cleaner: StagingCleaner
    _committed_paths: dict[tuple[str, str, int], set[str]]
    _committed_attempts: dict[tuple[str, str, int], set[int]]
    _read_before: dict[tuple[str, str, int], int]

    def table(self) -> DeltaTable | None:
        raise NotImplementedError

    def _holds_run(self, table: DeltaTable, epoch: Epoch) -> bool:
        raise NotImplementedError

    def _committed_files(self, epoch: Epoch) -> tuple[bool, set[str] | None]:
        """(is ``epoch`` committed, the files its commit references). The files are ``None``
        when the epoch is committed but its commit is no longer in recent history."""
        known = self._committed_paths.get(epoch_key(epoch))
        if known is not None:
            return True, known
        table = self.table()
        if epoch.one_off:
            if table is not None and self._holds_run(table, epoch):
                return True, self._committed_paths[epoch_key(epoch)]
            return False, set()
        last = None if table is None else table.transaction_version(epoch.app_id)
        if table is None or last is None or last < epoch.epoch_id:
            return False, set()
        record, _ = find_commit(table, epoch.app_id, epoch.epoch_id)
        return True, None if record is None else added_paths(self._location, record.version)

    def clean_up(self, epoch: Epoch) -> None:
        """Delete staged files of ``epoch`` that no commit references, then their manifests
        (see :func:`remove_leftovers`).

        A committed micro-batch on an object store is handed to the background cleaner
        (:class:`StagingCleaner`) instead: its commit step does not wait for the listing and
        deletes; :meth:`close` does.
        """
        attempts = self._committed_attempts.pop(epoch_key(epoch), set())
        committed, committed_files = self._committed_files(epoch)
        self._committed_paths.pop(epoch_key(epoch), None)
        self._read_before.pop(epoch_key(epoch), None)
        if committed and committed_files is not None and self._cleans_in_background(epoch):
            self._cleaner.hand_over(epoch, committed_files, attempts)
            return
        remove_leftovers(
            self._location,
            epoch,
            committed=committed,
            committed_files=committed_files,
            committed_attempts=attempts,
        )

    def _cleans_in_background(self, epoch: Epoch) -> bool:
        """Micro-batches on object stores (where clean-up costs requests) are cleaned up by
        the worker; bounded writes and local tables synchronously."""
        return not epoch.bounded and not self._location.is_local

    def abort(self, epoch: Epoch) -> None:
        """Same as :meth:`clean_up`: whatever the table does not reference is deleted."""
        self.clean_up(epoch)
