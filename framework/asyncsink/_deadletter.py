"""Dead-letter queues: where entries go that the destination will never accept.

A writer with a dead-letter queue hands it every entry that was rejected fatally (after splitting
its request to isolate it), that exhausted its retry budget, or that exceeds the maximum record
size, together with the error, instead of failing the job. Without one those errors fail the job.

A :class:`DeadLetterQueue` is a picklable description that travels with the sink; each writer
opens its own :class:`DeadLetterWriter` on the executor. The writer's ``flush()`` only returns
once its dead letters are durably written, so a micro-batch is complete (every entry delivered
or dead-lettered) before Spark records it.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from framework.asyncsink._json import lenient_json_default
from framework.errors import ConfigurationError, DeliveryError
from framework.sink import WriterContext

if TYPE_CHECKING:
    from framework.asyncsink._sink import AsyncSink
    from framework.asyncsink._writer import AsyncSinkWriter

__all__ = [
    "DEFAULT_DEAD_LETTER_FILE_LETTERS",
    "AsyncSinkDeadLetterQueue",
    "DeadLetter",
    "DeadLetterQueue",
    "DeadLetterReason",
    "DeadLetterWriter",
    "JsonLinesDeadLetterQueue",
]

DeadLetterReason = Literal["fatal", "retries_exhausted", "record_too_large"]

DEFAULT_DEAD_LETTER_FILE_LETTERS = 10_000


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadLetter:
    """One rejected entry and why.

    Attributes:
        entry: a JSON-friendly form of the entry (``AsyncSinkWriter.describe_entry``).
        reason: ``"fatal"``, ``"retries_exhausted"`` or ``"record_too_large"``.
        error_type: qualified class name of the error.
        error_message: its message.
        failed_attempts: how often the entry was sent and failed.
        dead_lettered_at: UTC time the entry was given up on.
    """

    entry: Any
    reason: DeadLetterReason
    error_type: str
    error_message: str
    failed_attempts: int
    dead_lettered_at: datetime.datetime

    @classmethod
    def from_error(
        cls, entry: Any, reason: DeadLetterReason, error: BaseException, failed_attempts: int
    ) -> DeadLetter:
        """A dead letter for ``entry`` rejected with ``error``, stamped now."""
        error_type = type(error)
        return cls(
            entry=entry,
            reason=reason,
            error_type=f"{error_type.__module__}.{error_type.__qualname__}",
            error_message=str(error),
            failed_attempts=failed_attempts,
            dead_lettered_at=datetime.datetime.now(datetime.timezone.utc),
        )

    def to_json_dict(self, context: WriterContext | None) -> dict[str, Any]:
        """The record written to a dead-letter destination, with where it came from."""
        record: dict[str, Any] = {
            "reason": self.reason,
            "error_type": self.error_type,
            "error": self.error_message,
            "failed_attempts": self.failed_attempts,
            "dead_lettered_at": self.dead_lettered_at.isoformat(),
            "entry": self.entry,
        }
        if context is not None:
            record.update(
                app_id=context.epoch.app_id,
                epoch_id=context.epoch.epoch_id,
                partition_id=context.partition_id,
                attempt_number=context.attempt_number,
                task_attempt_id=context.task_attempt_id,
            )
        return record


class DeadLetterWriter(Protocol):
    """Receives the dead letters of one writer. Runs on that writer's event loop."""

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        """Accept ``letters``; they must be durable once :meth:`flush` returns.

        Raises:
            DeliveryError: the letters cannot be stored (the job then fails, so nothing is lost).
        """
        ...

    async def flush(self) -> None:
        """Make every letter accepted so far durable."""
        ...

    async def close(self) -> None:
        """Release resources; letters not flushed may be lost (the task is failing anyway)."""
        ...


class DeadLetterQueue(Protocol):
    """A picklable description of a dead-letter destination."""

    def open(self, context: WriterContext | None) -> DeadLetterWriter:
        """Open the dead-letter writer of one task attempt (called on the executor)."""
        ...


