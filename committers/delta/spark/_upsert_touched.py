"""An upsert's key matching in pyarrow: which candidate files hold a batch key (on the driver),
and the filter that drops the changed rows of the files it rewrites (in Python tasks).

When the batch's keys were collected and the candidates are few and small, the driver reads
only their key columns with pyarrow and hash-joins them with the keys: tens of milliseconds,
where a Spark join costs a job (about half a second of scheduling on a small cluster). Larger
candidate sets, or keys the driver cannot compare exactly as Spark would, go through the
Spark join, which scales with the cluster (:meth:`UpsertStager._touched`).

Both ways count the same thing: the rows of each candidate whose key equals a batch key
(NULL matching nothing) and that the batch's change replaces, split by whether the change
deletes; and, with ``sequence_by``, the changes that are *stale*: older than a row they match
(see :func:`change_applies`), so that the row is kept and the change not written.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import keep_mask

__all__ = [
    "DRIVER_MAX_BYTES",
    "DRIVER_MAX_FILES",
    "Candidate",
    "KeyColumn",
    "KeysToDrop",
    "Matches",
    "SequenceColumn",
    "change_applies",
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
_STORED = "__sparksink_stored_{}__"  # a stored row's sequence value, by position
_CHANGE = "__sparksink_sequence_{}__"  # a change's sequence value, by position


@dataclass(frozen=True)
class KeyColumn:
    """A key column of the table: its name, logical Arrow type, whether it partitions, and
    the name the files give it (its physical name under column mapping; default: its name)."""

    name: str
    type: pa.DataType
    partition: bool
    in_file: str = ""

    @property
    def file_name(self) -> str:
        return self.in_file or self.name


@dataclass(frozen=True)
class SequenceColumn:
    """A ``sequence_by`` column of the table (a data column): its name, logical Arrow type
    and the name the files give it (as for :class:`KeyColumn`)."""

    name: str
    type: pa.DataType
    in_file: str = ""

    @property
    def file_name(self) -> str:
        return self.in_file or self.name


@dataclass(frozen=True)
class Candidate:
    """A file to check: its path relative to the table root, size, its value of each
    partition key column (``None`` for data columns), and the sorted row indexes its deletion
    vector deletes (``None``: no vector), which match nothing."""

    path: str
    size: int
    partition_values: tuple[Any, ...]
    deleted: np.ndarray | None = None


@dataclass(frozen=True)
class Matches:
    """What the batch does to the candidates.

    Attributes:
        rows: the matching rows the batch replaces (their change applies), per (candidate
            index, whether the change deletes).
        stale: the changes older than a row they match, not applied: one row per change, its
            key columns (typed as the table, named by position) and its delete flag.
        positions: the row indexes (in the file, as deletion vectors count them) of the rows
            the batch replaces, per candidate index holding any.
    """

    rows: dict[tuple[int, bool], int]
    stale: pa.Table
    positions: dict[int, np.ndarray] = field(default_factory=dict)


def driver_matches(
    location: TableLocation,
    keys: Sequence[KeyColumn],
    candidates: Sequence[Candidate],
    batch: pa.Table,
    sequence: Sequence[SequenceColumn] = (),
) -> Matches | None:
    """The batch's matches in the candidates, or ``None`` when the driver should not decide:
    too many candidates or bytes, or a key or sequence value that does not cast exactly to the
    table's type (Spark's join coerces them its own way).

    ``batch`` holds one column per key (in ``keys``' order), the boolean delete flag, then one
    column per ``sequence`` column (the changes' sequence values; none without
    ``sequence_by``, and then no change is stale).

    Raises:
        OSError, pyarrow.ArrowException: a candidate cannot be read (deleted by a VACUUM
            meanwhile, or damaged).
    """
    if len(candidates) > DRIVER_MAX_FILES or sum(c.size for c in candidates) > DRIVER_MAX_BYTES:
        return None
    wanted = _typed_batch(keys, sequence, batch)
    if wanted is None:
        return None
    names = wanted.column_names[: len(keys)]
    filesystem = location.filesystem()

    def read(index: int) -> pa.Table | None:
        return _keys_of(filesystem, location, keys, sequence, index, candidates[index])

    with ThreadPoolExecutor(min(_READERS, max(1, len(candidates)))) as pool:
        tables = list(pool.map(read, range(len(candidates))))
    if any(t is None for t in tables):
        return None
    present = [t for t in tables if t is not None and t.num_rows]
    if not present or wanted.num_rows == 0:
        return Matches({}, _no_stale(wanted, len(keys)))
    joined = pa.concat_tables(present).join(wanted, keys=names, join_type="inner")
    replaced, stale = joined, joined.slice(0, 0)
    if sequence:
        applies = _applies(joined, len(sequence))
        replaced, stale = joined.filter(applies), joined.filter(pc.invert(applies))
    counted = replaced.group_by([_FILE, _DELETE]).aggregate([([], "count_all")])
    rows = {
        (file, bool(deleted)): count
        for file, deleted, count in zip(
            counted.column(_FILE).to_pylist(),
            counted.column(_DELETE).to_pylist(),
            counted.column("count_all").to_pylist(),
            strict=True,
        )
    }
    distinct = stale.select([*names, _DELETE]).group_by([*names, _DELETE]).aggregate([])
    return Matches(rows, distinct, _positions(replaced))


def _positions(replaced: pa.Table) -> dict[int, np.ndarray]:
    """Candidate index -> the sorted row indexes of its rows in ``replaced``."""
    if replaced.num_rows == 0:
        return {}
    files = replaced.column(_FILE).to_numpy()
    rows = replaced.column(_ROW).to_numpy().astype(np.uint64)
    order = np.lexsort((rows, files))
    files, rows = files[order], rows[order]
    starts = np.flatnonzero(np.r_[True, files[1:] != files[:-1]])
    ends = [*starts[1:], len(files)]
    return {int(files[a]): rows[a:b] for a, b in zip(starts, ends, strict=True)}


def change_applies(
    stored: Sequence[pa.Array | pa.ChunkedArray],
    change: Sequence[pa.Array | pa.ChunkedArray],
    deleted: pa.Array | pa.ChunkedArray,
) -> pa.Array | pa.ChunkedArray:
    """Per row, whether a change replaces (or deletes) the stored row with its key: whether the
    change ranks at least as high as that row, by the rule that orders the changes of one
    batch, the stored row counting as a change that is not a delete.

    Ranks compare the sequence values left to right (``stored`` and ``change``, one array per
    ``sequence_by`` column, at least one, typed alike), as Spark orders them: a NULL stored
    value lowest (a row written without one is older than any change; changes have none),
    NaN highest and equal to NaN. On equal sequences, a change that is not a delete applies
    (the later arrival wins: the batch's further tie-break compares change-only columns the
    stored row does not have) and a delete does not (a non-delete wins over a delete, as in
    a batch).
    """
    applies = pc.invert(deleted)
    for old, new in reversed(list(zip(stored, change, strict=True))):
        greater = pc.fill_null(pc.greater(new, old), True)  # (a NULL stored value: True)
        equal = pc.fill_null(pc.equal(new, old), False)
        if pa.types.is_floating(old.type):  # NaN above every number, equal to itself
            old_nan, new_nan = (pc.fill_null(pc.is_nan(a), False) for a in (old, new))
            greater = pc.or_(greater, pc.and_(new_nan, pc.invert(old_nan)))
            greater = pc.and_(greater, pc.invert(pc.and_(old_nan, pc.invert(new_nan))))
            equal = pc.or_(equal, pc.and_(new_nan, old_nan))
        applies = pc.or_(greater, pc.and_(equal, applies))
    return applies


def _applies(joined: pa.Table, sequence: int) -> pa.Array | pa.ChunkedArray:
    """:func:`change_applies` on a join of stored rows with changes (positional names)."""
    return change_applies(
        [joined.column(_STORED.format(i)) for i in range(sequence)],
        [joined.column(_CHANGE.format(i)) for i in range(sequence)],
        joined.column(_DELETE),
    )


def _no_stale(wanted: pa.Table, keys: int) -> pa.Table:
    return wanted.select([*wanted.column_names[:keys], _DELETE]).slice(0, 0)


@dataclass(frozen=True)
class KeysToDrop:
    """The row filter of an upsert's rewrite in Python tasks: keeps, in order, the rows whose
    key equals no batch key (a NULL key equals nothing), as Spark's anti join on the key does,
    and the rows a stale change matches (see :func:`change_applies`).

    Attributes:
        names: the key columns of the rows filtered (the table's names).
        keys: the batch's changes typed as the table: one column per key, the delete flag,
            one column per ``sequence`` column (see :func:`keys_to_drop`).
        sequence: the table's ``sequence_by`` columns (none: every change applies).
    """

    names: tuple[str, ...]
    keys: pa.Table
    sequence: tuple[str, ...] = ()

    def __call__(self, rows: pa.Table) -> pa.Table:
        key_names = self.keys.column_names[: len(self.names)]
        if self.sequence:
            positions = pa.array(np.arange(rows.num_rows, dtype=np.int64))
            probe = pa.table(
                [rows.column(n) for n in (*self.names, *self.sequence)] + [positions],
                names=[
                    *key_names,
                    *(_STORED.format(i) for i in range(len(self.sequence))),
                    _ROW,
                ],
            )
            hit = probe.join(self.keys, keys=key_names, join_type="inner")
            replaced = hit.filter(_applies(hit, len(self.sequence))).column(_ROW)
            named = pc.is_in(positions, value_set=replaced)
        elif len(self.names) == 1:
            named = pc.is_in(rows.column(self.names[0]), value_set=self.keys.column(0))
        else:
            positions = pa.array(np.arange(rows.num_rows, dtype=np.int64))
            probe = pa.table(
                [rows.column(n) for n in self.names] + [positions], names=[*key_names, _ROW]
            )
            hit = probe.join(self.keys, keys=key_names, join_type="left semi")
            named = pc.is_in(positions, value_set=hit.column(_ROW))
        return rows.filter(pc.invert(pc.fill_null(named, False)))


def keys_to_drop(
    keys: Sequence[KeyColumn], batch: pa.Table, sequence: Sequence[SequenceColumn] = ()
) -> KeysToDrop | None:
    """The filter dropping the rows the changes of ``batch`` replace (laid out as for
    :func:`driver_matches`); ``None`` when a key or sequence value does not cast exactly to the
    table's type (Spark's join coerces them its own way)."""
    typed = _typed_batch(keys, sequence, batch)
    if typed is None:
        return None
    return KeysToDrop(tuple(k.name for k in keys), typed, tuple(s.name for s in sequence))


def _typed_batch(
    keys: Sequence[KeyColumn], sequence: Sequence[SequenceColumn], batch: pa.Table
) -> pa.Table | None:
    """``batch``'s keys, delete flag and sequence values, keys and sequence values cast exactly
    to the table's types and named by position; ``None`` when a value does not cast exactly."""
    n = len(keys)
    try:
        columns = [_exact(batch.column(i), k.type) for i, k in enumerate(keys)]
        changes = [_exact(batch.column(n + 1 + i), s.type) for i, s in enumerate(sequence)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    return pa.table(
        [*columns, batch.column(n), *changes],
        names=[
            *(f"__sparksink_key_{i}__" for i in range(n)),
            _DELETE,
            *(_CHANGE.format(i) for i in range(len(sequence))),
        ],
    )


def _keys_of(
    filesystem: Any,
    location: TableLocation,
    keys: Sequence[KeyColumn],
    sequence: Sequence[SequenceColumn],
    index: int,
    candidate: Candidate,
) -> pa.Table | None:
    """The key and sequence columns of one candidate, typed as the table and named by position,
    with its index and each row's index in the file; ``None`` if a value does not cast
    exactly."""
    data = [k.file_name for k in keys if not k.partition]
    with filesystem.open(location.path(candidate.path), "rb") as handle:
        parquet = pq.ParquetFile(handle, coerce_int96_timestamp_unit="us")
        in_file = set(parquet.schema_arrow.names)
        if not all(name in in_file for name in data):
            return pa.table({})  # a key column added after this file was written: all NULL
        stored = [s.file_name for s in sequence if s.file_name in in_file]
        read = parquet.read(columns=[*data, *stored], use_threads=False)
    positions = pa.array(np.arange(read.num_rows, dtype=np.int64))
    live = None if candidate.deleted is None else keep_mask(candidate.deleted, 0, read.num_rows)
    if live is not None:
        read = read.filter(pa.array(live))
        positions = positions.filter(pa.array(live))
    rows = read.num_rows
    columns = []
    try:
        for k, value in zip(keys, candidate.partition_values, strict=True):
            if k.partition:
                columns.append(pa.repeat(pa.scalar(value, k.type), rows))
            else:
                columns.append(_exact(read.column(k.file_name), k.type))
        for s in sequence:  # a column added after the file was written: NULL, the oldest
            found = s.file_name in stored
            columns.append(
                _exact(read.column(s.file_name), s.type) if found else pa.nulls(rows, s.type)
            )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None
    columns.append(pa.repeat(pa.scalar(index, pa.int32()), rows))
    columns.append(positions)
    names = [
        *(f"__sparksink_key_{i}__" for i in range(len(keys))),
        *(_STORED.format(i) for i in range(len(sequence))),
        _FILE,
        _ROW,
    ]
    return pa.table(columns, names=names)


def _exact(values: pa.ChunkedArray | pa.Array, target: pa.DataType) -> pa.ChunkedArray | pa.Array:
    """``values`` as ``target``, refusing any cast that would change a value (a timestamp's
    time zone is only its display)."""
    if values.type == target:
        return values
    return pc.cast(values, target, safe=True)
