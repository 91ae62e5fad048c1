"""Schema rules for Delta tables: what may be written, and how partition values are spelled."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa
from deltalake import Schema as DeltaSchema

from committers.delta.table._delta_schema import parse_arrow_schema, spark_type
from committers.delta.table._type_widening import is_supported_widening
from framework.errors import InvalidSchemaError, SchemaMismatchError, UnsupportedTypeError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_SPELLING",
    "SINK_SPELLING",
    "OptionSpelling",
    "SchemaMode",
    "check_column_names",
    "check_partition_columns",
    "hive_escape",
    "merge_schemas",
    "normalize_schema",
    "nullable_nested",
    "partition_dir",
    "serialize_partition_value",
    "spelled_differently",
]

SchemaMode = Literal["strict", "merge"]


@dataclass(frozen=True)
class OptionSpelling:
    """How a writer's users spell the options an error's fix names: the checks are the same
    whether ``DeltaSink`` or the ``"deltalake"`` format runs them, only the advice differs.

    Attributes:
        merge_schema: the words that ask for the input's new columns to be added.
        partition_by: the name of the partition columns option.
    """

    merge_schema: str
    partition_by: str


#: ``DeltaSink``'s keyword arguments.
SINK_SPELLING = OptionSpelling(merge_schema="pass schema_mode='merge'", partition_by="partition_by")
#: The name both directions of the Spark format register under (``committers.delta.format``).
FORMAT_NAME = "deltalake"
#: The ``"deltalake"`` format's ``.option(...)`` names, as delta-spark spells them.
FORMAT_SPELLING = OptionSpelling(
    merge_schema='set .option("mergeSchema", "true")', partition_by="partitionBy"
)


def _normalize_type(t: pa.DataType) -> pa.DataType:
    """One spelling per Delta type: large variants and session time zones do not matter."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        # Spark hands over timestamps in the session time zone; the instants are UTC.
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_normalize_field(t.value_field))
    if pa.types.is_struct(t):
        return pa.struct([_normalize_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(_normalize_type(t.key_type), _normalize_field(t.item_field))
    return t


def _normalize_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, _normalize_type(f.type), nullable=f.nullable)


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """Normalise an Arrow schema and prove Delta can store it.

    Raises:
        UnsupportedTypeError: a column has a type Delta cannot store.
    """
    normalized = pa.schema([_normalize_field(f) for f in schema])
    for f in normalized:
        try:
            if _has_type(f.type, pa.types.is_null):
                raise TypeError("Delta has no type for a column that is always null")
            DeltaSchema.from_arrow(pa.schema([f]))
        except Exception as err:
            raise UnsupportedTypeError(
                f"column {f.name!r} has type {f.type}, which a Delta table cannot store. "
                "Cast it to a supported type (numbers, string, binary, boolean, date, "
                "timestamp, decimal, array, map, struct) before writing."
            ) from err
    return normalized


def _has_type(t: pa.DataType, predicate: Callable[[pa.DataType], bool]) -> bool:
    if predicate(t):
        return True
    if pa.types.is_struct(t):
        return any(_has_type(t.field(i).type, predicate) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _has_type(t.value_type, predicate)
    if pa.types.is_map(t):
        return _has_type(t.key_type, predicate) or _has_type(t.item_type, predicate)
    return False


def _type_name(t: pa.DataType) -> str:
    """``t`` in Spark SQL's words (``BIGINT``, ``DECIMAL(10, 2)``), as Delta users know types;
    in Arrow's when Spark has no spelling for it."""
    try:
        delta = parse_arrow_schema(pa.schema([pa.field("c", t)]))
        return spark_type(delta.fields[0].type, physical=False)
    except Exception:
        return str(t)


def _map_fields(t: pa.DataType, change: Callable[[pa.Field], pa.Field]) -> pa.DataType:
    """``t`` with ``change`` applied to every field nested in it (struct fields, list elements,
    map values), innermost first; lists become plain lists."""
    if pa.types.is_struct(t):
        return pa.struct([change(f.with_type(_map_fields(f.type, change))) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(change(pa.field("element", _map_fields(t.value_type, change))))
    if pa.types.is_map(t):
        value = change(pa.field("value", _map_fields(t.item_type, change)))
        return pa.map_(_map_fields(t.key_type, change), value)
    return t


def nullable_nested(t: pa.DataType) -> pa.DataType:
    """``t`` with every field nested in it nullable. Types are compared this way (NOT NULL is
    checked on the values, as Delta does), and new tables are created this way (as delta-spark
    creates them from a DataFrame: ``named_struct('x', id)`` does not make ``x`` NOT NULL)."""
    return _map_fields(t, lambda f: f.with_nullable(True))


def _folded(t: pa.DataType) -> pa.DataType:
    """``t`` compared the way Delta compares types: nested fields nullable, names lower-case."""
    return _map_fields(t, lambda f: f.with_name(f.name.lower()).with_nullable(True))


def spelled_differently(source: pa.DataType, target: pa.DataType) -> bool:
    """Whether two types equal under :func:`_folded` spell a nested field name differently
    (``struct<A: int>`` against ``struct<a: int>``), so the input needs a renaming cast."""
    return _names(source) != _names(target)


def _names(t: pa.DataType) -> tuple[object, ...]:
    if pa.types.is_struct(t):
        return tuple((f.name, _names(f.type)) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return (_names(t.value_type),)
    if pa.types.is_map(t):
        return (_names(t.key_type), _names(t.item_type))
    return ()


def _cast_hint(name: str, t: pa.DataType) -> str:
    """How to cast column ``name`` to the Arrow type ``t``, in PySpark."""
    return f"df.withColumn({name!r}, col({name!r}).cast({_type_name(t)!r}))"


def merge_schemas(
    table: pa.Schema,
    incoming: pa.Schema,
    mode: SchemaMode,
    computed: frozenset[str] = frozenset(),
    spelling: OptionSpelling = SINK_SPELLING,
    widening: bool = False,
) -> pa.Schema:
    """Return the table schema after writing ``incoming`` under ``mode``.

    Names match ignoring case, as in Spark and Delta (the table's spelling is kept). Both
    modes: input columns must have the table's types (nullability aside: a NOT NULL column or
    nested field accepts nullable input, whose values are checked per row); a table column
    absent from the input is written as null if it is nullable, or computed if it is in
    ``computed`` (generated columns). ``merge`` additionally appends new input columns (as
    nullable, spelled as in the input), and with ``widening`` (a table that enables type
    widening) takes the input's type for a top-level column whose type it widens as the
    protocol allows (an ``int`` column given ``bigint``, say).

    Raises:
        SchemaMismatchError: listing every difference, each with what fixes it (options named
            as ``spelling`` spells them).
    """
    table_fields = {f.name.lower(): f for f in table}
    incoming_fields = {f.name.lower(): f for f in incoming}
    problems: list[str] = []
    for key, f in incoming_fields.items():
        existing = table_fields.get(key)
        if existing is None:
            if mode != "merge":
                problems.append(
                    f"column {f.name!r} ({_type_name(f.type)}) is not in the table: drop it "
                    f"from the input, or {spelling.merge_schema} to add it to the table"
                )
        elif _folded(existing.type) != _folded(f.type):
            if mode == "merge" and widening and _widens(existing, f):
                continue
            problems.append(
                f"column {f.name!r} is {_type_name(f.type)} in the input but "
                f"{_type_name(existing.type)} in the table: cast it, e.g. "
                f"{_cast_hint(f.name, existing.type)}"
            )
    for key, f in table_fields.items():
        if key not in incoming_fields and not f.nullable and f.name not in computed:
            problems.append(
                f"NOT NULL table column {f.name!r} ({_type_name(f.type)}) is missing from the "
                "input: add it"
            )
    if problems:
        raise SchemaMismatchError(
            "the input does not match the table schema: " + "; ".join(problems) + "."
        )
    added = [f.with_nullable(True) for key, f in incoming_fields.items() if key not in table_fields]
    kept = [
        f.with_type(incoming_fields[f.name.lower()].type)
        if f.name.lower() in incoming_fields
        and _folded(f.type) != _folded(incoming_fields[f.name.lower()].type)
        else f
        for f in table
    ]
    if not added and kept == list(table):
        return table
    return pa.schema(kept + added, metadata=table.metadata)


def _widens(existing: pa.Field, given: pa.Field) -> bool:
    """Whether ``given``'s type widens ``existing``'s as the protocol allows (top level)."""
    try:
        old = parse_arrow_schema(pa.schema([existing])).fields[0].type
        new = parse_arrow_schema(pa.schema([given])).fields[0].type
    except Exception:  # (a type delta-rs has no Delta spelling for)
        return False
    return isinstance(old, str) and isinstance(new, str) and is_supported_widening(old, new)


def check_column_names(schema: pa.Schema) -> None:
    """Names must be unique, ignoring case, at every level (Spark and Delta resolve names
    case-insensitively, so ``a`` and ``A`` would be one column to every reader).

    Raises:
        InvalidSchemaError: naming each collision and where it is.
    """
    problems: list[str] = []

    def visit(fields: list[pa.Field], where: str) -> None:
        seen: dict[str, str] = {}
        for f in fields:
            other = seen.get(f.name.lower())
            if other is None:
                seen[f.name.lower()] = f.name
            elif other == f.name:
                problems.append(f"{where} has the column {f.name!r} twice")
            else:
                problems.append(f"{where} has the columns {other!r} and {f.name!r}")
            t = f.type
            if pa.types.is_struct(t):
                visit([t.field(i) for i in range(t.num_fields)], f"struct {f.name!r}")
            elif pa.types.is_list(t) or pa.types.is_large_list(t):
                visit([t.value_field], f"array {f.name!r}")
            elif pa.types.is_map(t):
                visit([t.key_field, t.item_field], f"map {f.name!r}")

    visit(list(schema), "the input")
    if problems:
        raise InvalidSchemaError(
            "; ".join(problems) + ". Column names must be unique ignoring case (Spark and "
            "Delta resolve them case-insensitively). Rename or drop the duplicates, e.g. with "
            "df.toDF(*new_names) or withColumnRenamed()."
        )


def check_partition_columns(
    schema: pa.Schema, partition_by: Sequence[str], spelling: OptionSpelling = SINK_SPELLING
) -> None:
    """Partition columns must exist, be of a primitive type and leave a data column (errors
    name the option as ``spelling`` does).

    Raises:
        SchemaMismatchError: a partition column is missing from the input.
        UnsupportedTypeError: a partition column is nested or binary.
        InvalidSchemaError: every column is a partition column.
    """
    for name in partition_by:
        if name not in schema.names:
            raise SchemaMismatchError(
                f"partition column {name!r} is not in the input (columns: "
                f"{', '.join(schema.names)}). Add the column or change {spelling.partition_by}."
            )
        t = schema.field(name).type
        if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            raise UnsupportedTypeError(
                f"partition column {name!r} has type {t}; partition columns must be of a "
                "primitive type (string, number, boolean, date, timestamp)."
            )
    if partition_by and set(partition_by) >= set(schema.names):
        raise InvalidSchemaError(
            f"{spelling.partition_by}={list(partition_by)} names every column of the input, "
            "which leaves the data files without a column (Delta refuses that layout). "
            "Partition by fewer columns."
        )


def serialize_partition_value(value: Any) -> str | None:
    """Spell a partition value the way the Delta protocol records it: an aware datetime
    (``timestamp``) as ``2026-11-21T10:00:00.123456Z``, a naive one (``timestamp_ntz``) as
    ``2026-11-21 10:00:00.123456``."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:  # timestamp_ntz: wall-clock time, no zone to name
            return value.isoformat(sep=" ", timespec="microseconds")
        # timestamp: the instant in UTC, ISO 8601 with its "Z", as delta-spark writes it. A
        # spelling without a zone is read in the reader's session time zone by delta-spark.
        utc = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return utc.isoformat(timespec="microseconds") + "Z"
    if isinstance(value, (datetime.date, decimal.Decimal, int, float, str)):
        return str(value)
    if isinstance(value, bytes):
        text: str = value.decode("utf-8", "replace")
        return text
    return str(value)


_HIVE_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_. ")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def hive_escape(text: str) -> str:
    """``text`` as a Hive partition directory spells it (``%XX`` for unsafe characters)."""
    return "".join(c if c in _HIVE_SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def partition_dir(partition_by: Sequence[str], values: dict[str, str | None]) -> str:
    """Hive-style directory for a partition, e.g. ``day=2026-11-21/k=3``."""
    parts = []
    for name in partition_by:
        value = values[name]
        parts.append(f"{hive_escape(name)}={HIVE_NULL if value is None else hive_escape(value)}")
    return "/".join(parts)
