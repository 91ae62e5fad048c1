"""An upsert's key matching in pyarrow: which candidate files hold a batch key (on the driver),
and the filter that drops the changed rows of the files it rewrites (in Python tasks).

When the batch's keys were collected and the candidates are few and small, the driver reads
only their key columns with pyarrow and hash-joins them with the keys: tens of milliseconds,
where a Spark join costs a job (about half a second of scheduling on a small cluster). Larger
candidate sets, or keys the driver cannot compare exactly as Spark would, go through the
Spark join, which scales with the cluster (:meth:`UpsertStager._touched`).

Both ways count the same thing: the rows of each candidate whose key equals a batch key
(NULL matching nothing), split by whether the batch deletes that key.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from committers.delta._storage import TableLocation

__all__ = [
    "DRIVER_MAX_BYTES",
    "DRIVER_MAX_FILES",
    "Candidate",
    "KeyColumn",
    "KeysToDrop",
    "driver_matches",
    "keys_to_drop",
]

#: The driver confirms candidates only up to this many files and bytes of Parquet in all
#: (it reads their key columns alone, a fraction of that); beyond, Spark joins.
DRIVER_MAX_FILES = 64
DRIVER_MAX_BYTES = 256 * 1024 * 1024
_READERS = 8  # files read at once: object stores answer each open after a round trip

_FILE = "__sparksink_file__"
_DELETE = "__sparksink_delete__"
_ROW = "__sparksink_row__"


@dataclass(frozen=True)
class KeyColumn:
    """A key column of the table: its name, logical Arrow type, and whether it partitions."""

    name: str
    type: pa.DataType
    partition: bool


@dataclass(frozen=True)
class Candidate:
    """A file to check: its path relative to the table root, size, and its value of each
    partition key column (``None`` for data columns)."""

    path: str
    size: int
    partition_values: tuple[Any, ...]


def driver_matches(
    location: TableLocation,
    keys: Sequence[KeyColumn],
    candidates: Sequence[Candidate],
    batch: pa.Table,
) -> dict[tuple[int, bool], int] | None:
    """Rows matching a key of ``batch`` per (candidate index, deleted), or ``None`` when the
    driver should not decide: too many candidates or bytes, or a key whose values do not cast
    exactly to the table's type (Spark's join coerces them its own way).

    ``batch`` holds one column per key (in ``keys``' order) and the boolean delete flag last.

    Raises:
        OSError, pyarrow.ArrowException: a candidate cannot be read (deleted by a VACUUM
            meanwhile, or damaged).
    """
    if len(candidates) > DRIVER_MAX_FILES or sum(c.size for c in candidates) > DRIVER_MAX_BYTES:
        return None
    typed = _typed_keys(keys, batch)
    if typed is None:
        return None
    names = typed.column_names
    wanted = typed.append_column(_DELETE, batch.column(len(keys)))
    filesystem = location.filesystem()

    def read(index: int) -> pa.Table | None:
        return _keys_of(filesystem, location, keys, names, index, candidates[index])

    with ThreadPoolExecutor(min(_READERS, max(1, len(candidates)))) as pool:
        tables = list(pool.map(read, range(len(candidates))))
    if any(t is None for t in tables):
        return None
    present = [t for t in tables if t is not None and t.num_rows]
    if not present or wanted.num_rows == 0:
        return {}
    joined = pa.concat_tables(present).join(wanted, keys=names, join_type="inner")
    counted = joined.group_by([_FILE, _DELETE]).aggregate([([], "count_all")])
    return {
        (file, bool(deleted)): count
        for file, deleted, count in zip(
            counted.column(_FILE).to_pylist(),
            counted.column(_DELETE).to_pylist(),
            counted.column("count_all").to_pylist(),
            strict=True,
        )
    }


@dataclass(frozen=True)
class KeysToDrop:
    """The row filter of an upsert's rewrite in Python tasks: keeps, in order, the rows whose
    key equals no batch key (a NULL key equals nothing), as Spark's anti join on the key does.

    Attributes:
        names: the key columns of the rows filtered (the table's names).
        keys: the batch's keys, one column per name, typed as the table (see
            :func:`keys_to_drop`).
    """

    names: tuple[str, ...]
    keys: pa.Table

    def __call__(self, rows: pa.Table) -> pa.Table:
        if len(self.names) == 1:
            named = pc.is_in(rows.column(self.names[0]), value_set=self.keys.column(0))
        else:
            positions = pa.array(np.arange(rows.num_rows, dtype=np.int64))
            probe = pa.table(
                [rows.column(n) for n in self.names] + [positions],
                names=[*self.keys.column_names, _ROW],
            )
            hit = probe.join(self.keys, keys=self.keys.column_names, join_type="left semi")
            named = pc.is_in(positions, value_set=hit.column(_ROW))
        return rows.filter(pc.invert(pc.fill_null(named, False)))


def keys_to_drop(keys: Sequence[KeyColumn], batch: pa.Table) -> KeysToDrop | None:
    """The filter dropping the rows whose key is one of ``batch``'s (one column per key, in
    ``keys``' order; more columns are ignored); ``None`` when a key's values do not cast
    exactly to the table's type (Spark's join coerces them its own way)."""
    typed = _typed_keys(keys, batch)
    return None if typed is None else KeysToDrop(tuple(k.name for k in keys), typed)


def _typed_keys(keys: Sequence[KeyColumn], batch: pa.Table) -> pa.Table | None:
    """``batch``'s first ``len(keys)`` columns cast exactly to the keys' types, named by
    position; ``None`` when a value does not cast exactly."""
    try:
        columns = [_exact(batch.column(i), k.type) for i, k in enumerate(keys)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return pa.table(columns, names=[f"__sparksink_key_{i}__" for i in range(len(keys))])


def _keys_of(
    filesystem: Any,
    location: TableLocation,
    keys: Sequence[KeyColumn],
    names: list[str],
    index: int,
    candidate: Candidate,
) -> pa.Table | None:
    """The key columns of one candidate, typed as the table, with its index; ``None`` if a
    value does not cast exactly."""
    data = [k.name for k in keys if not k.partition]
    with filesystem.open(location.path(candidate.path), "rb") as handle:
        parquet = pq.ParquetFile(handle, coerce_int96_timestamp_unit="us")
        in_file = set(parquet.schema_arrow.names)
        if not all(name in in_file for name in data):
            return pa.table({})  # a key column added after this file was written: all NULL
        read = parquet.read(columns=data, use_threads=False)
    rows = read.num_rows
    columns = []
    try:
        for k, value in zip(keys, candidate.partition_values, strict=True):
            if k.partition:
                columns.append(pa.repeat(pa.scalar(value, k.type), rows))
            else:
                columns.append(_exact(read.column(k.name), k.type))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    columns.append(pa.repeat(pa.scalar(index, pa.int32()), rows))
    return pa.table(columns, names=[*names, _FILE])


def _exact(values: pa.ChunkedArray | pa.Array, target: pa.DataType) -> pa.ChunkedArray | pa.Array:
    """``values`` as ``target``, refusing any cast that would change a value (a timestamp's
    time zone is only its display)."""
    if values.type == target:
        return values
    return pc.cast(values, target, safe=True)
