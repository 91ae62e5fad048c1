"""Helpers for tests of the async sinks without Spark."""

from __future__ import annotations

from typing import Any, TypeVar

from framework.asyncsink import AsyncSink, AsyncSinkTaskWriter
from framework.sink import WriterContext

EntryT = TypeVar("EntryT")


def run_sink_task(
    sink: AsyncSink[EntryT], *batches: Any, context: WriterContext
) -> AsyncSinkTaskWriter[EntryT]:
    """Run one task as the Spark runtime does, through the Sink API: write every batch, flush
    (``prepare_commit``), close; abort first on failure. Returns the writer, for its metrics."""
    writer = sink.create_writer(context)
    assert isinstance(writer, AsyncSinkTaskWriter)
    try:
        for batch in batches:
            writer.write(batch)
        assert writer.prepare_commit(flush=True) == []
    except BaseException:
        writer.abort()
        raise
    finally:
        writer.close()
    return writer
