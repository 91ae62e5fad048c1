"""Delta file statistics (``add.stats``), as mainstream writers write them.

Bounds come from the Parquet footer the writer just produced (so they describe exactly the
bytes in the file); null counts and NaN presence come from the Arrow data as it is written
(:meth:`FileStatsCollector.observe`), or from the footer when only the file is known.

Readers skip files with these stats, so a wrong statistic loses rows silently, while a missing
one only costs a scan. The rules, each checked by ``test_delta_stats.py`` against deltalake's
pyarrow dataset and ``QueryBuilder`` and DuckDB's delta extension:

* every column gets a ``nullCount`` (nested objects for structs, keyed by the names the file
  uses, which are the physical names under column mapping); arrays and maps count null
  values of the column itself;
* ``minValues`` and ``maxValues`` name the same columns: deltalake reads a bound missing on one
  side as null and then skips the file. Where a bound cannot be stated (NaN in the column,
  infinities, a date or timestamp outside years 1 to 9999, no footer bounds, a float column
  whose NaN cannot be seen), both objects are left out for the file, as readers treat a file
  without bounds as "scan it"; binary columns, arrays and maps never get bounds;
* strings longer than 32 characters are bounded by a prefix (min) and a prefix plus a
  tie-breaker character (max), as delta-spark does, so selective filters still skip;
* decimals are exact JSON numbers, timestamps are microsecond ISO-8601 (``Z`` for UTC),
  the JSON is UTF-8 (non-BMP text is not turned into surrogate pairs).
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = ["STRING_PREFIX_LENGTH", "FileStatsCollector", "has_min_max_stats"]

STRING_PREFIX_LENGTH = 32  # as delta-spark's dataSkippingStringPrefixLength
_TIE_BREAKER = "\U0010ffff"  # sorts after every character, in UTF-8 byte order too
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_DATE = _EPOCH.date()
# Dates Delta can spell (years 1 to 9999), in days since the epoch.
_MIN_DAYS = (datetime.date.min - _EPOCH_DATE).days
_MAX_DAYS = (datetime.date.max - _EPOCH_DATE).days


class _Unknown(Exception):
    """A bound that cannot be stated: the file gets no bounds at all."""


@dataclass(frozen=True)
class _Leaf:
    """A Parquet leaf column, by its position in the footer."""

    path: tuple[str, ...]  # names from the top-level column down; the stats keys
    arrow_type: pa.DataType
    in_structs_only: bool  # not inside a list or a map: a column of its own in Delta's stats

    @property
    def bounded(self) -> bool:
        t = self.arrow_type
        return self.in_structs_only and not (pa.types.is_binary(t) or pa.types.is_null(t))


def _leaves(
    arrow_type: pa.DataType, path: tuple[str, ...], in_structs_only: bool
) -> Iterator[_Leaf]:
    """The Parquet leaves of a column of ``arrow_type``, in footer order."""
    if pa.types.is_struct(arrow_type):
        for child in arrow_type:
            yield from _leaves(child.type, (*path, child.name), in_structs_only)
    elif pa.types.is_map(arrow_type):
        yield from _leaves(arrow_type.key_type, path, False)
        yield from _leaves(arrow_type.item_type, path, False)
    elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        yield from _leaves(arrow_type.value_type, path, False)
    else:
        yield _Leaf(path, arrow_type, in_structs_only)


class FileStatsCollector:
    """Collects the stats of one Parquet file with Arrow schema ``file_schema``.

    Call :meth:`observe` with every table written to the file (optional), then
    :meth:`to_json` with the file's footer.
    """

    def __init__(self, file_schema: pa.Schema) -> None:
        self._schema = file_schema
        self._leaves = [
            leaf for f in file_schema for leaf in _leaves(f.type, (f.name,), in_structs_only=True)
        ]
        self._null_counts: dict[tuple[str, ...], int] | None = None
        self._has_nan = False
        # A top-level name such as "s.x" next to a struct s with a field x: readers that
        # resolve stats by dotted path could confuse the two, so such files get no bounds.
        dotted = {".".join(leaf.path) for leaf in self._leaves if len(leaf.path) > 1}
        self._ambiguous = any(name in dotted for name in file_schema.names)

    def observe(self, table: pa.Table) -> None:
        """Count the nulls (and note NaN) of rows about to be written to the file."""
        counts = self._null_counts if self._null_counts is not None else {}
        for f, column in zip(self._schema, table.columns, strict=True):
            for chunk in column.chunks:
                self._count(chunk, (f.name,), counts)
        self._null_counts = counts

    def _count(self, array: pa.Array, path: tuple[str, ...], counts: dict[Any, int]) -> None:
        if pa.types.is_struct(array.type):
            # flatten() folds the parent's nulls into each child: Delta counts a field as
            # null wherever one of its parents is.
            for child_field, child in zip(array.type, array.flatten(), strict=True):
                self._count(child, (*path, child_field.name), counts)
            return
        counts[path] = counts.get(path, 0) + array.null_count
        if pa.types.is_floating(array.type) and not self._has_nan:
            self._has_nan = bool(pc.any(pc.is_nan(array)).as_py())

    def to_json(self, footer: pq.FileMetaData) -> str:
        """The ``stats`` JSON of the file whose footer is ``footer``."""
        stats: dict[str, Any] = {"numRecords": footer.num_rows}
        bounds = None if self._ambiguous or self._has_nan else self._bounds(footer)
        if bounds is not None:
            stats["minValues"], stats["maxValues"] = bounds
        stats["nullCount"] = self._null_count_object(footer)
        return _dumps(stats)

    # -- null counts -----------------------------------------------------------------------

    def _null_count_object(self, footer: pq.FileMetaData) -> dict[str, Any]:
        counts: Mapping[tuple[str, ...], int | None]
        if self._null_counts is not None:
            counts = self._null_counts
        else:  # nothing observed: from the footer, which cannot count null arrays or maps
            counts = {
                leaf.path: _footer_null_count(footer, index)
                for index, leaf in enumerate(self._leaves)
                if leaf.in_structs_only
            }
        result: dict[str, Any] = {}
        for path, count in counts.items():
            if count is not None:
                _nest(result, path, count)
        return result

    # -- bounds -----------------------------------------------------------------------------

    def _nan_visible(self, footer: pq.FileMetaData) -> bool:
        """Whether NaN in a float column is known: observed, or shown by the footer's bounds.
        parquet-java (Spark's writer) orders NaN above every number, so its max is NaN when
        one is present; Arrow's writer leaves NaN out of its bounds."""
        return self._null_counts is not None or (footer.created_by or "").startswith("parquet-mr")

    def _bounds(self, footer: pq.FileMetaData) -> tuple[dict[str, Any], dict[str, Any]] | None:
        mins: dict[str, Any] = {}
        maxs: dict[str, Any] = {}
        try:
            for index, leaf in enumerate(self._leaves):
                if not leaf.bounded:
                    continue
                if pa.types.is_floating(leaf.arrow_type) and not self._nan_visible(footer):
                    raise _Unknown
                bound = _leaf_bounds(footer, index, leaf.arrow_type)
                if bound is not None:
                    _nest(mins, leaf.path, bound[0])
                    _nest(maxs, leaf.path, bound[1])
        except _Unknown:
            return None
        return mins, maxs


def _footer_null_count(footer: pq.FileMetaData, index: int) -> int | None:
    total = 0
    for rg in range(footer.num_row_groups):
        stats = footer.row_group(rg).column(index).statistics
        if stats is None or not stats.has_null_count:
            return None
        total += stats.null_count
    return total


def _nest(target: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        target = target.setdefault(name, {})
    target[path[-1]] = value


def _leaf_bounds(footer: pq.FileMetaData, index: int, t: pa.DataType) -> tuple[Any, Any] | None:
    """(min, max) of leaf ``index`` over the whole file, as JSON values; None when every value
    is null. Raises _Unknown when a bound cannot be stated exactly."""
    low: Any = None
    high: Any = None
    for rg in range(footer.num_row_groups):
        column = footer.row_group(rg).column(index)
        stats = column.statistics
        if stats is None:
            raise _Unknown
        if not stats.has_min_max:
            if stats.has_null_count and stats.null_count == column.num_values:
                continue  # only nulls in this row group
            raise _Unknown
        lo, hi = _raw_bound(stats, t, "min"), _raw_bound(stats, t, "max")
        low = lo if low is None or lo < low else low
        high = hi if high is None or hi > high else high
    if low is None:
        return None
    return _json_bound(low, t, is_max=False), _json_bound(high, t, is_max=True)


def _raw_bound(stats: pq.Statistics, t: pa.DataType, side: str) -> Any:
    """A footer bound as a value comparable within its column: dates and timestamps as their
    raw integers (Python cannot represent every year they hold), strings decoded."""
    if pa.types.is_date32(t) or pa.types.is_timestamp(t):
        return getattr(stats, f"{side}_raw")
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        raw = getattr(stats, f"{side}_raw")
        return raw.decode("utf-8") if isinstance(raw, bytes) else raw
    value = getattr(stats, side)
    if isinstance(value, float) and math.isnan(value):
        raise _Unknown  # checked per row group: NaN would vanish from comparisons
    return value


def _json_bound(value: Any, t: pa.DataType, is_max: bool) -> Any:
    if pa.types.is_boolean(t) or pa.types.is_integer(t) or pa.types.is_decimal(t):
        return value
    if pa.types.is_floating(t):
        if math.isinf(value):  # (NaN never gets here: see _raw_bound)
            raise _Unknown
        if value == 0.0:  # Parquet may state either zero; -0.0 and 0.0 hold both
            return 0.0 if is_max else -0.0
        return value
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _string_bound(value, is_max)
    if pa.types.is_date32(t):
        if not _MIN_DAYS <= value <= _MAX_DAYS:
            raise _Unknown
        return (_EPOCH_DATE + datetime.timedelta(days=value)).isoformat()
    if pa.types.is_timestamp(t):
        return _timestamp_bound(value, t, is_max)
    raise _Unknown


def _string_bound(value: str, is_max: bool) -> str:
    if len(value) <= STRING_PREFIX_LENGTH:
        return value
    if not is_max:
        return value[:STRING_PREFIX_LENGTH]  # a prefix sorts before the string
    # prefix + tie-breaker sorts after the string unless the next character is the
    # tie-breaker itself: extend the prefix over those.
    end = STRING_PREFIX_LENGTH
    while end < len(value) and value[end] == _TIE_BREAKER:
        end += 1
    return value if end == len(value) else value[:end] + _TIE_BREAKER


def _timestamp_bound(value: int, t: pa.TimestampType, is_max: bool) -> str:
    """ISO-8601 with microseconds (Delta's precision), rounded outwards when the column is
    finer; ``Z`` for instants (Spark's TIMESTAMP), none for TIMESTAMP_NTZ."""
    if t.unit == "ns":
        micros = -(-value // 1000) if is_max else value // 1000
    else:
        micros = value * {"s": 1_000_000, "ms": 1000, "us": 1}[t.unit]
    try:
        instant = _EPOCH + datetime.timedelta(microseconds=micros)
    except OverflowError:  # outside years 1 to 9999
        raise _Unknown from None
    return instant.isoformat(timespec="microseconds") + ("Z" if t.tz is not None else "")


def _dumps(value: Any) -> str:
    """Compact UTF-8 JSON; decimals as exact numbers (the json module would quote them)."""
    if isinstance(value, dict):
        items = (f"{_dumps(key)}:{_dumps(item)}" for key, item in value.items())
        return "{" + ",".join(items) + "}"
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def has_min_max_stats(t: pa.DataType) -> bool:
    """Whether files get ``minValues``/``maxValues`` for a column of type ``t`` and readers
    skip by them: numbers, strings, dates and timestamps (delta-spark's
    ``SkippingEligibleDataType``, which its clustering columns must be)."""
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_decimal(t)
        or pa.types.is_string(t)
        or pa.types.is_large_string(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )
