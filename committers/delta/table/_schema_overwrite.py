"""What an overwrite that replaces the table's schema (``schema_mode="overwrite"``, delta-spark's
``overwriteSchema``) makes of the table: the input's schema and the write's partitioning, with
the table's identity, configuration and features kept, committed in one transaction with the
rows (see ``commit/_committer.py``).

As delta-spark's ``overwriteSchema``:

- every column is the input's, nullable; what the old schema said of its columns (generation
  expressions, identity, defaults, invariants, comments) goes with it;
- the partition columns are the write's ``partition_by`` (none when not given);
- the table's properties stay, CHECK constraints included: they must name columns of the new
  schema and hold on the new rows;
- under column mapping, every column gets a new id past ``delta.columnMapping.maxColumnId``
  and a new physical name, so no old file's data is ever read as a new column's.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema

from committers.delta.table._delta_schema import (
    COLUMN_ID,
    PHYSICAL_NAME,
    parse_schema,
    schema_json,
)
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._rules import TableShape, new_table_schema
from framework.errors import SchemaMismatchError

__all__ = ["MAX_COLUMN_ID", "metadata_action", "replaced_shape"]

MAX_COLUMN_ID = "delta.columnMapping.maxColumnId"
_PART = r"(?:`(?:[^`]|``)+`|[A-Za-z_][A-Za-z0-9_]*)"
#: A column reference's first part (``a`` of ``a.b.c``), not inside a number (``1e5``).
_REFERENCE = re.compile(rf"(?<![\w.`])({_PART})(?:\s*\.\s*{_PART})*(\s*\()?")
#: Words of Spark SQL a CHECK constraint may hold besides column names.
# fmt: off
_SQL_WORDS = frozenset({
    "and", "or", "not", "is", "null", "in", "between", "like", "rlike", "ilike", "true",
    "false", "case", "when", "then", "else", "end", "cast", "as", "interval", "exists",
    "date", "timestamp", "timestamp_ntz", "int", "integer", "bigint", "smallint", "tinyint",
    "long", "short", "byte", "string", "varchar", "char", "double", "float", "real",
    "boolean", "decimal", "binary",
})
# fmt: on


def replaced_shape(
    table: DeltaTable, input_schema: pa.Schema, partition_by: Sequence[str]
) -> TableShape:
    """``table`` once its schema is replaced by ``input_schema``'s, partitioned by
    ``partition_by``. Under column mapping the table's id seeds the new physical names, so
    planning it again against the same table gives the same shape.

    Raises:
        UnsupportedTableFeatureError: the table is clustered and column-mapped, or clustered
            and ``partition_by`` is given (the clustering columns themselves are checked
            against the new schema by ``commit/_clustering.check_clustering_kept``).
        SchemaMismatchError: a CHECK constraint of the table names a column the new schema
            lacks (delta-spark refuses the same overwrite), or the input needs a feature
            the table's protocol lacks (TIMESTAMP_NTZ).
    """
    existing = TableShape.of_table(table)
    if "clustering" in existing.features and (existing.column_mapping or partition_by):
        why = (
            "it maps columns to physical names, which the new schema's columns get anew while "
            "its clustering names the old ones"
            if existing.column_mapping
            else f"a clustered table cannot also be partitioned (partition_by={list(partition_by)})"
        )
        raise UnsupportedTableFeatureError(
            f"{table.table_uri} is clustered (liquid clustering), and the sink cannot replace "
            f"its schema here: {why}. Nothing was written. Overwrite keeping the schema, or "
            "replace it with delta-spark (CREATE OR REPLACE TABLE ... CLUSTER BY ...)."
        )
    raw = json.loads(DeltaSchema.from_arrow(new_table_schema(input_schema)).to_json())
    if '"timestamp_ntz"' in json.dumps(raw) and "timestampNtz" not in existing.features:
        raise SchemaMismatchError(
            "the input has TIMESTAMP_NTZ columns (Arrow timestamps without a time zone), which "
            "the table's protocol does not allow, and the sink does not upgrade a protocol "
            "while replacing the schema. Enable the feature first (ALTER TABLE ... SET "
            "TBLPROPERTIES ('delta.feature.timestampNtz' = 'supported')), or give the "
            "timestamps a time zone. Nothing was written."
        )
    configuration = dict(existing.configuration)
    if existing.column_mapping:
        next_id = int(configuration.get(MAX_COLUMN_ID, "0"))
        next_id = _assign_column_mapping(raw, next_id, str(table.metadata().id))
        configuration[MAX_COLUMN_ID] = str(next_id)
    shape = TableShape(
        schema=parse_schema(json.dumps(raw)),
        partition_by=tuple(partition_by),
        features=existing.features,
        configuration=tuple(sorted(configuration.items())),
    )
    _check_constraints_resolve(shape)
    return shape


def _assign_column_mapping(raw: Any, last_id: int, table_id: str) -> int:
    """Give every struct field in ``raw`` (a parsed schema, nested fields included) the next
    column id and a physical name derived from the table's id and that column id; returns the
    last id given."""
    if isinstance(raw, Mapping):
        kind = raw.get("type")
        if kind == "struct":
            for f in raw["fields"]:
                last_id += 1
                metadata = f.setdefault("metadata", {})
                metadata[COLUMN_ID] = last_id
                metadata[PHYSICAL_NAME] = f"col-{uuid.uuid5(uuid.UUID(table_id), str(last_id))}"
                last_id = _assign_column_mapping(f["type"], last_id, table_id)
        elif kind == "array":
            last_id = _assign_column_mapping(raw["elementType"], last_id, table_id)
        elif kind == "map":
            last_id = _assign_column_mapping(raw["keyType"], last_id, table_id)
            last_id = _assign_column_mapping(raw["valueType"], last_id, table_id)
    return last_id


def _check_constraints_resolve(shape: TableShape) -> None:
    """Every column a CHECK constraint names is a column of the new schema.

    Raises:
        SchemaMismatchError: one is not.
    """
    known = {name.lower() for name in shape.schema.names} | _SQL_WORDS
    for name, expression in shape.constraints:
        unknown = sorted(
            {
                _unquoted(first)
                for first, call in _REFERENCE.findall(_without_literals(expression))
                if not call and _unquoted(first).lower() not in known
            }
        )
        if unknown:
            raise SchemaMismatchError(
                f"the table's CHECK constraint {name!r} ({expression}) names {unknown}, which "
                "the new schema does not have, so the overwrite cannot replace the schema. "
                "Keep those columns in the input, or drop the constraint first (ALTER TABLE "
                f"... DROP CONSTRAINT {name}). Nothing was written."
            )


def _without_literals(expression: str) -> str:
    return re.sub(r"'(?:[^'\\]|\\.|'')*'", "''", expression)


def _unquoted(part: str) -> str:
    return part[1:-1].replace("``", "`") if part.startswith("`") else part


def metadata_action(current: Mapping[str, Any], shape: TableShape) -> dict[str, Any]:
    """The ``metaData`` action replacing ``current`` (the table's, as the log spells it):
    its id, name, description, format and creation time kept; schema, partition columns and
    configuration (``maxColumnId`` under column mapping) from ``shape``."""
    return {
        "id": current["id"],
        **({"name": current["name"]} if current.get("name") is not None else {}),
        **(
            {"description": current["description"]}
            if current.get("description") is not None
            else {}
        ),
        "format": current.get("format") or {"provider": "parquet", "options": {}},
        "schemaString": schema_json(shape.schema),
        "partitionColumns": list(shape.partition_by),
        "configuration": dict(shape.configuration),
        **(
            {"createdTime": current["createdTime"]}
            if current.get("createdTime") is not None
            else {}
        ),
    }
