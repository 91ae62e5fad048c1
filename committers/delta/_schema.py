"""Schema rules for Delta tables: what may be written, and how partition values are spelled."""

from __future__ import annotations

import datetime
import decimal
from collections.abc import Callable, Sequence
from typing import Any, Literal

import pyarrow as pa
from deltalake import Schema as DeltaSchema

from framework.errors import SchemaMismatchError, UnsupportedTypeError

__all__ = [
    "SchemaMode",
    "check_partition_columns",
    "merge_schemas",
    "normalize_schema",
    "partition_dir",
    "serialize_partition_value",
]

SchemaMode = Literal["strict", "merge"]

_FIX_HINT = (
    "Cast or select the DataFrame's columns to match the table, write to a new table, "
    "or pass schema_mode='merge' to add new nullable columns."
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
    return str(t)


def merge_schemas(table: pa.Schema, incoming: pa.Schema, mode: SchemaMode) -> pa.Schema:
    """Return the table schema after writing ``incoming`` under ``mode``.

    ``strict``: the incoming columns must equal the table's (same names, same types; a
    non-nullable table column also accepts a nullable input column, whose values are then
    checked per row). ``merge``: additionally, new columns are appended (as nullable) and
    nullable table columns may be absent from the input.

    Raises:
        SchemaMismatchError: listing every difference and how to fix it.
    """
    table_fields = {f.name: f for f in table}
    incoming_fields = {f.name: f for f in incoming}
    problems: list[str] = []
    for name, f in incoming_fields.items():
        existing = table_fields.get(name)
        if existing is None:
            if mode != "merge":
                problems.append(f"column {name!r} ({_type_name(f.type)}) is not in the table")
        elif existing.type != f.type:
            problems.append(
                f"column {name!r} is {_type_name(f.type)} in the input but "
                f"{_type_name(existing.type)} in the table"
            )
    for name, f in table_fields.items():
        if name not in incoming_fields and (mode != "merge" or not f.nullable):
            problems.append(f"table column {name!r} ({_type_name(f.type)}) is missing")
    if problems:
        raise SchemaMismatchError(
            "the input schema does not match the table schema: "
            + "; ".join(problems)
            + ". "
            + _FIX_HINT
        )
    added = [f.with_nullable(True) for n, f in incoming_fields.items() if n not in table_fields]
    return pa.schema(list(table) + added) if added else table


def check_partition_columns(schema: pa.Schema, partition_by: Sequence[str]) -> None:
    """Partition columns must exist and be of a primitive type.

    Raises:
        SchemaMismatchError: a partition column is missing from the input.
        UnsupportedTypeError: a partition column is nested or binary.
    """
    for name in partition_by:
        if name not in schema.names:
            raise SchemaMismatchError(
                f"partition column {name!r} is not in the input (columns: "
                f"{', '.join(schema.names)}). Add the column or change partition_by."
            )
        t = schema.field(name).type
        if pa.types.is_nested(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            raise UnsupportedTypeError(
                f"partition column {name!r} has type {t}; partition columns must be of a "
                "primitive type (string, number, boolean, date, timestamp)."
            )


def serialize_partition_value(value: Any) -> str | None:
    """Spell a partition value the way the Delta protocol records it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime.datetime):
        stamp: datetime.datetime = value
        if stamp.tzinfo is not None:
            stamp = stamp.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return stamp.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, (datetime.date, decimal.Decimal, int, float, str)):
        return str(value)
    if isinstance(value, bytes):
        text: str = value.decode("utf-8", "replace")
        return text
    return str(value)


_HIVE_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_. ")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _hive_escape(text: str) -> str:
    return "".join(c if c in _HIVE_SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in text)


def partition_dir(partition_by: Sequence[str], values: dict[str, str | None]) -> str:
    """Hive-style directory for a partition, e.g. ``day=2026-11-21/k=3``."""
    parts = []
    for name in partition_by:
        value = values[name]
        parts.append(f"{_hive_escape(name)}={HIVE_NULL if value is None else _hive_escape(value)}")
    return "/".join(parts)
