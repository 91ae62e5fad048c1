"""A Delta table snapshot as a bounded :class:`~framework.source.FileGroupSource`.

The listing is the snapshot's add actions, as delta-rs resolves them for one pinned version,
minus the files :class:`~committers.delta.table._skipping.FilePruner` proves hold no wanted row.
Each file is read with pyarrow through the location's fsspec filesystem (local paths and ``s3://``
alike) into record batches of the table's logical schema, in the table's column order:

* data columns are taken from the file by their physical name (column mapping ``name``), by
  Parquet field id (mode ``id``, falling back to the physical name) or by name, cast to the
  table's type; a column the file lacks (added to the table later) is null;
* partition columns are constants of the table's type, null for a null partition value.

Everything here pickles: the source is shipped to Spark tasks, which only read files; only the
driver lists.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable

from committers.delta.table._deletion_vectors import (
    DeletionVectorDescriptor,
    deleted_rows,
    keep_mask,
)
from committers.delta.table._delta_schema import PARQUET_FIELD_ID, DeltaField, arrow_type
from committers.delta.table._live_vectors import table_deletion_vectors
from committers.delta.table._skipping import FilePruner, Predicate
from committers.delta.table._snapshot import Snapshot
from framework.errors import SinkError
from framework.source import FileGroupSource, FileSourceConfig, FileSplit

__all__ = [
    "BATCH_ROWS",
    "DELETION_VECTOR",
    "FETCH_BATCHES",
    "DataFile",
    "DeltaFileReader",
    "DeltaScan",
    "SnapshotListing",
    "delta_source",
    "list_data_files",
    "vector_metadata",
]

log = logging.getLogger("committers.delta")

#: Rows per record batch read from a file.
BATCH_ROWS = 64 * 1024
#: Record batches one fetch of a task reads: one, so a task holds one batch at a time.
FETCH_BATCHES = 1
_EPOCH = dt.datetime(1970, 1, 1)
_EPOCH_UTC = _EPOCH.replace(tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)


@dataclass(frozen=True)
class DataFile:
    """One data file of a snapshot.

    Attributes:
        path: as the log names it, decoded: relative to the table root, or an absolute URI.
        size_bytes: the file's size.
        partition_values: partition column -> typed value (None for null), as delta-rs
            parses the log's partition values.
        modification_time: the add action's ``modificationTime`` (milliseconds since the
            epoch): when the file was written.
        deletion_vector: the rows of the file the version no longer holds, if any.
    """

    path: str
    size_bytes: int
    partition_values: Mapping[str, Any]
    modification_time: int = 0
    deletion_vector: DeletionVectorDescriptor | None = None

    def uri(self, snapshot: Snapshot) -> str:
        """The file's absolute URI (an absolute path for local tables)."""
        if "://" in self.path or self.path.startswith("/"):
            return self.path
        return f"{snapshot.location.uri.rstrip('/')}/{self.path}"


def list_data_files(
    table: DeltaTable, snapshot: Snapshot, predicates: Sequence[Predicate] = ()
) -> list[DataFile]:
    """The data files of ``table`` (opened at ``snapshot``'s version) that may hold rows
    satisfying every predicate, in log order. Logs how many were pruned and skipped."""
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    pruner = FilePruner(predicates, snapshot.shape, snapshot.column_mapping_mode != "none")
    partition_by = snapshot.shape.partition_by
    vectors = table_deletion_vectors(snapshot.location, snapshot.reader_features, snapshot.version)
    files = [
        DataFile(
            path=(path := unquote(action["path"])),
            size_bytes=int(action["size_bytes"]),
            partition_values={name: action.get(f"partition.{name}") for name in partition_by},
            modification_time=int(action.get("modification_time") or 0),
            deletion_vector=vectors.get(path),
        )
        for action in actions
        if pruner.keep(action)
    ]
    log.info(
        "%s version %d: reading %d of %d files (%d pruned by partition values, %d skipped by "
        "statistics), %d bytes",
        snapshot.location.uri,
        snapshot.version,
        len(files),
        len(actions),
        pruner.pruned_by_partition,
        pruner.skipped_by_stats,
        sum(f.size_bytes for f in files),
    )
    return files


