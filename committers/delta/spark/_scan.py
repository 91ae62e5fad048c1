"""Reading a table's data files with Spark's own Parquet scan: the table root's path as the
scan qualifies it (to match each row's ``_metadata.file_path`` to the log's paths), the read
schema (the table's types, so that files lacking a column read null), and groups of files
read as one shuffle partition each (compaction's bin-packed groups)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from committers.delta.read._row_lineage import RowLineage
from committers.delta.spark._deleted_rows import decoded_path, drop_deleted_rows
from committers.delta.table._delta_schema import parse_arrow_schema, quote, spark_type
from committers.delta.table._rules import FileLayout, TableShape
from framework.spark.connector import parquet_files

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "BASE_ROW_ID",
    "DEFAULT_ROW_COMMIT_VERSION",
    "grouped_rows",
    "logical_columns",
    "read_schema",
    "scan_root_path",
    "stable_row_lineage",
]


def scan_root_path(spark: SparkSession, root: str) -> str:
    """The decoded path component of the table root as Spark's file scan qualifies it."""
    session: Any = spark
    path = session._jvm.org.apache.hadoop.fs.Path(root)
    qualified = path.getFileSystem(session._jsc.hadoopConfiguration()).makeQualified(path)
    return str(qualified.toUri().getPath()).rstrip("/")


def read_schema(layout: FileLayout) -> str:
    """Spark DDL of the data columns (the table's types; files lacking a column read null)."""
    fields = parse_arrow_schema(layout.file_schema).fields
    return ", ".join(f"{quote(f.name)} {spark_type(f.type, physical=False)}" for f in fields)


def logical_columns(shape: TableShape, columns: Sequence[str] | None = None) -> list[Column]:
    """The data columns (or those of ``columns``, in that order) of a scan of a table of
    ``shape`` read with :func:`read_schema`, named and typed as the table's columns: under
    column mapping the files' physical names (nested ones too) become the table's names."""
    from pyspark.sql import functions as F

    if columns is None:
        partitions = set(shape.partition_by)
        data = [f for f in shape.schema.fields if f.name not in partitions]
    else:
        fields = {f.name: f for f in shape.schema.fields}
        data = [fields[c] for c in columns]
    if not shape.column_mapping:
        return [F.col(quote(f.name)) for f in data]
    return [
        F.col(quote(f.physical_name)).cast(spark_type(f.type, physical=False)).alias(f.name)
        for f in data
    ]


#: The columns ``grouped_rows`` joins each row's file to its group by.
_FILE = "__sink_compaction_file__"
_GROUP = "__sink_compaction_group__"
_ROW_INDEX = "__sink_compaction_row_index__"


def grouped_rows(
    spark: SparkSession,
    root: str,
    root_path: str,
    layout: FileLayout,
    groups: Sequence[tuple[Sequence[str], tuple[str | None, ...]]],
    deleted: Mapping[str, np.ndarray] | None = None,
    cluster_by: Sequence[str] = (),
    lineage: RowLineage | None = None,
) -> DataFrame:
    """The rows of each group's files (paths relative to ``root``) with the group's partition
    values, one shuffle partition per group, in the columns ``layout`` writes, without the
    rows ``deleted`` (path -> sorted row indexes its deletion vector deletes) names.
    ``root_path`` is :func:`scan_root_path` of ``root``. With ``cluster_by`` (the columns of a
    clustered table, which has no partitions) the rows of all groups are spread over as many
    shuffle partitions by ranges of those columns instead, each sorted by them. With
    ``lineage`` (a table that tracks row ids) each row's id and commit version follow its data
    columns, in the materialized columns (:func:`stable_row_lineage`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

    data_columns = list(layout.file_schema.names)
    partition_columns = list(layout.partition_columns)
    kept = {path: (base, default) for path, base, default in lineage.files} if lineage else {}
    paths, mapping = [], []
    for index, (files_of_group, partition) in enumerate(groups):
        for path in files_of_group:
            paths.append(f"{root}/{path}")
            ids = kept.get(path, ()) if lineage else ()
            mapping.append((f"{root_path}/{path}", index, *partition, *ids))
    lineage_names = [f.name for f in lineage.fields] if lineage else []
    schema = read_schema(layout) + "".join(f", {quote(c)} BIGINT" for c in lineage_names)
    scan = parquet_files(spark, paths, schema=schema)
    metadata = scan.metadataColumn("_metadata")
    rows = scan.select(
        *[F.col(quote(c)) for c in [*data_columns, *lineage_names]],
        decoded_path(metadata.getField("file_path")).alias(_FILE),
        metadata.getField("row_index").alias(_ROW_INDEX),
    )
    vectors = {f"{root_path}/{path}": rows_of for path, rows_of in (deleted or {}).items()}
    rows = drop_deleted_rows(spark, rows, _FILE, _ROW_INDEX, vectors)
    ids_of_files = [BASE_ROW_ID, DEFAULT_ROW_COMMIT_VERSION] if lineage else []
    files = spark.createDataFrame(
        mapping,
        StructType(
            [
                StructField(_FILE, StringType(), False),
                StructField(_GROUP, IntegerType(), False),
                *[StructField(c, StringType(), True) for c in partition_columns],
                *[StructField(c, LongType(), False) for c in ids_of_files],
            ]
        ),
    )
    # Broadcast: Spark cannot size a local relation, and would otherwise shuffle and sort
    # every row by its file path (a sort-merge join: 4x the time of the whole rewrite).
    joined = rows.join(F.broadcast(files), on=_FILE, how="inner")
    if cluster_by:
        by = [F.col(quote(c)) for c in cluster_by]
        spread = joined.repartitionByRange(len(groups), *by).sortWithinPartitions(*by)
    else:
        spread = joined.repartition(len(groups), F.col(_GROUP))
    return spread.select(
        *[F.col(quote(c)) for c in data_columns],
        *(stable_row_lineage(lineage, _ROW_INDEX) if lineage else []),
        *[F.col(quote(c)) for c in partition_columns],
    )


#: The columns :func:`stable_row_lineage` takes each row's file's ids from.
BASE_ROW_ID = "__sink_base_row_id__"
DEFAULT_ROW_COMMIT_VERSION = "__sink_default_row_commit_version__"


def stable_row_lineage(lineage: RowLineage, row_index: str) -> list[Column]:
    """Each row's stable id and commit version (PROTOCOL.md, "Row Tracking"), named as the
    materialized columns: the materialized value where the file has one, else its file's
    ``baseRowId`` (column :data:`BASE_ROW_ID`) plus its physical position (``row_index``), and
    its file's ``defaultRowCommitVersion`` (:data:`DEFAULT_ROW_COMMIT_VERSION`)."""
    from pyspark.sql import functions as F

    row_id, version = lineage.id_column, lineage.version_column
    return [
        F.coalesce(F.col(quote(row_id)), F.col(BASE_ROW_ID) + F.col(row_index)).alias(row_id),
        F.coalesce(F.col(quote(version)), F.col(DEFAULT_ROW_COMMIT_VERSION)).alias(version),
    ]
