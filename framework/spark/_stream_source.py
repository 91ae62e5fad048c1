"""An unbounded file input as a Spark Python ``DataSourceStreamReader``.

A continuous file source in FLIP-27 terms has an enumerator that keeps discovering new files
and whose checkpointed state says how far discovery got. Spark's micro-batch engine wants the
same thing as *offsets*: :class:`FileDiscovery` supplies them. Its offsets are positions in an
append-only, totally ordered sequence of files (for a Delta table: a table version and a file
index in it), so that

* ``latestOffset(start, limit)`` discovers the files after ``start``, up to the read limit
  (admission control: files or bytes per micro-batch, always at least one file);
* ``partitions(start, end)`` lists exactly the files between two offsets, again and always the
  same, and packs them into splits with the bounded machinery of :mod:`framework.spark._source`
  (each micro-batch is a bounded source);
* ``read(partition)`` reads a split in a task.

Spark checkpoints the end offset of each micro-batch before running it and replays a batch
with the same offsets after a failure, so a batch reads the same files every time: together
with a sink that skips replayed batch ids, every row reaches the destination exactly once.
One offset is not checkpointed: the start of a query's first batch, for which Spark calls
``initialOffset`` again when it replays that batch (checked with Spark 4.2), so a discovery
records in the first batch's end offset where that batch began (see
:meth:`FileDiscovery.files_between`). Everything lives in the offsets; no state is kept
between calls that a restart would lose.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from framework._crash import crash_point
from framework.errors import ConfigurationError
from framework.source import FileGroupSource, FileSplit
from framework.spark._source import SplitsPartition, plan_partitions, read_partition

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

__all__ = ["AdmissionLimit", "FileDiscovery", "FileStreamReader"]

log = logging.getLogger("framework.spark")


class AdmissionLimit:
    """How much one micro-batch may take: at most ``max_files`` files (``None``: no limit),
    and files while fewer than ``max_bytes`` bytes are taken: a soft limit, as delta-spark's
    ``maxBytesPerTrigger`` (the file that crosses it is still taken, so a file larger than
    ``max_bytes`` is never stuck). Always at least one file when one is available."""

    def __init__(self, max_files: int | None = None, max_bytes: int | None = None) -> None:
        for name, value in (("max_files", max_files), ("max_bytes", max_bytes)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigurationError(f"{name} must be a positive integer, got {value!r}")
        self.max_files = max_files
        self.max_bytes = max_bytes

    @classmethod
    def of(cls, limit: ReadLimit, default: AdmissionLimit) -> AdmissionLimit:
        """The limit Spark asks for: ``ReadAllAvailable`` lifts every limit (a trigger such as
        ``availableNow`` may ask for everything), the others are taken as they are."""
        if isinstance(limit, ReadAllAvailable):
            return cls()
        if isinstance(limit, ReadMaxFiles):
            return cls(max_files=int(limit.max_files), max_bytes=default.max_bytes)
        if isinstance(limit, ReadMaxBytes):
            return cls(max_files=default.max_files, max_bytes=int(limit.max_bytes))
        return default

    def admits(self, files: int, size_bytes: int) -> bool:
        """Whether a micro-batch holding ``files`` files of ``size_bytes`` bytes takes one
        more (whatever its size: there is still room before it)."""
        if files == 0:
            return True
        if self.max_files is not None and files >= self.max_files:
            return False
        return self.max_bytes is None or size_bytes < self.max_bytes

    def read_limit(self) -> ReadLimit:
        """The limit as Spark's ``ReadLimit`` (Spark takes one: files win over bytes)."""
        if self.max_files is not None:
            return ReadMaxFiles(self.max_files)
        if self.max_bytes is not None:
            return ReadMaxBytes(self.max_bytes)
        return ReadAllAvailable()


class FileDiscovery(Protocol):
    """The files of an append-only input, in one total order, addressed by offsets (plain
    JSON-able dicts). Must pickle: it is shipped to Spark's tasks, which only read."""

    def initial_offset(self) -> dict[str, Any]:
        """Where a new query starts. Spark does not record it: it asks again when it replays
        a query's first micro-batch after a restart, when the input may have moved on (see
        :meth:`files_between`)."""
        ...

    def discover(
        self, start: dict[str, Any], limit: AdmissionLimit, *, up_to: dict[str, Any] | None
    ) -> dict[str, Any]:
        """The offset after the files following ``start`` that ``limit`` admits (``start``
        itself when there is nothing new); never past ``up_to`` when given.

        Raises:
            SinkError (or a subclass): the input changed in a way an append-only reader cannot
                follow; the message says what happened and how to go on.
        """
        ...

    def latest_offset(self) -> dict[str, Any]:
        """The offset after every file available now (for ``Trigger.AvailableNow``)."""
        ...

    def files_between(self, start: dict[str, Any], end: dict[str, Any]) -> list[FileSplit]:
        """Exactly the files from ``start`` up to ``end``, the same list on every call, in
        every process. ``start`` may be this process's :meth:`initial_offset` while ``end``
        was discovered by an earlier run (a replayed first batch): the files are then the
        ones that run's batch named, which ``end`` must let the discovery find again."""
        ...

    def source(self, files: Sequence[FileSplit]) -> FileGroupSource[Any, Any]:
        """A bounded source reading ``files`` (``[]`` when only reading planned splits)."""
        ...


class FileStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A Spark stream reader over a :class:`FileDiscovery` (see the module docstring).

    Args:
        schema: the read schema; batches are conformed to it.
        discovery: the input.
        limit: the admission limit of each micro-batch unless Spark asks for everything.
    """

    def __init__(self, schema: StructType, discovery: FileDiscovery, limit: AdmissionLimit) -> None:
        self._schema = schema
        self._discovery = discovery
        self._limit = limit
        self._available_now: dict[str, Any] | None = None

    def initialOffset(self) -> dict[str, Any]:
        return self._discovery.initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self._limit.read_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        """Fix the end of an ``availableNow`` run: what is available now, nothing later."""
        self._available_now = self._discovery.latest_offset()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        admission = AdmissionLimit.of(limit, self._limit)
        end = self._discovery.discover(start, admission, up_to=self._available_now)
        if end != start:
            log.debug("next micro-batch reads from %s to %s", start, end)
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[SplitsPartition]:
        """The splits of a micro-batch. Spark calls it after it wrote the batch's ``end`` to the
        checkpoint's offsets log, and again with the same offsets when it replays the batch
        after a restart (``start`` is then :meth:`initialOffset` again for a query's first
        batch: see :meth:`FileDiscovery.files_between`)."""
        if start == end:
            return []
        files = self._discovery.files_between(start, end)
        crash_point("offsets_written")
        return plan_partitions(self._discovery.source(files))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_partition(self._discovery.source([]), partition, self._schema)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the input is never consumed, only read."""
