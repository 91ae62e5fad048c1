"""An upsert's candidates: the live files of the snapshot with their key ranges and
deletion vectors, which of them may hold a key of the batch (:class:`BatchKeys`), and the
checks that a file can be read and removed exactly (see :mod:`committers.delta.spark._upsert`,
step 2)."""

from __future__ import annotations

import bisect
import datetime
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable

from committers.delta.spark._upsert_plan import UpsertPlan
from committers.delta.spark._upsert_stored import _LiveFile
from committers.delta.storage._storage import TableLocation
from committers.delta.table._live_vectors import live_adds, vector_of
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._rules import WritePlan
from committers.delta.table._schema import HIVE_NULL
from committers.delta.table._snapshot import reader_features
from committers.delta.table._table import removal_path

__all__ = [
    "PRUNE_KEYS_LIMIT",
    "BatchKeys",
    "check_readable",
    "check_spark_keeps_values",
    "live_files",
]

#: Batches with at most this many distinct keys are pruned key by key (the keys are collected
#: on the driver); larger ones by the overall min/max of each key column.
PRUNE_KEYS_LIMIT = 500_000
_GLOB_CHARACTERS = frozenset("{}[]*?\\")
_STRING_BOUND_CHARS = 32  # a longer string bound may have been truncated by its writer
_TIMESTAMP_SLACK = datetime.timedelta(milliseconds=1)  # writers truncating to milliseconds


class BatchKeys:
    """The batch's keys per key column: sorted distinct values, or only (min, max); and, when
    they were collected, the changes' keys, delete flags and sequence values as Arrow."""

    def __init__(self, columns: list[list[Any]], collected: pa.Table | None) -> None:
        self._columns = columns
        self._exact = collected is not None
        self.collected = collected

    def may_hold(self, f: _LiveFile) -> bool:
        """Whether ``f`` may hold a key of the batch (``True`` when its ranges are unknown)."""
        for values, bounds in zip(self._columns, f.bounds, strict=True):
            if bounds is None:
                continue  # no stats for this column: it may
            lo, hi = bounds
            if lo is None or not values:
                return False  # a null partition value (keys are never null), or no keys
            try:
                if not self._exact:  # values are [min, max]
                    if values[-1] < lo or (hi is not None and values[0] > hi):
                        return False
                    continue
                at = bisect.bisect_left(values, lo)
                if at == len(values) or (hi is not None and values[at] > hi):
                    return False
            except TypeError:  # values Python cannot compare with the bounds: it may
                continue
        return True


def live_files(
    location: TableLocation, plan: WritePlan, upsert: UpsertPlan, table: DeltaTable | None
) -> tuple[list[_LiveFile], pa.Table | None]:
    """Every live file of the snapshot with its key ranges, and the add actions."""
    if table is None:
        return [], None
    actions = pa.table(table.get_add_actions(flatten=False))
    if actions.num_rows == 0:
        return [], actions
    partition_by = set(plan.shape.partition_by)
    per_key: list[list[tuple[Any, Any] | None]] = []
    for name in upsert.table_keys:
        if name in partition_by:
            values = _struct_field(actions, "partition", name)
            assert values is not None
            per_key.append([(v, v) for v in values])
            continue
        # (the log keys stats by physical names under column mapping, as delta-rs shows them)
        lows = _struct_field(actions, "min", plan.shape.stored_name(name))
        highs = _struct_field(actions, "max", plan.shape.stored_name(name))
        if lows is None or highs is None:
            per_key.append([None] * actions.num_rows)
            continue
        per_key.append(
            [
                None if lo is None or hi is None else _widened(lo, hi)
                for lo, hi in zip(lows, highs, strict=True)
            ]
        )
    paths = actions.column("path").to_pylist()
    sizes = actions.column("size_bytes").to_pylist()
    records = actions.column("num_records").to_pylist()
    logged: dict[str, dict[str, Any]] = {}
    if "deletionVectors" in reader_features(table)[1]:  # (its vectors are in the log only)
        logged = live_adds(location, table.version())
    files = []
    for i in range(actions.num_rows):
        path = unquote(paths[i])
        add = logged.get(path, {})
        vector = vector_of(add, path)
        deleted = vector.cardinality if vector is not None else 0
        files.append(
            _LiveFile(
                index=i,
                logged_path=paths[i],
                path=path,
                size=sizes[i],
                records=None if records[i] is None else records[i] - deleted,
                bounds=tuple(column[i] for column in per_key),
                deletion_vector=vector,
                logged_stats=add.get("stats"),
                modification_time=add.get("modificationTime"),
            )
        )
    return files, actions


