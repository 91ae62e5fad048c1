"""Partition pruning and statistics-based file skipping for reads of a Delta table.

Filters arrive as :class:`Predicate` s (the AND of them must hold for a row to be returned);
:class:`FilePruner` decides, per file of the snapshot, whether any row of the file can satisfy
all of them. A file is dropped only when that is impossible:

* on a partition column every row of the file has the same value, so a predicate is evaluated
  exactly (SQL three-valued logic: a file whose value makes it false or null is dropped);
* on a data column only the file's statistics are known, and they are trusted only as far as
  every Delta writer keeps them: a missing bound, a null or NaN bound, a type that does not
  match the filter's value, or a column without statistics keeps the file. String maxima are
  trusted only up to their last character (writers truncate long strings and may append a
  tie-breaker), timestamp maxima only up to a millisecond above (delta-spark writes
  milliseconds), and a float column's maximum never bounds anything (Spark sorts NaN above
  every number and writers leave NaN out of the bounds).

A predicate on partition columns only, with a value of the column's exact type, is *exact*
(:func:`is_exact`): the files kept satisfy it on every row, so the engine need not evaluate it
again. Every other predicate only narrows the files; the engine must still apply it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from committers.delta.table._rules import TableShape

__all__ = ["FilePruner", "Op", "Predicate", "evaluate", "is_exact"]

Op = Literal[
    "eq",
    "eq_null_safe",
    "lt",
    "le",
    "gt",
    "ge",
    "in",
    "is_null",
    "is_not_null",
    "starts_with",
    "ends_with",
    "contains",
]
_COMPARISONS = ("eq", "eq_null_safe", "lt", "le", "gt", "ge")
_INTEGERS = ("long", "integer", "short", "byte")
_MAX_TIMESTAMP_SLACK = dt.timedelta(milliseconds=1)


@dataclass(frozen=True)
class Predicate:
    """One filter on one top-level column.

    Attributes:
        column: the column's (logical) name.
        op: the comparison.
        value: the literal (a tuple for ``in``; unused by ``is_null`` / ``is_not_null``).
        negated: the predicate is ``NOT (...)``.
    """

    column: str
    op: Op
    value: Any = None
    negated: bool = False

    def __str__(self) -> str:
        inner = f"{self.column} {self.op}" + ("" if self.value is None else f" {self.value!r}")
        return f"NOT ({inner})" if self.negated else inner


def _kind(delta_type: object) -> str | None:
    """How values of a Delta type compare, or None when they are not compared here."""
    if not isinstance(delta_type, str):
        return None
    if delta_type in _INTEGERS:
        return "int"
    if delta_type in ("float", "double"):
        return "float"
    if delta_type.startswith("decimal"):
        return "decimal"
    if delta_type in ("string", "date", "timestamp", "timestamp_ntz", "boolean"):
        return delta_type
    return None


def _fits(kind: str, value: object) -> bool:
    """Whether ``value`` (a filter literal or a statistic) is a value of ``kind``."""
    if value is None:
        return False
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "decimal":
        return isinstance(value, (decimal.Decimal, int)) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "date":
        return isinstance(value, dt.date) and not isinstance(value, dt.datetime)
    if kind == "timestamp":
        return isinstance(value, dt.datetime) and value.tzinfo is not None
    if kind == "timestamp_ntz":
        return isinstance(value, dt.datetime) and value.tzinfo is None
    return False


# Kinds whose exact evaluation on partition values is the engine's (Spark's) own semantics.
_EXACT_KINDS = frozenset({"int", "string", "boolean", "date", "decimal"})


def _literals(predicate: Predicate) -> list[Any]:
    if predicate.op in ("is_null", "is_not_null"):
        return []
    if predicate.op == "in":
        return list(predicate.value) if isinstance(predicate.value, (tuple, list)) else [None]
    return [predicate.value]


def is_exact(predicate: Predicate, shape: TableShape) -> bool:
    """Whether :class:`FilePruner` applies ``predicate`` exactly: it is on a partition column
    whose type compares the same way here as in Spark (integers, strings, booleans, dates,
    decimals), and every literal is a value of that type (``in`` may also list null)."""
    name = _resolve(predicate.column, shape)
    if name is None or name not in shape.partition_by:
        return False
    kind = _kind(shape.schema.field(name).type)
    if kind not in _EXACT_KINDS:
        return False
    if predicate.op in ("starts_with", "ends_with", "contains") and kind != "string":
        return False
    literals = _literals(predicate)
    if predicate.op == "in":
        literals = [v for v in literals if v is not None]
        if not literals:
            return False
    if predicate.op == "eq_null_safe" and literals == [None]:
        return True
    return all(_fits(kind, v) for v in literals)


def _resolve(column: str, shape: TableShape) -> str | None:
    names = shape.schema.names
    if column in names:
        return column
    folded = [n for n in names if n.lower() == column.lower()]
    return folded[0] if len(folded) == 1 else None


def _compare(a: Any, b: Any) -> int:
    """Spark's ordering: NaN equals NaN and sorts above every other number."""
    a_nan = isinstance(a, float) and math.isnan(a)
    b_nan = isinstance(b, float) and math.isnan(b)
    if a_nan or b_nan:
        return 0 if a_nan and b_nan else (1 if a_nan else -1)
    return 0 if a == b else (-1 if a < b else 1)


