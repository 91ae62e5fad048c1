"""Crash points: named steps of the commit protocol where a fault campaign kills the driver.

Inert unless the environment variable ``SPARKSINK_CRASH_AT`` names a step: then the first time
this process (a driver, or a Python worker it started) reaches that step, the whole process
group (the Python driver, its JVM and its workers) is killed with SIGKILL, the way a machine
loss ends a driver. ``SPARKSINK_CRASH_AT=<step>@<epoch>`` kills only at that epoch.

Steps of the protocol, in order: ``offsets_written`` (a stream source of this framework plans
the files of a micro-batch whose offsets Spark has just written to the checkpoint; it has no
epoch: the first batch a run plans, e.g. ``offsets/0`` of a new query), ``replay_check``,
``staging``, ``before_commit``, ``commit_write``, ``after_commit``, ``clean_up`` and
``schema_merge`` (between a schema-merge commit and the data commit); ``commit_written`` (a
blind append's commit file is in the log, and the committer has not learned it yet) and
``checkpoint_started`` (a background checkpoint of the Delta log has begun);
``compaction_commit`` (an auto-compaction between batches has rewritten its files and is
about to commit them) and ``compaction_committed`` (a compaction's commit is in the log, its
staging manifest not yet deleted).
``commit_write`` and the driver side of ``staging`` kill from a timer a few milliseconds later,
so the kill lands while the commit file is being written or while tasks stage. A line
``CRASH AT <step> epoch=<id>`` is printed on stdout first, and appended to the file
``SPARKSINK_CRASH_LOG`` names, if set (a Python worker's stdout may not reach anyone before
the kill).

``SPARKSINK_PAUSE_AT`` takes the same values and stops the process group with SIGSTOP
instead (a driver frozen by a long GC pause or a suspended VM, which later resumes: a zombie);
the line then reads ``PAUSE AT ...``.

PySpark's worker daemon runs in a process group of its own: a driver that sets
``SPARKSINK_CRASH_PGID`` to its group (inherited by the JVM and the workers) is killed whole
from a worker too.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading

__all__ = [
    "CRASH_STEPS",
    "CRASH_VARIABLE",
    "DRIVER_GROUP_VARIABLE",
    "LOG_VARIABLE",
    "PAUSE_VARIABLE",
    "crash_point",
    "crash_with_workers",
]

CRASH_VARIABLE = "SPARKSINK_CRASH_AT"
PAUSE_VARIABLE = "SPARKSINK_PAUSE_AT"
DRIVER_GROUP_VARIABLE = "SPARKSINK_CRASH_PGID"
LOG_VARIABLE = "SPARKSINK_CRASH_LOG"
CRASH_STEPS = (
    "offsets_written",
    "replay_check",
    "staging",
    "before_commit",
    "commit_write",
    "after_commit",
    "clean_up",
    "schema_merge",
    "commit_written",
    "checkpoint_started",
    "compaction_commit",
    "compaction_committed",
)


def crash_point(step: str, epoch_id: int | None = None, *, within_seconds: float = 0.0) -> None:
    """Kill (or pause) this process group here if the environment asks for ``step`` (see
    module doc).

    With ``within_seconds``, the kill comes from a timer after a random delay up to that long,
    so it lands inside the operation that follows this call.
    """
    if _wanted(PAUSE_VARIABLE, step, epoch_id):
        _announce("PAUSE", step, epoch_id)
        _signal_process_groups(signal.SIGSTOP)
        return  # resumed by SIGCONT: carry on, as a zombie does
    if not _wanted(CRASH_VARIABLE, step, epoch_id):
        return
    _announce("CRASH", step, epoch_id)
    if within_seconds <= 0:
        _signal_process_groups(signal.SIGKILL)
    delay = random.uniform(0, within_seconds)
    threading.Timer(delay, _signal_process_groups, args=(signal.SIGKILL,)).start()


def crash_with_workers() -> None:
    """Make a crash point that a Python worker of this driver reaches kill the driver's whole
    process group too, not only the worker's (PySpark's worker daemon runs in a group of its
    own): records this process's group in ``SPARKSINK_CRASH_PGID``, which the JVM and the
    workers started afterwards inherit. Call it first thing in a driver that a fault campaign
    kills."""
    os.environ[DRIVER_GROUP_VARIABLE] = str(os.getpgid(0))


def _wanted(variable: str, step: str, epoch_id: int | None) -> bool:
    wanted = os.environ.get(variable)
    if not wanted:
        return False
    name, _, epoch = wanted.partition("@")
    return name == step and not (epoch and epoch_id is not None and int(epoch) != epoch_id)


def _announce(what: str, step: str, epoch_id: int | None) -> None:
    line = f"{what} AT {step} epoch={epoch_id}\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    log_path = os.environ.get(LOG_VARIABLE)
    if log_path:
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(line)
            log.flush()
            os.fsync(log.fileno())


def _signal_process_groups(signal_number: int) -> None:
    driver_group = os.environ.get(DRIVER_GROUP_VARIABLE)
    if driver_group and int(driver_group) != os.getpgid(0):
        os.killpg(int(driver_group), signal_number)  # from a Spark worker: the driver first
    try:
        os.killpg(os.getpgid(0), signal_number)
    except OSError:  # the group's leader is outside this PID namespace (a container's init)
        os.kill(os.getpid(), signal_number)
    if signal_number == signal.SIGKILL:  # reached only where the group did not hold this process
        os.kill(os.getpid(), signal.SIGKILL)