def spell_partition_value(value: Any) -> str | None:
    """A typed partition value as text :func:`partition_array` turns back into the same value
    (timestamps as microseconds since the epoch, everything else in Delta's spelling)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, dt.datetime):
        epoch = _EPOCH if value.tzinfo is None else _EPOCH_UTC
        return str((value - epoch) // _MICROSECOND)
    if isinstance(value, dt.date):
        return value.isoformat()
    raise SinkError(f"cannot read partition value {value!r} ({type(value).__name__})")


def partition_array(text: str | None, arrow: pa.DataType, rows: int) -> pa.Array:
    """``rows`` copies of a partition value spelled by :func:`spell_partition_value`."""
    if text is None:
        return pa.nulls(rows, arrow)
    if pa.types.is_timestamp(arrow):
        scalar = pa.scalar(int(text), pa.int64()).cast(arrow)
    else:
        scalar = pa.array([text], pa.string()).cast(arrow)[0]
    return pa.repeat(scalar, rows)


@dataclass(frozen=True)
class DeltaScan:
    """What one read of a snapshot needs, as plain picklable values.

    Attributes:
        snapshot: the pinned version and its shape.
        predicates: filters to prune and skip files with (all must hold).
        config: split sizing.
    """

    snapshot: Snapshot
    predicates: tuple[Predicate, ...] = ()
    config: FileSourceConfig = field(
        default_factory=lambda: FileSourceConfig(fetch_size=FETCH_BATCHES)
    )


class SnapshotListing:
    """The ``list_files`` of a snapshot source: opens the pinned version with delta-rs and
    lists its files once per instance (the bin-packer calls it twice). Pickles without the
    listing: tasks never list."""

    def __init__(self, scan: DeltaScan) -> None:
        self._scan = scan
        self._files: list[FileSplit] | None = None

    def __call__(self) -> list[FileSplit]:
        if self._files is None:
            snapshot = self._scan.snapshot
            location = snapshot.location
            table = DeltaTable(
                location.uri,
                storage_options=location.delta_storage_options(),
                version=snapshot.version,
            )
            self._files = [
                FileSplit(
                    path=f.path,
                    size_bytes=f.size_bytes,
                    partition_values={
                        name: spell_partition_value(value)
                        for name, value in f.partition_values.items()
                    },
                    metadata=vector_metadata(f.deletion_vector),
                )
                for f in list_data_files(table, snapshot, self._scan.predicates)
            ]
        return self._files

    def __getstate__(self) -> dict[str, Any]:
        return {"_scan": self._scan, "_files": None}


#: The ``FileSplit.metadata`` key of a file's deletion vector descriptor (JSON).
DELETION_VECTOR = "deletionVector"


def vector_metadata(vector: DeletionVectorDescriptor | None) -> dict[str, str]:
    """The ``FileSplit.metadata`` that hands ``vector`` to :class:`DeltaFileReader`."""
    return {} if vector is None else {DELETION_VECTOR: json.dumps(vector.to_json())}


def _file_column(field: DeltaField, file_schema: pa.Schema, mode: str) -> str | None:
    """The name of ``field``'s column in a file, or None if the file lacks it."""
    names = file_schema.names
    if mode == "id" and field.field_id is not None:
        wanted = str(field.field_id).encode()
        for candidate in file_schema:
            if (candidate.metadata or {}).get(PARQUET_FIELD_ID) == wanted:
                return str(candidate.name)
    name = field.physical_name if mode != "none" else field.name
    if name in names:
        return name
    folded = [n for n in names if n.lower() == name.lower()]
    return folded[0] if len(folded) == 1 else None


