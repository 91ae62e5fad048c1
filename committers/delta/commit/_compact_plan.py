"""Compaction's plan: which live files of a snapshot are rewritten together.

Files smaller than the target, with a record count in their stats, are bin-packed per
partition into groups of about the target size (a group of one file is left alone), and
files whose deletion vector deletes more than :data:`PURGE_RATIO` of their rows are rewritten
whatever their size, alone if need be (delta-spark's ``OPTIMIZE`` purges them so).

A file is only planned when its path and partition values can be carried over exactly.
``get_add_actions`` gives each path as the log stores it (URL-encoded), while delta-rs encodes
the path of a ``RemoveAction`` itself: a file is only planned when encoding its decoded path
the way delta-rs does gives back the logged path exactly (otherwise the remove would miss it
and its rows would be doubled), and when the new file can get the log's spelling of its
partition values; other files are left alone, with a warning.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from committers.delta.table._deletion_vectors import DeletionVectorDescriptor
from committers.delta.table._schema import HIVE_NULL, serialize_partition_value
from committers.delta.table._table import delta_rs_path
from framework.errors import ConfigurationError

__all__ = [
    "MIN_TARGET_FILE_SIZE",
    "PURGE_RATIO",
    "CompactionFile",
    "CompactionGroup",
    "PartitionFilter",
    "bin_pack",
    "check_partition_filter",
    "check_target_file_size",
    "plan_groups",
]

log = logging.getLogger("committers.delta")

#: Smallest ``target_file_size`` accepted: below it compaction would only make small files.
MIN_TARGET_FILE_SIZE = 1024 * 1024
#: delta-rs partition filters: ``[("day", "=", "2026-11-21"), ("region", "in", ["eu", "us"])]``
#: (a conjunction), or a list of such lists (a disjunction of conjunctions).
PartitionFilter = Sequence[Any]

# Hadoop expands these in the paths Spark is given to read: such files are left alone.
_GLOB_CHARACTERS = frozenset("{}[]*?\\")


@dataclass(frozen=True)
class CompactionFile:
    """A live file of the snapshot, as the log names it."""

    logged_path: str  # as the log stores it (URL-encoded): the key of liveness checks
    path: str  # decoded, relative to the table root: what is read, and what a remove names
    size: int
    records: int  # rows the file holds in this version: its deletion vector's are not counted
    partition: tuple[str | None, ...]  # as the log spells the values, in partition order
    deletion_vector: DeletionVectorDescriptor | None = None


@dataclass(frozen=True)
class CompactionGroup:
    partition: tuple[str | None, ...]
    files: tuple[CompactionFile, ...]

    @property
    def records(self) -> int:
        return sum(f.records for f in self.files)


def plan_groups(
    table: DeltaTable,
    partition_by: Sequence[str],
    filters: list[Any] | None,
    target: int,
    uri: str,
    small_below: int,
    vectors: dict[str, DeletionVectorDescriptor],
) -> list[CompactionGroup]:
    """Groups of files of one partition, about ``target`` bytes each: files under
    ``small_below`` bytes, two or more to a group, and files whose deletion vector deletes
    more than :data:`PURGE_RATIO` of their rows, alone if need be (rewritten without the
    deleted rows, as delta-spark's OPTIMIZE purges them)."""
    actions = pa.table(table.get_add_actions(flatten=False))
    if actions.num_rows == 0:
        return []
    spellings = _PartitionSpellings(table, partition_by, actions)
    allowed: set[tuple[str | None, ...]] | None = None
    if filters is not None:
        try:
            chosen = table.partitions(file_pruning_predicate=filters)
        except (ValueError, TypeError, DeltaError) as err:
            raise ConfigurationError(f"partition_filter {filters!r} is invalid: {err}") from err
        allowed = {tuple(p.get(c) for c in partition_by) for p in chosen}
    paths = actions.column("path").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    records = actions.column("num_records").to_pylist()
    small: dict[tuple[str | None, ...], list[CompactionFile]] = defaultdict(list)
    left_alone: list[str] = []
    for index, logged in enumerate(paths):
        decoded = unquote(logged)
        vector = vectors.get(decoded)
        if records[index] is None:
            continue  # no record count to check the rewrite against
        if sizes[index] >= small_below and not _worth_purging(vector, records[index]):
            continue
        partition = spellings.of(index, decoded)
        if allowed is not None and (partition is None or partition not in allowed):
            if partition is None:
                left_alone.append(logged)
            continue
        if (
            partition is None
            or delta_rs_path(decoded) != logged  # a remove would not match it
            or "://" in decoded
            or decoded.startswith("/")  # absolute: not a file of this table's directory
            or _GLOB_CHARACTERS & set(decoded)
        ):
            left_alone.append(logged)
            continue
        live = records[index] - (vector.cardinality if vector else 0)
        small[partition].append(
            CompactionFile(logged, decoded, sizes[index], live, partition, vector)
        )
    if left_alone:
        log.warning(
            "compaction of %s leaves %d small files alone: their path or partition values "
            "cannot be carried over exactly (e.g. %s)",
            uri,
            len(left_alone),
            left_alone[:3],
        )
    groups = []
    for partition, files in small.items():
        groups.extend(bin_pack(partition, files, target))
    return groups


def bin_pack(
    partition: tuple[str | None, ...], files: Iterable[CompactionFile], target: int
) -> list[CompactionGroup]:
    """Next-fit over the files by increasing size; single-file bins are dropped unless their
    file is to be purged."""
    bins: list[list[CompactionFile]] = []
    current: list[CompactionFile] = []
    filled = 0
    for f in sorted(files, key=lambda f: (f.size, f.path)):
        if current and filled + f.size > target:
            bins.append(current)
            current, filled = [], 0
        current.append(f)
        filled += f.size
    if current:
        bins.append(current)
    return [
        CompactionGroup(partition, tuple(b)) for b in bins if len(b) > 1 or any(map(_purges, b))
    ]


#: A file whose deletion vector deletes more than this share of its rows is rewritten by a
#: compaction whatever its size (delta-spark's ``optimize.maxDeletedRowsRatio``).
PURGE_RATIO = 0.05


def _worth_purging(vector: DeletionVectorDescriptor | None, records: int) -> bool:
    """Whether ``vector`` deletes more than :data:`PURGE_RATIO` of a file of ``records``
    rows (its physical count)."""
    return vector is not None and vector.cardinality > PURGE_RATIO * max(records, 1)


def _purges(file: CompactionFile) -> bool:
    vector = file.deletion_vector
    return _worth_purging(vector, file.records + (vector.cardinality if vector else 0))


class _PartitionSpellings:
    """Each file's partition values as the log spells them.

    delta-rs gives a file's partition values typed (``get_add_actions``) and the spellings
    in the log only per partition (``partitions()``). A file gets the spelling whose value
    equals its typed value when exactly one spelling of that value exists and, where the
    file sits under Hive directories (``name=value``), the directories spell the same. When
    the log holds the value in several spellings (a timestamp without a zone, as delta-rs
    and older versions of this sink log it, beside one with its ``Z``), the file gets the
    sink's own spelling if it is one of them, so that the partition compacts into one file.
    Otherwise ``None``: the file is left alone rather than given another spelling.
    """

    def __init__(self, table: DeltaTable, partition_by: Sequence[str], actions: pa.Table):
        self._columns = tuple(partition_by)
        self._typed: list[tuple[Any, ...]] = []
        self._by_value: dict[tuple[Any, ...], list[tuple[str | None, ...]]] = defaultdict(list)
        if not self._columns:
            return
        struct = actions.column("partition").combine_chunks()
        arrays = [struct.field(name) for name in self._columns]
        self._types = [array.type for array in arrays]
        self._typed = list(
            zip(
                *[
                    [_normalized(v, t) for v in array.to_pylist()]
                    for array, t in zip(arrays, self._types, strict=True)
                ],
                strict=True,
            )
        )
        for spelled in table.partitions():
            values = tuple(spelled.get(name) for name in self._columns)
            parsed = self._parse(values)
            if parsed is not None:
                self._by_value[parsed].append(values)

    def _parse(self, values: tuple[str | None, ...]) -> tuple[Any, ...] | None:
        parsed: list[Any] = []
        for value, t in zip(values, self._types, strict=True):
            if value is None:
                parsed.append(None)
                continue
            if value in ("", HIVE_NULL):
                return None  # Spark's directories cannot carry it back
            try:
                parsed.append(_normalized(_cast(value, t), t))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, TypeError):
                return None
        return tuple(parsed)

    def of(self, index: int, decoded_path: str) -> tuple[str | None, ...] | None:
        if not self._columns:
            return ()
        typed = self._typed[index]
        spellings = self._by_value.get(typed, [])
        hinted = self._hive_directories(decoded_path)
        if hinted is not None and hinted not in spellings:
            return None
        if len(spellings) == 1:
            return spellings[0]
        ours = tuple(
            serialize_partition_value(pa.scalar(value, type=t).as_py())
            for value, t in zip(typed, self._types, strict=True)
        )
        return ours if ours in spellings else None

    def _hive_directories(self, decoded_path: str) -> tuple[str | None, ...] | None:
        directories = decoded_path.split("/")[:-1][-len(self._columns) :]
        if len(directories) != len(self._columns):
            return None
        values: list[str | None] = []
        for directory, column in zip(directories, self._columns, strict=True):
            name, sep, value = directory.partition("=")
            if not sep or unquote(name) != column:
                return None
            values.append(None if value == HIVE_NULL else unquote(value))
        return tuple(values)


