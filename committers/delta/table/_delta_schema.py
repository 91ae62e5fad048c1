"""The Delta schema as the log spells it, with what each field's metadata asks of a writer.

delta-rs hands out the schema as Arrow (losing field metadata) or as the log's JSON. The JSON is
what carries the rules (column mapping's physical names and ids, generation expressions,
invariants, identity, defaults), so the sink works from it: :func:`parse_schema` reads it into
small immutable values, and :func:`arrow_type` / :func:`spark_type` spell a Delta type for the
two engines the files pass through.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from deltalake import Schema as DeltaSchema

__all__ = [
    "ArrayType",
    "DeltaField",
    "DeltaType",
    "MapType",
    "StructType",
    "arrow_schema",
    "arrow_type",
    "parse_schema",
    "quote",
    "schema_json",
    "spark_type",
    "without_field_metadata",
]

PHYSICAL_NAME = "delta.columnMapping.physicalName"
COLUMN_ID = "delta.columnMapping.id"
GENERATION_EXPRESSION = "delta.generationExpression"
INVARIANTS = "delta.invariants"
DEFAULT_VALUE = "CURRENT_DEFAULT"
IDENTITY_START = "delta.identity.start"
IDENTITY_STEP = "delta.identity.step"
IDENTITY_HIGH_WATER_MARK = "delta.identity.highWaterMark"
IDENTITY_EXPLICIT_INSERT = "delta.identity.allowExplicitInsert"
PARQUET_FIELD_ID = b"PARQUET:field_id"


@dataclass(frozen=True)
class StructType:
    fields: tuple[DeltaField, ...]

    def field(self, name: str) -> DeltaField:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.fields]


@dataclass(frozen=True)
class ArrayType:
    element: DeltaType
    contains_null: bool


@dataclass(frozen=True)
class MapType:
    key: DeltaType
    value: DeltaType
    value_contains_null: bool


DeltaType = str | StructType | ArrayType | MapType


@dataclass(frozen=True)
class DeltaField:
    """One field of a Delta schema, with its metadata (values as the log has them)."""

    name: str
    type: DeltaType
    nullable: bool
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def physical_name(self) -> str:
        """The name in data files and stats: the column-mapping physical name, if any."""
        return str(self.metadata.get(PHYSICAL_NAME, self.name))

    @property
    def field_id(self) -> int | None:
        value = self.metadata.get(COLUMN_ID)
        return None if value is None else int(value)

    @property
    def generation_expression(self) -> str | None:
        return self.metadata.get(GENERATION_EXPRESSION)

    @property
    def default_expression(self) -> str | None:
        return self.metadata.get(DEFAULT_VALUE)

    @property
    def invariant(self) -> str | None:
        """The SQL of a legacy invariant (``{"expression": {"expression": "x > 3"}}``)."""
        raw = self.metadata.get(INVARIANTS)
        if raw is None:
            return None
        parsed = json.loads(raw) if isinstance(raw, str) else raw
        return str(parsed["expression"]["expression"])

    @property
    def is_identity(self) -> bool:
        return IDENTITY_START in self.metadata or IDENTITY_STEP in self.metadata


def _parse_type(raw: Any) -> DeltaType:
    if isinstance(raw, str):
        return raw
    kind = raw["type"]
    if kind == "struct":
        return StructType(tuple(_parse_field(f) for f in raw["fields"]))
    if kind == "array":
        return ArrayType(_parse_type(raw["elementType"]), bool(raw.get("containsNull", True)))
    if kind == "map":
        return MapType(
            _parse_type(raw["keyType"]),
            _parse_type(raw["valueType"]),
            bool(raw.get("valueContainsNull", True)),
        )
    raise ValueError(f"unknown Delta type {raw!r}")


def _parse_field(raw: Mapping[str, Any]) -> DeltaField:
    return DeltaField(
        name=raw["name"],
        type=_parse_type(raw["type"]),
        nullable=bool(raw.get("nullable", True)),
        metadata=dict(raw.get("metadata") or {}),
    )


def parse_schema(schema_json: str) -> StructType:
    """Read a Delta schema string (``DeltaTable.schema().to_json()`` or ``schemaString``)."""
    parsed = _parse_type(json.loads(schema_json))
    if not isinstance(parsed, StructType):
        raise ValueError("a Delta schema is a struct")
    return parsed


def schema_json(struct: StructType) -> str:
    """The Delta schema string of ``struct``, field metadata included: the inverse of
    :func:`parse_schema`, as a ``metaData`` action's ``schemaString`` holds it."""
    return json.dumps(_raw_type(struct), separators=(",", ":"))


def _raw_type(t: DeltaType) -> Any:
    if isinstance(t, StructType):
        return {
            "type": "struct",
            "fields": [
                {
                    "name": f.name,
                    "type": _raw_type(f.type),
                    "nullable": f.nullable,
                    "metadata": dict(f.metadata),
                }
                for f in t.fields
            ],
        }
    if isinstance(t, ArrayType):
        return {
            "type": "array",
            "elementType": _raw_type(t.element),
            "containsNull": t.contains_null,
        }
    if isinstance(t, MapType):
        return {
            "type": "map",
            "keyType": _raw_type(t.key),
            "valueType": _raw_type(t.value),
            "valueContainsNull": t.value_contains_null,
        }
    return t