def check_readable(location: TableLocation, files: list[_LiveFile]) -> None:
    """Every file that may hold a key must be readable by Spark and removable exactly.

    Raises:
        UnsupportedTableFeatureError: naming the first file that is not.
    """
    for f in files:
        if (
            removal_path(f.logged_path) is None
            or "://" in f.path
            or f.path.startswith("/")
            or _GLOB_CHARACTERS & set(f.path)
        ):
            raise UnsupportedTableFeatureError(
                f"mode='upsert' cannot rewrite file {f.logged_path!r} of "
                f"{location.uri}: its logged path is absolute, uses a URL encoding "
                "delta-rs cannot write in a remove, or holds characters Spark would expand "
                "as a pattern. Nothing was committed; rewrite the file with the tool that "
                "wrote it (e.g. delta-rs's optimize.compact())."
            )


def check_spark_keeps_values(
    location: TableLocation, plan: WritePlan, touched: list[_LiveFile], actions: pa.Table
) -> None:
    """Spark's writer can carry every partition value of the touched files over to their
    kept rows: it names the directory of NULL ``__HIVE_DEFAULT_PARTITION__`` and reads
    that name back as NULL, so a string partition value spelled so would turn into NULL.

    Raises:
        UnsupportedTableFeatureError: naming the first file holding such a value.
    """
    strings = [f.name for f in plan.shape.schema.fields if f.type == "string"]
    columns = [c for c in plan.shape.partition_by if c in strings]
    if not columns:
        return
    values = actions.take([f.index for f in touched]).column("partition").combine_chunks()
    for column in columns:
        held = values.field(column).to_pylist()
        if HIVE_NULL in held:
            f = touched[held.index(HIVE_NULL)]
            raise UnsupportedTableFeatureError(
                f"mode='upsert' cannot rewrite file {f.logged_path!r} of "
                f"{location.uri} with Spark's writer: its partition column "
                f"{column!r} holds the string {HIVE_NULL!r}, the directory name Spark's "
                "writer gives NULL, so the rows it keeps would come back as NULL. Nothing "
                "was committed. Use staging='auto' with batches of at most "
                f"{PRUNE_KEYS_LIMIT} keys (Python tasks keep the rows with their value)."
            )


def _struct_field(actions: pa.Table, column: str, name: str) -> list[Any] | None:
    """``actions[column][name]`` as Python values, or ``None`` if the log has no such field."""
    if column not in actions.column_names:
        return None
    struct = actions.column(column).combine_chunks()
    if not pa.types.is_struct(struct.type) or struct.type.get_field_index(name) < 0:
        return None
    values: list[Any] = struct.field(name).to_pylist()
    if struct.null_count:  # a file without stats: every field null
        valid = struct.is_valid().to_pylist()
        values = [v if ok else None for v, ok in zip(values, valid, strict=True)]
    return values


def _widened(lo: Any, hi: Any) -> tuple[Any, Any]:
    """Bounds made safe against writers that truncate them."""
    if isinstance(lo, datetime.datetime) and isinstance(hi, datetime.datetime):
        return lo - _TIMESTAMP_SLACK, hi + _TIMESTAMP_SLACK
    if isinstance(hi, str) and len(hi) >= _STRING_BOUND_CHARS:
        return lo, None
    return lo, hi