def evaluate(predicate: Predicate, value: Any) -> bool | None:
    """The predicate on one value, in SQL three-valued logic (None = null).

    Raises:
        TypeError: the value and the literal cannot be compared.
    """
    op, literal = predicate.op, predicate.value
    result: bool | None
    if op == "is_null":
        result = value is None
    elif op == "is_not_null":
        result = value is not None
    elif op == "eq_null_safe":
        result = (value is None and literal is None) or (
            value is not None and literal is not None and _compare(value, literal) == 0
        )
    elif value is None or (op != "in" and literal is None):
        result = None
    elif op == "in":
        hits = [_compare(value, v) == 0 for v in literal if v is not None]
        result = True if any(hits) else (None if None in literal else False)
    elif op in ("starts_with", "ends_with", "contains"):
        if not isinstance(value, str) or not isinstance(literal, str):
            raise TypeError("string predicate on a value that is not a string")
        result = {
            "starts_with": value.startswith,
            "ends_with": value.endswith,
            "contains": value.__contains__,
        }[op](literal)
    else:
        order = _compare(value, literal)
        result = {
            "eq": order == 0,
            "lt": order < 0,
            "le": order <= 0,
            "gt": order > 0,
            "ge": order >= 0,
        }[op]
    if predicate.negated and result is not None:
        return not result
    return result


@dataclass(frozen=True)
class _Stats:
    kind: str
    low: Any  # None when unknown
    high: Any
    nulls: int | None
    rows: int | None

    @property
    def all_null(self) -> bool:
        return self.nulls is not None and self.rows is not None and self.nulls >= self.rows

    def usable(self, value: Any) -> bool:
        if not _fits(self.kind, value):
            return False
        return not (isinstance(value, float) and math.isnan(value))

    def all_below(self, value: Any, *, inclusive: bool) -> bool:
        """Every non-null value is below ``value`` (at most ``value`` if ``inclusive``)."""
        high = self.high
        if self.kind == "float" or not self.usable(high):
            return False  # NaN rows sort above every number and are outside the bounds
        if self.kind == "string":
            # Trusted only up to its last character: the true maximum starts with that prefix,
            # so every value is <= prefix or starts with it, and so below any `value` that is
            # above the prefix without starting with it.
            prefix = high[:-1]
            return bool(value > prefix and not value.startswith(prefix))
        if self.kind in ("timestamp", "timestamp_ntz"):
            return bool(value >= high + _MAX_TIMESTAMP_SLACK)  # every value < high + slack
        return bool(value >= high if inclusive else value > high)

    def all_above(self, value: Any, *, inclusive: bool) -> bool:
        """Every non-null value is above ``value`` (at least ``value`` if ``inclusive``).
        Minima are lower bounds for every writer (truncation only lowers them)."""
        low = self.low
        if not self.usable(low):
            return False
        return bool(value <= low if inclusive else value < low)


