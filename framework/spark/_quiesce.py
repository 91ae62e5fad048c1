"""Waiting for a failed batch's tasks to stop before its staged files are deleted.

When a task fails for good, Spark aborts the job and raises on the driver at once, while the
job's other tasks are only asked to stop: a Python worker may still create a file for a while.
Deleting the batch's staging before they are gone would leave that late file behind. So the
staging jobs run in a known job group (the streaming query's, which Spark sets for each batch,
or one of our own for bounded writes), and on failure the clean-up first waits until no task
of that group is running.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["staging_job_group", "wait_for_tasks_to_end"]

log = logging.getLogger("framework.spark")

_JOB_GROUP = "spark.jobGroup.id"
WAIT_SECONDS = 120.0


def _context(df: DataFrame) -> Any | None:
    try:
        return df.sparkSession.sparkContext
    except Exception:  # Spark Connect: no SparkContext, the server cleans up its own tasks
        return None


@contextlib.contextmanager
def staging_job_group(df: DataFrame) -> Iterator[str | None]:
    """Run the body's Spark jobs in a job group; yields its id (``None`` under Connect).

    Keeps the group already set on this thread (a streaming batch's); otherwise sets one for
    the body and removes it after, leaving the thread as it was.
    """
    context = _context(df)
    if context is None:
        yield None
        return
    current = context.getLocalProperty(_JOB_GROUP)
    if current:
        yield str(current)
        return
    group = f"sparksink-{uuid.uuid4()}"
    context.setJobGroup(group, "sparksink staging", interruptOnCancel=True)
    try:
        yield group
    finally:
        context.setLocalProperty(_JOB_GROUP, None)
        context.setLocalProperty("spark.job.description", None)
        context.setLocalProperty("spark.job.interruptOnCancel", None)


def wait_for_tasks_to_end(df: DataFrame, group: str | None) -> None:
    """Cancel the group's jobs and return once none of their tasks runs (or after
    ``WAIT_SECONDS``, with a warning: a file a late task writes is then an orphan for
    ``remove_orphan_files``)."""
    context = _context(df)
    if context is None or group is None:
        return
    with contextlib.suppress(Exception):
        context.cancelJobGroup(group)
    tracker = context.statusTracker()
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        if not _running_tasks(tracker, group):
            return
        time.sleep(0.05)
    log.warning(
        "tasks of the failed batch were still running after %.0fs; a file one of them writes "
        "from now on is left for remove_orphan_files()",
        WAIT_SECONDS,
    )


def _running_tasks(tracker: Any, group: str) -> int:
    running = 0
    for job_id in tracker.getJobIdsForGroup(group):
        job = tracker.getJobInfo(job_id)
        for stage_id in job.stageIds if job is not None else ():
            stage = tracker.getStageInfo(stage_id)
            running += stage.numActiveTasks if stage is not None else 0
    return running