def _cast(value: str, t: pa.DataType) -> pa.Scalar:
    if pa.types.is_timestamp(t):
        try:  # the log's "2026-11-21 10:00:00.000000" is UTC wall-clock time
            return pa.scalar(value).cast(pa.timestamp(t.unit))
        except pa.ArrowInvalid:  # "...T10:00:00.000000Z"
            return pa.scalar(value).cast(pa.timestamp(t.unit, "UTC"))
    return pa.scalar(value).cast(t)


def _normalized(value: Any, t: pa.DataType) -> Any:
    """A hashable, comparable form of a typed partition value (instants as integers)."""
    scalar = value if isinstance(value, pa.Scalar) else pa.scalar(value, type=t)
    if pa.types.is_timestamp(scalar.type):
        return scalar.cast(pa.int64()).as_py()
    return scalar.as_py()


# -- checks of the input -------------------------------------------------------------------


def check_target_file_size(target_file_size: object) -> int:
    if (
        not isinstance(target_file_size, int)
        or isinstance(target_file_size, bool)
        or target_file_size < MIN_TARGET_FILE_SIZE
    ):
        raise ConfigurationError(
            f"target_file_size must be an integer of at least {MIN_TARGET_FILE_SIZE} bytes "
            f"(1 MiB), got {target_file_size!r}: compaction packs small files into files of "
            "about this size. Use e.g. target_file_size=128 * 1024 * 1024 (the sink's default)."
        )
    return target_file_size


