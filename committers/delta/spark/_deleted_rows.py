"""Dropping the rows deletion vectors delete from a scan by Spark's own Parquet reader.

Spark's reader knows each row's file (``_metadata.file_path``) and position in it
(``_metadata.row_index``, counted over the whole file even when row groups are skipped). The
deleted positions are read on the driver; the scan keeps a row unless its key, the file's
number shifted left by 40 bits OR its row index, is among the deleted keys. That is two
broadcast joins: a small one from file path to file number, and an anti join on one long
column, which Spark runs as a hash lookup per row with no shuffle. Rows of files without a
vector get a null key and are kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from committers.delta.table._delta_schema import quote
from framework.errors import SinkError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["ROW_INDEX_BITS", "drop_deleted_rows", "without_deleted_rows"]

#: Bits of a key that hold the row index: files of up to 2**40 rows.
ROW_INDEX_BITS = 40
_FILE_PATH = "__sink_dv_file_path__"
_ROW_INDEX = "__sink_dv_row_index__"
_VECTOR_FILE = "__sink_dv_vector_file__"
_FILE_NUMBER = "__sink_dv_file__"
_KEY = "__sink_dv_key__"


def without_deleted_rows(
    spark: SparkSession, scan: DataFrame, vectors: Sequence[tuple[str, np.ndarray]]
) -> DataFrame:
    """``scan`` (a Parquet file scan, straight from the reader) without the rows ``vectors``
    delete, with the same columns.

    Args:
        vectors: ``(file path as Spark spells _metadata.file_path, sorted deleted row
            indexes)`` for each file of the scan that has a deletion vector.
    """
    if not vectors:
        return scan
    from pyspark.sql import functions as F

    columns = [F.col(quote(c)) for c in scan.columns]
    metadata = scan.metadataColumn("_metadata")
    rows = scan.select(
        *columns,
        metadata.getField("file_path").alias(_FILE_PATH),
        metadata.getField("row_index").alias(_ROW_INDEX),
    )
    return drop_deleted_rows(spark, rows, _FILE_PATH, _ROW_INDEX, vectors).select(*columns)


def drop_deleted_rows(
    spark: SparkSession,
    rows: DataFrame,
    file_path: str,
    row_index: str,
    vectors: Sequence[tuple[str, np.ndarray]],
) -> DataFrame:
    """``rows`` (with a file path and a row index column) without the rows ``vectors``
    delete (see :func:`without_deleted_rows`); the two columns are kept.

    Raises:
        SinkError: a deleted row index does not fit the key (a file of 2**40 rows or more).
    """
    if not vectors:
        return rows
    import pyarrow as pa
    from pyspark.sql import functions as F

    limit = np.uint64(1 << ROW_INDEX_BITS)
    keys = []
    for number, (path, deleted) in enumerate(vectors):
        if len(deleted) and deleted[-1] >= limit:
            raise SinkError(f"{path} has a deleted row index {deleted[-1]} beyond 2**40")
        keys.append((np.int64(number) << ROW_INDEX_BITS) | deleted.astype(np.int64))
    files = spark.createDataFrame(
        pa.table(
            {
                _VECTOR_FILE: pa.array([path for path, _ in vectors], pa.string()),
                _FILE_NUMBER: pa.array(range(len(vectors)), pa.int64()),
            }
        )
    )
    deleted_keys = spark.createDataFrame(
        pa.table({_KEY: pa.array(np.concatenate(keys), pa.int64())})
    )
    keyed = rows.join(
        F.broadcast(files), rows[quote(file_path)] == files[_VECTOR_FILE], "left"
    ).select(
        *[rows[quote(c)] for c in rows.columns],
        F.shiftleft(F.col(_FILE_NUMBER), ROW_INDEX_BITS)
        .bitwiseOR(F.col(quote(row_index)))
        .alias(_KEY),
    )
    kept = keyed.join(F.broadcast(deleted_keys), on=_KEY, how="left_anti")
    return kept.select(*[F.col(quote(c)) for c in rows.columns])