def parse_arrow_schema(schema: pa.Schema) -> StructType:
    """The Delta schema delta-rs makes of an Arrow schema."""
    return parse_schema(DeltaSchema.from_arrow(schema).to_json())


def walk(
    struct: StructType, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], DeltaField]]:
    """Every field of ``struct`` and of its nested structs (not inside arrays or maps), with
    its logical path, parents first."""
    for f in struct.fields:
        yield (*path, f.name), f
        if isinstance(f.type, StructType):
            yield from walk(f.type, (*path, f.name))


_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_PRIMITIVE_ARROW = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_PRIMITIVE_SPARK = {
    "string": "STRING",
    "long": "BIGINT",
    "integer": "INT",
    "short": "SMALLINT",
    "byte": "TINYINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "boolean": "BOOLEAN",
    "binary": "BINARY",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "timestamp_ntz": "TIMESTAMP_NTZ",
}


def _field_name(f: DeltaField, physical: bool) -> str:
    return f.physical_name if physical else f.name


def arrow_field(f: DeltaField, *, physical: bool, nullable: bool = True) -> pa.Field:
    """The Arrow field of ``f``; with ``physical``, named by its physical name and carrying its
    Parquet field id, if any.

    Top-level fields are nullable (as Spark writes them; NOT NULL is enforced on the values).
    Struct fields nested in structs keep the table's nullability, as delta-rs writes them:
    deltalake's pyarrow reader cannot read a nullable file field into a NOT NULL struct field
    once a parent struct is null.
    """
    metadata = None
    if physical and f.field_id is not None:
        metadata = {PARQUET_FIELD_ID: str(f.field_id).encode()}
    arrow = arrow_type(f.type, physical=physical)
    return pa.field(_field_name(f, physical), arrow, nullable, metadata)


def arrow_type(t: DeltaType, *, physical: bool, in_struct: bool = True) -> pa.DataType:
    """The Arrow type of a Delta type, as the sink writes it to Parquet (see
    :func:`arrow_field`; below an array or a map every field is nullable)."""
    if isinstance(t, StructType):
        return pa.struct(
            [
                arrow_field(f, physical=physical, nullable=f.nullable)
                if in_struct
                else _nullable_field(f, physical)
                for f in t.fields
            ]
        )
    if isinstance(t, ArrayType):
        element = arrow_type(t.element, physical=physical, in_struct=False)
        return pa.list_(pa.field("element", element))
    if isinstance(t, MapType):
        return pa.map_(
            arrow_type(t.key, physical=physical, in_struct=False),
            pa.field("value", arrow_type(t.value, physical=physical, in_struct=False)),
        )
    decimal = _DECIMAL.match(t)
    if decimal:
        return pa.decimal128(int(decimal.group(1)), int(decimal.group(2)))
    try:
        return _PRIMITIVE_ARROW[t]
    except KeyError:
        raise ValueError(f"the sink cannot write Delta type {t!r}") from None


def _nullable_field(f: DeltaField, physical: bool) -> pa.Field:
    field = arrow_field(f, physical=physical)
    return field.with_type(arrow_type(f.type, physical=physical, in_struct=False))


def arrow_schema(
    struct: StructType, *, physical: bool, skip: frozenset[str] = frozenset()
) -> pa.Schema:
    """The Arrow schema of the top-level fields of ``struct`` not named in ``skip``."""
    return pa.schema(
        [arrow_field(f, physical=physical) for f in struct.fields if f.name not in skip]
    )


def quote(name: str) -> str:
    """A Spark SQL identifier for ``name``, whatever characters it holds."""
    return "`" + name.replace("`", "``") + "`"


def spark_type(t: DeltaType, *, physical: bool) -> str:
    """The Spark SQL spelling of a Delta type (nested fields by physical name if asked)."""
    if isinstance(t, StructType):
        inner = ", ".join(
            f"{quote(_field_name(f, physical))}: {spark_type(f.type, physical=physical)}"
            for f in t.fields
        )
        return f"STRUCT<{inner}>"
    if isinstance(t, ArrayType):
        return f"ARRAY<{spark_type(t.element, physical=physical)}>"
    if isinstance(t, MapType):
        key = spark_type(t.key, physical=physical)
        return f"MAP<{key}, {spark_type(t.value, physical=physical)}>"
    decimal = _DECIMAL.match(t)
    if decimal:
        return f"DECIMAL({decimal.group(1)}, {decimal.group(2)})"
    try:
        return _PRIMITIVE_SPARK[t]
    except KeyError:
        raise ValueError(f"the sink cannot write Delta type {t!r}") from None


def without_field_metadata(raw: Any) -> Any:
    """A parsed Delta schema JSON without field metadata (column mapping ids, generation
    expressions, comments): what a reader sees of the schema."""
    if isinstance(raw, dict):
        out = {k: without_field_metadata(v) for k, v in raw.items()}
        if "metadata" in out and "name" in out:
            out["metadata"] = {}
        return out
    if isinstance(raw, list):
        return [without_field_metadata(v) for v in raw]
    return raw
