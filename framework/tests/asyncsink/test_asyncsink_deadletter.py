"""Dead-letter queues: JSON lines through fsspec, and another async sink as the destination."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import pickle
from collections.abc import Sequence
from typing import Any

import fsspec
import pytest

from framework.asyncsink import (
    AsyncSink,
    AsyncSinkDeadLetterQueue,
    AsyncSinkWriter,
    BufferedRequestState,
    DeadLetter,
    JsonLinesDeadLetterQueue,
)
from framework.errors import DeliveryError, FatalDeliveryError
from framework.sink import Epoch, WriterContext
from framework.tests.asyncsink.test_asyncsink_writer import (
    ScriptedWriter,
    config,
    poison_aware,
    records,
)

CONTEXT = WriterContext(
    epoch=Epoch(app_id="orders", epoch_id=7, writer_identity="query-1", run_id="run-1"),
    partition_id=3,
    attempt_number=1,
    task_attempt_id=42,
)


def letter(entry: Any) -> DeadLetter:
    return DeadLetter.from_error(entry, "fatal", FatalDeliveryError("400: bad"), 1)


def read_lines(fs: Any, pattern: str) -> list[dict[str, Any]]:
    lines = []
    for path in sorted(fs.glob(pattern)):
        with fs.open(path, "rb") as handle:
            lines.extend(json.loads(line) for line in handle.read().splitlines())
    return lines


def test_json_lines_files_carry_the_entry_the_error_and_the_task(tmp_path):
    queue = JsonLinesDeadLetterQueue(str(tmp_path / "dlq"))

    async def scenario() -> None:
        writer = queue.open(CONTEXT)
        await writer.write([letter({"id": 1, "at": datetime.date(2026, 1, 2)})])
        await writer.write([letter(b"\x00raw")])
        await writer.flush()
        await writer.flush()  # nothing new: no empty file
        await writer.write([letter({"amount": decimal.Decimal("1.10")})])
        await writer.flush()
        await writer.close()

    asyncio.run(scenario())
    files = sorted(path.name for path in (tmp_path / "dlq").iterdir())
    assert len(files) == 2
    assert all(name.startswith("dead-letters-orders-e7-p3-a1-") for name in files)
    assert files[0].endswith("-00001.jsonl") and files[1].endswith("-00002.jsonl")
    fs = fsspec.filesystem("file")
    lines = read_lines(fs, str(tmp_path / "dlq" / "*.jsonl"))
    assert [line["entry"] for line in lines] == [
        {"id": 1, "at": "2026-01-02"},
        "AHJhdw==",
        {"amount": "1.10"},
    ]
    first = lines[0]
    assert first["reason"] == "fatal"
    assert first["error_type"] == "framework.errors.FatalDeliveryError"
    assert first["error"] == "400: bad"
    assert first["failed_attempts"] == 1
    assert (first["app_id"], first["epoch_id"], first["partition_id"]) == ("orders", 7, 3)
    assert (first["attempt_number"], first["task_attempt_id"]) == (1, 42)
    datetime.datetime.fromisoformat(first["dead_lettered_at"])


def test_json_lines_on_another_fsspec_filesystem_and_file_rollover():
    queue = JsonLinesDeadLetterQueue("memory://dlq-rollover", max_letters_per_file=2)

    async def scenario() -> None:
        writer = queue.open(None)
        await writer.write([letter(n) for n in range(5)])  # rolls over at 2 letters
        await writer.flush()
        await writer.close()

    asyncio.run(scenario())
    fs = fsspec.filesystem("memory")
    assert len(fs.glob("/dlq-rollover/dead-letters-local-*.jsonl")) == 1
    assert [line["entry"] for line in read_lines(fs, "/dlq-rollover/*.jsonl")] == [0, 1, 2, 3, 4]
    fs.rm("/dlq-rollover", recursive=True)


def test_a_dead_letter_queue_that_cannot_write_fails_loudly(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    queue = JsonLinesDeadLetterQueue(str(blocker))

    async def scenario() -> None:
        writer = queue.open(None)
        await writer.write([letter(1)])
        with pytest.raises(DeliveryError, match="could not write 1 dead letters"):
            await writer.flush()

    asyncio.run(scenario())


def test_the_queue_description_pickles():
    queue = JsonLinesDeadLetterQueue("s3://bucket/dlq", storage_options={"anon": False})
    assert pickle.loads(pickle.dumps(queue)) == queue


class ReadableScriptedWriter(ScriptedWriter):
    """Dead letters show the entry as text rather than base64 bytes."""

    def describe_entry(self, entry: bytes) -> Any:
        return entry.decode()


def test_writer_flush_returns_only_after_dead_letters_are_written(tmp_path):
    queue = JsonLinesDeadLetterQueue(str(tmp_path))

    async def scenario() -> None:
        writer = ReadableScriptedWriter(
            poison_aware, config=config(max_batch_size=4), dead_letter_queue=queue
        )
        await writer.write_many([*records(2), b"poison-1", b"r002"])
        await writer.flush()
        lines = read_lines(fsspec.filesystem("file"), str(tmp_path / "*.jsonl"))
        assert [(line["entry"], line["reason"]) for line in lines] == [("poison-1", "fatal")]
        assert sorted(writer.delivered) == records(3)
        await writer.close()

    asyncio.run(scenario())


class CollectingSink(AsyncSink[dict[str, Any]]):
    """An async sink whose writer appends rows to a list (same process only)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def create_async_writer(
        self,
        context: WriterContext | None,
        initial_state: Sequence[BufferedRequestState[dict[str, Any]]] = (),
    ) -> AsyncSinkWriter[dict[str, Any], dict[str, Any]]:
        sink = self

        class Identity:
            def apply(self, element: dict[str, Any], context: object) -> dict[str, Any]:
                return element

        class Writer(AsyncSinkWriter[dict[str, Any], dict[str, Any]]):
            async def submit_request_entries(
                self, entries: list[dict[str, Any]]
            ) -> list[dict[str, Any]]:
                sink.rows.extend(entries)
                return []

            def size_in_bytes(self, entry: dict[str, Any]) -> int:
                return 0

        return Writer(element_converter=Identity(), config=config(), context=context)


def test_any_async_sink_can_serve_as_the_dead_letter_destination():
    target = CollectingSink()
    queue = AsyncSinkDeadLetterQueue(target)

    async def scenario() -> None:
        writer = ScriptedWriter(
            poison_aware, config=config(max_batch_size=4), dead_letter_queue=queue, context=CONTEXT
        )
        await writer.write_many([b"poison-a", *records(3)])
        await writer.flush()
        await writer.close()

    asyncio.run(scenario())
    [row] = target.rows
    assert row["reason"] == "fatal"
    assert row["entry"] == b"poison-a"
    assert row["partition_id"] == 3
