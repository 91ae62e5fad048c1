"""What a staging task reports to the driver: one :class:`StagedFile` per Parquet file."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from framework.errors import SinkError
from framework.sink import Epoch

__all__ = ["DeltaCommittable", "StagedFile", "StagedFileSerializer"]


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


@dataclass(frozen=True, kw_only=True)
class DeltaCommittable:
    """All files of one epoch: what becomes one Delta transaction."""

    epoch: Epoch
    files: tuple[StagedFile, ...]


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
