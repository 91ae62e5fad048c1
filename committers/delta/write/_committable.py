"""What a staging task reports to the driver: one :class:`StagedFile` per Parquet file."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from committers.delta.table._deletion_vectors import DeletionVectorDescriptor
from framework.errors import SinkError
from framework.sink import Epoch

__all__ = [
    "DeltaCommittable",
    "MarkedFile",
    "ReplacedFile",
    "Rewrite",
    "StagedFile",
    "StagedFileSerializer",
    "StagedRewrite",
    "logged_records",
]


@dataclass(frozen=True, kw_only=True)
class StagedFile:
    """A Parquet file written under the table root and not yet committed.

    Attributes:
        path: path relative to the table root, as the Delta log records it (not URL-encoded).
        size: file size in bytes.
        partition_values: partition column -> Delta-serialised value (``None`` for null).
        num_records: rows in the file.
        stats: Delta statistics JSON (numRecords, minValues, maxValues, nullCount).
        modification_time: milliseconds since the epoch when the file was closed.
        task_attempt_id: the Spark task attempt that wrote it (for diagnostics).
    """

    path: str
    size: int
    partition_values: Mapping[str, str | None] = field(default_factory=dict)
    num_records: int
    stats: str
    modification_time: int
    task_attempt_id: int = -1


def logged_records(staged: StagedFile) -> int:
    """The rows the add action of ``staged`` records, as readers count them: its stats'
    ``numRecords`` (0 when the stats carry none: ``DeltaTable.count()`` then counts none)."""
    try:
        records = json.loads(staged.stats).get("numRecords")
    except (TypeError, ValueError, AttributeError):
        records = None
    return int(records) if isinstance(records, int) else 0


@dataclass(frozen=True, kw_only=True)
class ReplacedFile:
    """A live file of the table that a rewrite (an upsert, an overwrite's ``replace_where``)
    replaces: the commit that adds the rewritten rows removes it.

    Attributes:
        logged_path: the path as the log stores it (URL-encoded): what "still live" is
            checked by.
        path: decoded and relative to the table root: what a ``RemoveAction`` names (delta-rs
            encodes it back into ``logged_path``).
        size: file size in bytes.
        num_records: live rows, from the file's stats less those its deletion vector
            deletes (``None`` if the log does not say).
        deletion_vector: the file's deletion vector when it was read: the remove names it
            (the logical file is the path and the vector), and a different vector at commit
            time means rows were deleted meanwhile.
    """

    logged_path: str
    path: str
    size: int
    num_records: int | None = None
    deletion_vector: DeletionVectorDescriptor | None = None


@dataclass(frozen=True, kw_only=True)
class MarkedFile:
    """A live file a merge-on-read rewrite keeps, with more of its rows deleted: its commit
    removes the file with its old vector (the :class:`ReplacedFile` of the same path) and adds
    it back with ``vector``, which deletes those rows too.

    Attributes:
        path: decoded and relative to the table root.
        size, partition_values, modification_time: as the file's add logs them.
        stats: the add's statistics with ``tightBounds: false`` (its bounds are those of the
            whole physical file; ``numRecords`` counts every row, deleted ones too).
        vector: the new deletion vector (its file is staged in the batch's run directory).
    """

    path: str
    size: int
    partition_values: Mapping[str, str | None]
    modification_time: int
    stats: str
    vector: DeletionVectorDescriptor


@dataclass(frozen=True, kw_only=True)
class Rewrite:
    """What a copy-on-write batch read and what its commit removes.

    Attributes:
        read_version: the snapshot the batch was computed on (``None``: no table yet).
        replaced: the files the commit removes; each must still be live in the snapshot the
            commit lands on.
        metrics: counters for the commit's ``operationMetrics`` (delta-spark's names).
        keys: an upsert's key columns, for the commit's ``operationParameters``.
        unchanged: logged paths of live files an overwrite's ``replace_where`` read and found
            without a matching row (kept as they are): with ``replaced``, every file the
            commit may leave in place although it may hold matching rows.
        change_files: the change data files (``_change_data/...``, rows with a
            ``_change_type``) of a table with the change data feed on: logged by ``cdc``
            actions in the same commit, which then holds every change of the rewrite.
        marked: files of ``replaced`` added back with a new deletion vector (merge-on-read):
            the commit removes them with their old vector and adds them with the new one.
    """

    read_version: int | None
    replaced: tuple[ReplacedFile, ...] = ()
    metrics: Mapping[str, int] = field(default_factory=dict)
    keys: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    change_files: tuple[StagedFile, ...] = ()
    marked: tuple[MarkedFile, ...] = ()


@dataclass(frozen=True, kw_only=True)
class DeltaCommittable:
    """All files of one epoch: what becomes one Delta transaction (with ``rewrite``, the
    removes of the files it replaces too)."""

    epoch: Epoch
    files: tuple[StagedFile, ...]
    rewrite: Rewrite | None = None


class StagedRewrite(list[StagedFile]):
    """The files a rewrite staged, as the engine's list of committables of the epoch, with
    what its commit must remove (``rewrite``) and, until it was used, ``redo``: computes the
    batch again on the table's newest snapshot (into a new run directory) and returns the new
    staging, for when another writer removed a file this one replaces.

    A list, so the engine counts and sizes the staged files as any others; the committer's
    ``combine`` reads the rest. Only the driver sees it (it never pickles).
    """

    def __init__(
        self,
        files: Iterable[StagedFile] = (),
        *,
        rewrite: Rewrite,
        redo: Callable[[], StagedRewrite] | None = None,
    ) -> None:
        super().__init__(files)
        self.rewrite = rewrite
        self.redo = redo

    def replace_with(self, other: StagedRewrite) -> None:
        """Become ``other`` (a redone batch), so the epoch's metrics describe what the commit
        holds."""
        self[:] = other
        self.rewrite = other.rewrite
        self.redo = other.redo


class StagedFileSerializer:
    """JSON serializer for :class:`StagedFile`.

    Version 1 is the only version so far; a future version must keep reading version 1.
    """

    version = 1

    def serialize(self, obj: StagedFile) -> bytes:
        return json.dumps(
            {
                "path": obj.path,
                "size": obj.size,
                "partitionValues": dict(obj.partition_values),
                "numRecords": obj.num_records,
                "stats": obj.stats,
                "modificationTime": obj.modification_time,
                "taskAttemptId": obj.task_attempt_id,
            },
            separators=(",", ":"),
        ).encode()

    def deserialize(self, version: int, data: bytes) -> StagedFile:
        if version != 1:
            raise SinkError(f"unknown StagedFile format version {version}")
        raw = json.loads(data)
        return StagedFile(
            path=raw["path"],
            size=raw["size"],
            partition_values=raw["partitionValues"],
            num_records=raw["numRecords"],
            stats=raw["stats"],
            modification_time=raw["modificationTime"],
            task_attempt_id=raw.get("taskAttemptId", -1),
        )
