"""Dropping the rows deletion vectors delete from a scan by Spark's own Parquet reader.

Spark's reader knows each row's file (``_metadata.file_path``) and position in it
(``_metadata.row_index``, counted over the whole file even when row groups are skipped). The
deleted positions are read on the driver. In a classic session a Java function filters the
rows (:mod:`committers.delta.spark._jvm_deleted_rows`): one lookup per row, by the hash of its
file's path and its position. Where it cannot (Spark Connect, two paths hashing alike), the
scan keeps a row unless its key, its file's number shifted left by 40 bits OR its row index,
is among the deleted keys: two broadcast joins, a small one from the file's path to its number
and an anti join on one long column (a hash lookup per row, no shuffle), which cost about as
much again as the scan.

A row whose file is not matched would keep its deleted rows, so either way *every* file of the
scan is named (``every_file``) and a row matching none of them fails the query, naming its
file, instead of being returned. (Compaction passes keys it computed itself on both sides, so
they cannot disagree: it maps only the files with vectors.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from committers.delta.spark._jvm_deleted_rows import keep_live_rows
from committers.delta.table._delta_schema import quote
from framework.errors import SinkError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["ROW_INDEX_BITS", "decoded_path", "drop_deleted_rows", "without_deleted_rows"]

#: Bits of a key that hold the row index: files of up to 2**40 rows.
ROW_INDEX_BITS = 40
_FILE_PATH = "__sink_dv_file_path__"
_ROW_INDEX = "__sink_dv_row_index__"
_VECTOR_FILE = "__sink_dv_vector_file__"
_FILE_NUMBER = "__sink_dv_file__"
_KEY = "__sink_dv_key__"


def without_deleted_rows(
    spark: SparkSession,
    scan: DataFrame,
    vectors: Mapping[str, np.ndarray],
    every_file: Sequence[str],
) -> DataFrame:
    """``scan`` (a Parquet file scan, straight from the reader) without the rows ``vectors``
    delete, with the same columns.

    Args:
        vectors: file path as Spark spells ``_metadata.file_path`` -> sorted deleted row
            indexes, for each file of the scan that has a deletion vector.
        every_file: the path of every file of the scan, spelled the same way.
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
    kept = drop_deleted_rows(spark, rows, _FILE_PATH, _ROW_INDEX, vectors, every_file=every_file)
    return kept.select(*columns)


def drop_deleted_rows(
    spark: SparkSession,
    rows: DataFrame,
    file_path: str,
    row_index: str,
    vectors: Mapping[str, np.ndarray],
    *,
    every_file: Sequence[str] | None = None,
) -> DataFrame:
    """``rows`` (with a file path and a row index column) without the rows ``vectors``
    (file path -> sorted deleted row indexes) delete; the two columns are kept. With
    ``every_file`` (every path the column can hold), a row whose path is none of them fails
    the query (see the module docstring).

    Raises:
        SinkError: a deleted row index does not fit the key (a file of 2**40 rows or more).
    """
    if not vectors:
        return rows
    import pyarrow as pa
    from pyspark.sql import functions as F

    paths = list(every_file) if every_file is not None else list(vectors)
    column = rows[quote(file_path)]
    live = keep_live_rows(spark, column, rows[quote(row_index)], vectors, paths)
    if live is not None:
        if every_file is None:  # (rows of the files without a vector)
            return rows.where(F.coalesce(live, F.lit(True)))
        return rows.where(F.when(live.isNull(), _unknown_file(column)).otherwise(live))
    limit = np.uint64(1 << ROW_INDEX_BITS)
    keys = []
    for number, path in enumerate(paths):
        deleted = vectors.get(path)
        if deleted is None:
            continue
        if len(deleted) and deleted[-1] >= limit:
            raise SinkError(f"{path} has a deleted row index {deleted[-1]} beyond 2**40")
        keys.append((np.int64(number) << ROW_INDEX_BITS) | deleted.astype(np.int64))
    files = spark.createDataFrame(
        pa.table(
            {
                _VECTOR_FILE: pa.array(paths, pa.string()),
                _FILE_NUMBER: pa.array(range(len(paths)), pa.int64()),
            }
        )
    )
    deleted_keys = spark.createDataFrame(
        pa.table({_KEY: pa.array(np.concatenate(keys), pa.int64())})
    )
    file_number = F.col(_FILE_NUMBER)
    if every_file is not None:
        file_number = F.when(file_number.isNotNull(), file_number).otherwise(
            _unknown_file(column).cast("long")
        )
    keyed = rows.join(F.broadcast(files), column == files[_VECTOR_FILE], "left").select(
        *[rows[quote(c)] for c in rows.columns],
        F.shiftleft(file_number, ROW_INDEX_BITS).bitwiseOR(F.col(quote(row_index))).alias(_KEY),
    )
    kept = keyed.join(F.broadcast(deleted_keys), on=_KEY, how="left_anti")
    return kept.select(*[F.col(quote(c)) for c in rows.columns])


def _unknown_file(file_path: Column) -> Column:
    """Fails the query, naming the file of a row no vector map holds."""
    from pyspark.sql import functions as F

    return F.raise_error(
        F.concat(
            F.lit("deletion vectors: no file of the snapshot is spelled "),
            file_path,
            F.lit("; its deleted rows cannot be dropped, so the read fails"),
        )
    )


def decoded_path(file_path: Column) -> Column:
    """The decoded path component of ``_metadata.file_path`` (a ``java.net.URI`` spelling),
    keeping a literal ``+`` a ``+`` (``url_decode`` would read it as a space)."""
    from pyspark.sql import functions as F

    encoded = F.parse_url(file_path, F.lit("PATH"))
    return F.url_decode(F.replace(encoded, F.lit("+"), F.lit("%2B")))
