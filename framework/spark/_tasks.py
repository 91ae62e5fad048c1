"""Executor side: run one sink writer per Spark task inside ``mapInArrow``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from framework._crash import crash_point
from framework.sink import Epoch, Sink, WriterContext, serialize_versioned

__all__ = ["TASK_RESULT_SCHEMA", "make_task_function", "positional_names", "stage_task"]

# One output row per task: its serialized committables, how many input rows it wrote and the
# writer's own counters (SinkWriter.task_metrics).
TASK_RESULT_SCHEMA = "committables array<binary>, rows long, metrics map<string, long>"
_ARROW_SCHEMA = pa.schema(
    [
        ("committables", pa.list_(pa.binary())),
        ("rows", pa.int64()),
        ("metrics", pa.map_(pa.string(), pa.int64())),
    ]
)


def positional_names(count: int) -> list[str]:
    """Column names ``mapInArrow`` can always look up."""
    return [f"_c{index}" for index in range(count)]


def make_task_function(
    sink: Sink[Any, Any, Any], epoch: Epoch, column_names: Sequence[str]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function Spark ships to every task: write all batches, then emit committables.

    The DataFrame reaches ``mapInArrow`` with positional column names (``mapInArrow`` looks its
    input up by name, which fails for names such as ``a.b``); each batch gets its
    ``column_names`` back before the writer sees it.

    Committables (and the task's input row count) are emitted only after the writer has flushed
    everything, as one row at the end of the task, so a task that fails emits nothing and its
    attempt contributes nothing to the commit. On failure the writer's ``abort`` runs (best
    effort) and the error propagates so Spark retries the task.
    """

    names = list(column_names)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        renamed = (batch.rename_columns(names) for batch in batches)
        payload, rows, counters = stage_task(sink, epoch, renamed)
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([payload], _ARROW_SCHEMA.field("committables").type),
                pa.array([rows], pa.int64()),
                pa.array([list(counters.items())], _ARROW_SCHEMA.field("metrics").type),
            ],
            schema=_ARROW_SCHEMA,
        )

    return run


def stage_task(
    sink: Sink[Any, Any, Any], epoch: Epoch, batches: Iterable[pa.RecordBatch]
) -> tuple[list[bytes], int, dict[str, int]]:
    """Write all ``batches`` of this Spark task with one sink writer and flush it.

    Returns the task's committables (serialized), the rows it wrote and the writer's counters,
    only once everything is flushed. On failure the writer's ``abort`` runs (best effort) and
    the error propagates so Spark retries the task.
    """
    from pyspark import TaskContext

    task = TaskContext.get()
    context = WriterContext(
        epoch=epoch,
        partition_id=task.partitionId() if task else 0,
        attempt_number=task.attemptNumber() if task else 0,
        task_attempt_id=task.taskAttemptId() if task else 0,
    )
    writer = sink.create_writer(context)
    rows = 0
    try:
        for batch in batches:
            rows += batch.num_rows
            writer.write(batch)
            crash_point("staging", epoch.epoch_id)
        committables = writer.prepare_commit(True)
        counters = dict(writer.task_metrics())
    except BaseException:
        writer.abort()
        raise
    finally:
        writer.close()
    serializer = sink.committable_serializer()
    if serializer is None or not committables:
        return [], rows, counters
    return [serialize_versioned(serializer, c) for c in committables], rows, counters