class DeltaFileReader:
    """The ``read_file`` of a snapshot source: one data file as record batches of the table's
    logical schema (see the module docstring). The same batches in the same order every call.
    """

    def __init__(self, snapshot: Snapshot, batch_rows: int = BATCH_ROWS) -> None:
        self._snapshot = snapshot
        self._batch_rows = batch_rows
        shape = snapshot.shape
        self._mode = snapshot.column_mapping_mode
        self._fields = shape.schema.fields
        self._partition_by = frozenset(shape.partition_by)
        self._logical = [arrow_type(f.type, physical=False) for f in self._fields]
        self._physical = [arrow_type(f.type, physical=self._mode != "none") for f in self._fields]
        self._schema = pa.schema(
            [pa.field(f.name, t) for f, t in zip(self._fields, self._logical, strict=True)]
        )

    @property
    def schema(self) -> pa.Schema:
        """The schema of every batch."""
        return self._schema

    def _fs_path(self, path: str) -> str:
        location = self._snapshot.location
        if "://" not in path:
            return path if path.startswith("/") else location.path(path)
        if path.startswith("file:"):
            return urlparse(path).path
        return path.split("://", 1)[1]

    def __call__(self, file: FileSplit) -> Iterator[pa.RecordBatch]:
        location = self._snapshot.location
        path = self._fs_path(file.path)
        if location.is_local:  # Arrow's own file: no Python file object between reads
            with pq.ParquetFile(path, coerce_int96_timestamp_unit="us") as parquet:
                yield from self._read(file, parquet)
            return
        with (
            location.filesystem().open(path, "rb") as handle,
            pq.ParquetFile(handle, coerce_int96_timestamp_unit="us") as parquet,
        ):
            yield from self._read(file, parquet)

    def _read(self, file: FileSplit, parquet: pq.ParquetFile) -> Iterator[pa.RecordBatch]:
        file_schema = parquet.schema_arrow
        columns = [_file_column(f, file_schema, self._mode) for f in self._fields]
        wanted = [
            c
            for c, f in zip(columns, self._fields, strict=True)
            if c is not None and f.name not in self._partition_by
        ]
        keep = self._row_filter(file)
        first_row = 0
        for rows, batch in self._batches(parquet, wanted + self._extra_columns(file, file_schema)):
            shaped = self._finish(file, self._shape(file, columns, rows, batch), batch, first_row)
            mask = keep(first_row, rows)
            first_row += rows
            if mask is None:
                yield shaped
            elif mask.any():
                yield shaped.filter(pa.array(mask))

    def _row_filter(self, file: FileSplit) -> Callable[[int, int], np.ndarray | None]:
        """Which rows of ``file`` are read: for ``(first_row, rows)``, a boolean mask of the
        rows ``first_row`` on, or None for all of them. Here: the rows its deletion vector
        does not delete."""
        deleted = self._deleted_rows(file)
        return lambda first_row, rows: keep_mask(deleted, first_row, rows)

    def _deleted_rows(self, file: FileSplit) -> np.ndarray:
        """The sorted row indexes the file's deletion vector (if any) deletes; read before
        the first row is returned, so a damaged vector fails the read, never returns rows."""
        return self._vector_rows(file, DELETION_VECTOR)

    def _vector_rows(self, file: FileSplit, key: str) -> np.ndarray:
        """The sorted row indexes of the deletion vector under ``key`` of ``file``'s
        metadata (none without one)."""
        raw = file.metadata.get(key)
        vector = None if raw is None else DeletionVectorDescriptor.from_json(json.loads(raw))
        return deleted_rows(vector, self._snapshot.location, file.path)

    def _extra_columns(self, file: FileSplit, file_schema: pa.Schema) -> list[str]:
        """Columns of the file read beside the table's (none here), handed to
        :meth:`_finish`."""
        return []

    def _finish(
        self, file: FileSplit, batch: pa.RecordBatch, raw: pa.RecordBatch | None, first_row: int
    ) -> pa.RecordBatch:
        """The batch to emit for ``batch`` (the table's columns of the file's rows from its
        ``first_row``-th on, before any is filtered out; ``raw`` is what was read of them,
        extra columns included): ``batch`` itself here."""
        return batch

    def _batches(
        self, parquet: pq.ParquetFile, columns: list[str]
    ) -> Iterator[tuple[int, pa.RecordBatch | None]]:
        if columns:
            for batch in parquet.iter_batches(
                batch_size=self._batch_rows, columns=columns, use_threads=False
            ):
                yield batch.num_rows, batch
            return
        # No data column in the file (all added later): only its row count matters.
        remaining = parquet.metadata.num_rows
        while remaining > 0:
            rows = min(remaining, self._batch_rows)
            remaining -= rows
            yield rows, None

    def _shape(
        self,
        file: FileSplit,
        columns: list[str | None],
        rows: int,
        batch: pa.RecordBatch | None,
    ) -> pa.RecordBatch:
        arrays: list[pa.Array] = []
        for f, column, logical, physical in zip(
            self._fields, columns, self._logical, self._physical, strict=True
        ):
            if f.name in self._partition_by:
                arrays.append(partition_array(file.partition_values.get(f.name), logical, rows))
            elif column is None or batch is None:
                arrays.append(pa.nulls(rows, logical))
            else:
                arrays.append(_convert(batch.column(column), physical, logical, f.name, file))
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)


def _convert(
    array: pa.Array, physical: pa.DataType, logical: pa.DataType, name: str, file: FileSplit
) -> pa.Array:
    if array.type != physical:
        try:
            array = pc.cast(array, options=pc.CastOptions(physical, allow_time_truncate=True))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise SinkError(
                f"column {name!r} of {file.path} holds {array.type}, which cannot be read as "
                f"the table's {logical}: {err}"
            ) from err
    return array if physical == logical else array.view(logical)


def delta_source(scan: DeltaScan) -> FileGroupSource[pa.RecordBatch, pa.RecordBatch]:
    """The bounded source of ``scan``: its files bin-packed into splits of
    ``scan.config.max_split_bytes``, each read into batches of the table's logical schema."""
    return FileGroupSource(
        SnapshotListing(scan),
        DeltaFileReader(scan.snapshot),
        config=scan.config,
        split_id_prefix=f"v{scan.snapshot.version}",
    )
