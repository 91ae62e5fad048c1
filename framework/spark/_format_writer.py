"""A :class:`~framework.sink.Sink` as the writer of a Spark Python data source:
``df.write.format(name)`` and ``df.writeStream.format(name)``.

Spark's Python Data Source API runs a write in three places: the data source's ``writer`` /
``streamWriter`` in a Python worker on the driver, ``write(batches)`` in every task, and
``commit(messages)`` in another Python worker on the driver once every task succeeded. Nothing
survives from one step to the next except what is pickled into the writer object and what the
tasks' commit messages carry, so the state that makes the commit exactly once lives in the
destination, keyed by the epoch:

* tasks stage their rows with the sink's writer (the same code as ``TwoPhaseSink``'s tasks)
  and return their committables and the rows they wrote in the commit message; a failed task
  attempt returns nothing;
* ``commit`` asks the destination whether the epoch is already there (a replay after a crash,
  a re-run with the same id): then it only cleans up; otherwise, once the committables hold
  exactly the rows the tasks wrote (``RowCountMismatchError`` if not), it commits them in one
  transaction keyed by (app id, epoch id);
* ``abort`` (a task failed for good, or the commit raised) deletes what was staged.

A streaming write's epoch id is Spark's batch id, which tasks read from the local property
``streaming.sql.batchId`` that Spark sets on every task of a micro-batch.

Unlike ``TwoPhaseSink``, Spark hands the rows to the data source as they are: a sink's
:class:`~framework.sink.InputPlan` (Spark SQL) cannot run here, so a concrete format checks in
its writers whatever its destination requires (``check_batch``) or refuses the write.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from framework._crash import crash_point
from framework.errors import CommitStateUnknownError, SinkError
from framework.sink import Epoch, GlobalCommitter, Sink, deserialize_versioned
from framework.spark._commit import commit_epoch
from framework.spark._tasks import stage_task

__all__ = ["BATCH_ID_PROPERTY", "SinkBatchWriter", "SinkStreamWriter", "StagedMessage"]

log = logging.getLogger("framework.spark")

#: The local property Spark sets on the tasks of a micro-batch.
BATCH_ID_PROPERTY = "streaming.sql.batchId"
_COMMIT_ATTEMPTS = 3

BatchCheck = Callable[[pa.RecordBatch], pa.RecordBatch]


@dataclass
class StagedMessage(WriterCommitMessage):
    """What one successful task attempt staged: serialized committables and its row count."""

    committables: list[bytes] = field(default_factory=list)
    rows: int = 0


def _stage(
    sink: Sink[Any, Any, Any],
    epoch: Epoch,
    batches: Iterator[pa.RecordBatch],
    check_batch: BatchCheck | None,
) -> StagedMessage:
    checked: Iterable[pa.RecordBatch] = (
        batches if check_batch is None else (check_batch(b) for b in batches)
    )
    committables, rows, _ = stage_task(sink, epoch, checked)
    return StagedMessage(committables, rows)


def _commit_once(sink: Sink[Any, Any, Any], epoch: Epoch, messages: list[Any]) -> None:
    """Commit the epoch unless the destination already holds it; clean up either way. On
    failure everything staged is deleted, except when the commit's outcome is unknown (a
    re-run of the same epoch reconciles it)."""
    committer = sink.create_global_committer()
    if committer is None:
        return
    staged = [m for m in messages if isinstance(m, StagedMessage)]
    try:
        _commit_or_skip(sink, committer, epoch, staged)
    finally:
        committer.close()


def _commit_or_skip(
    sink: Sink[Any, Any, Any],
    committer: GlobalCommitter[Any, Any],
    epoch: Epoch,
    staged: list[StagedMessage],
) -> None:
    try:
        if committer.is_committed(epoch):
            log.info("epoch %s of %r is already committed: skipped", epoch.epoch_id, epoch.app_id)
            committer.clean_up(epoch)
            return
        serializer = sink.committable_serializer()
        committables = (
            []
            if serializer is None
            else [deserialize_versioned(serializer, c) for m in staged for c in m.committables]
        )
        crash_point("before_commit", epoch.epoch_id)
        commit_epoch(
            sink,
            committer,
            epoch,
            committables,
            attempts=_COMMIT_ATTEMPTS,
            written_rows=sum(m.rows for m in staged),
        )
        crash_point("after_commit", epoch.epoch_id)
    except CommitStateUnknownError:
        raise  # leave the staged files: a re-run of the epoch reconciles and cleans up
    except BaseException:
        try:
            committer.abort(epoch)
        except Exception as cleanup_error:
            log.warning("cleanup after failed epoch %s failed: %s", epoch.epoch_id, cleanup_error)
        raise
    committer.clean_up(epoch)
    log.info(
        "committed epoch %s of %r: %d rows, %d files",
        epoch.epoch_id,
        epoch.app_id,
        sum(m.rows for m in staged),
        len(committables),
    )


def _abort(sink: Sink[Any, Any, Any], epoch: Epoch) -> None:
    committer = sink.create_global_committer()
    if committer is not None:
        committer.abort(epoch)


class SinkBatchWriter(DataSourceArrowWriter):
    """``df.write.format(name)`` as one epoch of ``sink`` (see the module docstring).

    Args:
        sink: a prepared sink (``sink.prepare(arrow_schema)`` ran on the driver).
        epoch: the write's epoch; it is a no-op when the destination already holds it.
        check_batch: applied to every batch before the sink's writer sees it (raises for rows
            the destination refuses).
        skip: the epoch is known to be committed already: tasks read their input and stage
            nothing.
    """

    def __init__(
        self,
        sink: Sink[Any, Any, Any],
        epoch: Epoch,
        *,
        check_batch: BatchCheck | None = None,
        skip: bool = False,
    ) -> None:
        self._sink = sink
        self._epoch = epoch
        self._check_batch = check_batch
        self._skip = skip

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        if self._skip:
            for _ in iterator:
                pass
            return StagedMessage()
        return _stage(self._sink, self._epoch, iterator, self._check_batch)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        epoch = self._epoch
        if self._skip:
            log.info("epoch %s of %r was committed before: skipped", epoch.epoch_id, epoch.app_id)
            return
        _commit_once(self._sink, epoch, list(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _abort(self._sink, self._epoch)


class SinkStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format(name)``: each micro-batch is one epoch of ``sink``, with Spark's
    batch id as epoch id (see the module docstring).

    Args:
        sink: a prepared sink.
        app_id: the epochs' app id, stable across restarts of the query.
        writer_identity: the query's identity (its id in the checkpoint), stable across its
            restarts: another query with the same app id has another identity.
        query_id: recorded with each commit.
        check_batch: as for :class:`SinkBatchWriter`.
    """

    def __init__(
        self,
        sink: Sink[Any, Any, Any],
        *,
        app_id: str,
        writer_identity: str,
        query_id: str | None,
        check_batch: BatchCheck | None = None,
    ) -> None:
        self._sink = sink
        self._app_id = app_id
        self._identity = writer_identity
        self._query_id = query_id
        self._check_batch = check_batch
        self._run_id = str(uuid.uuid4())  # one per start of the query

    def _epoch(self, batch_id: int) -> Epoch:
        return Epoch(
            app_id=self._app_id,
            epoch_id=batch_id,
            writer_identity=self._identity,
            run_id=self._run_id,
            query_id=self._query_id,
        )

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedMessage:
        from pyspark import TaskContext

        task = TaskContext.get()
        raw = task.getLocalProperty(BATCH_ID_PROPERTY) if task is not None else None
        if raw is None:
            raise SinkError(
                f"a streaming write task has no {BATCH_ID_PROPERTY} property; this writer runs "
                "only in Spark's micro-batch streaming"
            )
        return _stage(self._sink, self._epoch(int(raw)), iterator, self._check_batch)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _commit_once(self._sink, self._epoch(batchId), list(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _abort(self._sink, self._epoch(batchId))