@dataclass(frozen=True)
class JsonLinesDeadLetterQueue:
    """Writes dead letters as JSON lines files through fsspec (local paths, ``s3://``, ...).

    Every task attempt writes its own files, named
    ``dead-letters-<app>-e<epoch>-p<partition>-a<attempt>-<random>-<n>.jsonl`` under ``url``, so
    concurrent tasks never collide and a retried task never overwrites a file. A file is written
    on every ``flush`` that has new letters, and whenever ``max_letters_per_file`` accumulate.
    Each line is :meth:`DeadLetter.to_json_dict`.

    Attributes:
        url: directory (fsspec URL) that receives the files; created if missing.
        storage_options: fsspec options for that filesystem (plain values, so they pickle).
        max_letters_per_file: letters kept in memory before a file is written.

    Raises:
        ConfigurationError: ``url`` is empty or ``max_letters_per_file`` is not positive.
    """

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    max_letters_per_file: int = DEFAULT_DEAD_LETTER_FILE_LETTERS

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.strip():
            raise ConfigurationError(
                "the dead-letter url must be a non-empty fsspec URL or path, e.g. "
                "'s3://bucket/dead-letters' or '/data/dead-letters'"
            )
        if self.max_letters_per_file <= 0:
            raise ConfigurationError(
                f"max_letters_per_file must be positive, got {self.max_letters_per_file}"
            )

    def open(self, context: WriterContext | None) -> DeadLetterWriter:
        """See :class:`DeadLetterQueue`."""
        return _JsonLinesDeadLetterWriter(self, context)


class _JsonLinesDeadLetterWriter:
    def __init__(self, queue: JsonLinesDeadLetterQueue, context: WriterContext | None) -> None:
        self._queue = queue
        self._context = context
        if context is None:
            stem = "dead-letters-local"
        else:
            stem = (
                f"dead-letters-{_safe(context.epoch.app_id)}-e{context.epoch.epoch_id}"
                f"-p{context.partition_id}-a{context.attempt_number}"
            )
        self._stem = f"{stem}-{uuid.uuid4().hex[:12]}"
        self._pending: list[str] = []
        self._files_written = 0

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        for letter in letters:
            self._pending.append(
                json.dumps(
                    letter.to_json_dict(self._context),
                    default=lenient_json_default,
                    ensure_ascii=False,
                )
            )
        if len(self._pending) >= self._queue.max_letters_per_file:
            await self.flush()

    async def flush(self) -> None:
        if not self._pending:
            return
        lines, self._pending = self._pending, []
        self._files_written += 1
        name = f"{self._stem}-{self._files_written:05d}.jsonl"
        # fsspec calls block; keep them off the event loop so in-flight requests progress.
        await asyncio.to_thread(self._write_file, name, lines)

    def _write_file(self, name: str, lines: list[str]) -> None:
        from fsspec.core import url_to_fs

        root = self._queue.url.rstrip("/")
        path = f"{root}/{name}"
        try:
            fs, fs_root = url_to_fs(root, **dict(self._queue.storage_options))
            fs.makedirs(fs_root, exist_ok=True)
            with fs.open(f"{fs_root.rstrip('/')}/{name}", "wb") as handle:
                handle.write(("\n".join(lines) + "\n").encode("utf-8"))
        except Exception as err:
            raise DeliveryError(
                f"could not write {len(lines)} dead letters to {path}: {err}; the task fails so "
                f"that the entries are retried rather than lost"
            ) from err

    async def close(self) -> None:
        self._pending = []


def _safe(text: str) -> str:
    return "".join(char if char.isalnum() or char in "-_." else "_" for char in text)[:64]


@dataclass(frozen=True)
class AsyncSinkDeadLetterQueue:
    """Sends dead letters to another async sink (an HTTP endpoint, a Kinesis stream, ...).

    Each dead letter is handed to that sink as a row, :meth:`DeadLetter.to_json_dict`, through
    the sink's own element converter, with the sink's own retries and rate limiting. If the
    dead-letter sink itself fails, the job fails: nothing is dropped silently.

    Attributes:
        sink: the sink that receives dead letters; it should not have a dead-letter queue of
            its own pointing back here.
    """

    sink: AsyncSink[Any]

    def open(self, context: WriterContext | None) -> DeadLetterWriter:
        """See :class:`DeadLetterQueue`."""
        return _AsyncSinkDeadLetterWriter(self.sink, context)


class _AsyncSinkDeadLetterWriter:
    def __init__(self, sink: AsyncSink[Any], context: WriterContext | None) -> None:
        self._sink = sink
        self._context = context
        self._writer: AsyncSinkWriter[Any, Any] | None = None

    def _target(self) -> AsyncSinkWriter[Any, Any]:
        if self._writer is None:
            self._writer = self._sink.create_async_writer(self._context)
        return self._writer

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        rows = [letter.to_json_dict(self._context) for letter in letters]
        await self._target().write_many(rows)

    async def flush(self) -> None:
        if self._writer is not None:
            await self._writer.flush()

    async def close(self) -> None:
        if self._writer is not None:
            await self._writer.close()
