"""Parquet field ids for Spark's Parquet writer (column mapping).

Spark writes a field's id when its ``StructField`` metadata holds ``parquet.field.id``
(``spark.sql.parquet.fieldId.write.enabled``, on by default). Here every column of the files'
schema gets its id (an alias's metadata) and fields nested in structs, arrays and maps get
theirs by a cast to the same type whose nested fields carry them: readers of a table with
column mapping in ``id`` mode resolve columns by id and read a file without them as nulls
(PROTOCOL.md, "Reader Requirements for Column Mapping").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pyarrow as pa

from committers.delta.table._delta_schema import PARQUET_FIELD_ID, quote
from committers.delta.table._rules import SPARK_FIELD_ID

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["with_field_ids"]


def with_field_ids(df: DataFrame, file_schema: pa.Schema) -> DataFrame:
    """``df`` with each column ``file_schema`` (the Parquet files' schema, fields carrying
    ``PARQUET:field_id``) names carrying its id and its nested fields' ids; the other columns
    (partition values) as they are."""
    from pyspark.sql import functions as F

    ids = {f.name: f for f in file_schema if _field_id(f) is not None or _nests_ids(f.type)}
    if not ids:
        return df
    columns = []
    for field in df.schema.fields:
        column = F.col(quote(field.name))
        wanted = ids.get(field.name)
        if wanted is not None:
            if _nests_ids(wanted.type):
                column = column.cast(_spark_type(wanted.type))
            metadata = dict(field.metadata)
            if _field_id(wanted) is not None:
                metadata[SPARK_FIELD_ID] = _field_id(wanted)
            column = column.alias(field.name, metadata=metadata)
        columns.append(column)
    return df.select(*columns)


def _field_id(f: pa.Field) -> int | None:
    raw = (f.metadata or {}).get(PARQUET_FIELD_ID)
    return None if raw is None else int(raw)


def _nests_ids(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(
            _field_id(t.field(i)) is not None or _nests_ids(t.field(i).type)
            for i in range(t.num_fields)
        )
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _nests_ids(t.value_type)
    if pa.types.is_map(t):
        return _nests_ids(t.key_type) or _nests_ids(t.item_type)
    return False


def _spark_type(t: pa.DataType) -> Any:
    """The Spark type of Arrow type ``t``, nested fields nullable (as the plan's casts make
    them) and carrying their field ids."""
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import ArrayType, MapType, StructField, StructType

    if pa.types.is_struct(t):
        fields = []
        for i in range(t.num_fields):
            child = t.field(i)
            child_id = _field_id(child)
            metadata = {} if child_id is None else {SPARK_FIELD_ID: child_id}
            fields.append(StructField(child.name, _spark_type(child.type), True, metadata))
        return StructType(fields)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return ArrayType(_spark_type(t.value_type), True)
    if pa.types.is_map(t):
        return MapType(_spark_type(t.key_type), _spark_type(t.item_type), True)
    return from_arrow_type(t)