def _filter_literals(partition_filter: PartitionFilter) -> list[Any]:
    if partition_filter and all(isinstance(c, list) for c in partition_filter):
        return [literal for conjunction in partition_filter for literal in conjunction]
    return list(partition_filter)


def check_partition_filter(
    partition_filter: PartitionFilter | None, partition_by: Sequence[str]
) -> list[Any] | None:
    """The filter as delta-rs takes it, once every column it names is a partition column."""
    if partition_filter is None:
        return None
    if isinstance(partition_filter, (str, bytes)) or not isinstance(partition_filter, Sequence):
        raise ConfigurationError(
            "partition_filter must be a list of (column, op, value) tuples, e.g. "
            f"[('day', '=', '2026-11-21')], got {partition_filter!r}"
        )
    literals = _filter_literals(partition_filter)
    if not literals:
        raise ConfigurationError(
            "partition_filter is empty; pass None to compact every partition, or a list of "
            "(column, op, value) tuples"
        )
    for literal in literals:
        if not isinstance(literal, tuple) or len(literal) != 3:
            raise ConfigurationError(
                "partition_filter must be a list of (column, op, value) tuples (or a list of "
                f"such lists), got the item {literal!r}"
            )
        column = literal[0]
        if column not in partition_by:
            where = (
                f"the table's partition columns are {list(partition_by)}"
                if partition_by
                else "the table is not partitioned (compact it without a partition_filter)"
            )
            raise ConfigurationError(
                f"partition_filter names {column!r}, which is not a partition column: {where}. "
                "Compaction selects whole partitions; filter on partition columns only."
            )
    return list(partition_filter)