def _may_match(predicate: Predicate, stats: _Stats) -> bool:
    """False only when no row of the file can satisfy ``predicate`` given ``stats``."""
    op = predicate.op
    if predicate.negated:
        return True  # NOT of a range says nothing about bounds that are not exact
    if op == "is_null":
        return stats.nulls is None or stats.nulls > 0
    if op == "is_not_null":
        return not stats.all_null
    if op == "eq_null_safe" and predicate.value is None:
        return stats.nulls is None or stats.nulls > 0
    if stats.all_null:
        return False  # a comparison with null is never true
    values = _literals(predicate)
    if op == "in":
        values = [v for v in values if v is not None]
        return not values or any(_may_equal(stats, v) for v in values)
    value = values[0]
    if not stats.usable(value):
        return True
    try:
        if op in ("eq", "eq_null_safe"):
            return _may_equal(stats, value)
        if op == "lt":
            return not stats.all_above(value, inclusive=True)
        if op == "le":
            return not stats.all_above(value, inclusive=False)
        if op == "gt":
            return not stats.all_below(value, inclusive=True)
        if op == "ge":
            return not stats.all_below(value, inclusive=False)
        if op == "starts_with" and stats.kind == "string":
            low = stats.low
            if stats.usable(low) and low > value and not low.startswith(value):
                return False  # every value sorts after every string starting with `value`
            return not stats.all_below(value, inclusive=False)
    except TypeError:  # e.g. aware and naive datetimes: keep the file
        return True
    return True


def _may_equal(stats: _Stats, value: Any) -> bool:
    if not stats.usable(value):
        return True
    try:
        if stats.all_above(value, inclusive=False):
            return False
        if stats.kind == "float":
            high = stats.high
            # NaN rows never equal a number, so the maximum bounds equality.
            return not (stats.usable(high) and value > high)
        return not stats.all_below(value, inclusive=False)
    except TypeError:
        return True


@dataclass
class FilePruner:
    """Decides which files of a snapshot to read for a conjunction of predicates.

    Args:
        predicates: all must hold for a row to be returned.
        shape: the table (schema, partition columns).
        column_mapping: statistics are keyed by physical names.

    Attributes:
        files_seen / pruned_by_partition / skipped_by_stats: counters for the log line.
    """

    predicates: Sequence[Predicate]
    shape: TableShape
    column_mapping: bool = False
    files_seen: int = 0
    pruned_by_partition: int = 0
    skipped_by_stats: int = 0
    _plan: list[tuple[Predicate, str, str | None, bool]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for predicate in self.predicates:
            name = _resolve(predicate.column, self.shape)
            if name is None:
                continue  # not a column of the table: the engine deals with it
            column = self.shape.schema.field(name)
            kind = _kind(column.type)
            if kind is None:
                continue
            partition = name in self.shape.partition_by
            stats_name = column.physical_name if self.column_mapping else name
            if not partition and "." in stats_name:
                continue  # flattened stats keys would be ambiguous
            self._plan.append((predicate, name, kind, partition))

    def keep(self, action: Mapping[str, Any]) -> bool:
        """Whether the file of ``action`` (a row of ``get_add_actions(flatten=True)``) may
        hold a row satisfying every predicate.

        Raises:
            ValueError: an exact predicate could not be evaluated on the file's partition
                value (it would otherwise have been wrongly applied).
        """
        self.files_seen += 1
        rows = action.get("num_records")
        for predicate, name, kind, partition in self._plan:
            if partition:
                value = action.get(f"partition.{name}")
                try:
                    result = evaluate(predicate, value)
                except TypeError as err:
                    if is_exact(predicate, self.shape):
                        raise ValueError(
                            f"cannot evaluate {predicate} on partition value {value!r}"
                        ) from err
                    continue
                if result is not True:
                    self.pruned_by_partition += 1
                    return False
                continue
            key = self.shape.stored_name(name) if self.column_mapping else name
            stats = _Stats(
                kind=kind or "",
                low=action.get(f"min.{key}"),
                high=action.get(f"max.{key}"),
                nulls=action.get(f"null_count.{key}"),
                rows=rows,
            )
            if not _may_match(predicate, stats):
                self.skipped_by_stats += 1
                return False
        return True
