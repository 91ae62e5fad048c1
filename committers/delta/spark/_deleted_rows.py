"""Dropping the rows deletion vectors delete from a scan by Spark's own Parquet reader.

Spark's reader knows each row's file (``_metadata.file_path``) and position in it
(``_metadata.row_index``, counted over the whole file even when row groups are skipped). The
deleted positions are read on the driver; the scan keeps a row unless its key, the file's
number shifted left by 40 bits OR its row index, is among the deleted keys. That is two
broadcast joins: a small one from the file's path to its number, and an anti join on one long
column, which Spark runs as a hash lookup per row with no shuffle. Rows of files without a
vector get a null key and are kept.

Files are matched by the decoded path component of their URI (:func:`decoded_path`), not by
Spark's spelling of the whole URI, which varies (``file:/`` or ``file:///``, which characters
are escaped). A vector whose file is not matched would keep its deleted rows, so callers check
with :func:`unmatched` that Spark lists every file with a vector before they trust the scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

import numpy as np

from committers.delta.table._delta_schema import quote
from framework.errors import SinkError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = [
    "ROW_INDEX_BITS",
    "decoded_path",
    "drop_deleted_rows",
    "path_component",
    "unmatched",
    "without_deleted_rows",
]

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
        vectors: ``(decoded path component of the file's URI (:func:`path_component`), sorted
            deleted row indexes)`` for each file of the scan that has a deletion vector.
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
    *,
    decoded: bool = False,
) -> DataFrame:
    """``rows`` (with a file path and a row index column) without the rows ``vectors``
    delete (see :func:`without_deleted_rows`); the two columns are kept. ``file_path`` holds
    ``_metadata.file_path``, or with ``decoded`` its :func:`decoded_path` already.

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
    column = rows[quote(file_path)]
    condition = (column if decoded else decoded_path(column)) == files[_VECTOR_FILE]
    keyed = rows.join(F.broadcast(files), condition, "left").select(
        *[rows[quote(c)] for c in rows.columns],
        F.shiftleft(F.col(_FILE_NUMBER), ROW_INDEX_BITS)
        .bitwiseOR(F.col(quote(row_index)))
        .alias(_KEY),
    )
    kept = keyed.join(F.broadcast(deleted_keys), on=_KEY, how="left_anti")
    return kept.select(*[F.col(quote(c)) for c in rows.columns])


def decoded_path(file_path: Column) -> Column:
    """The decoded path component of ``_metadata.file_path`` (a ``java.net.URI`` spelling),
    keeping a literal ``+`` a ``+`` (``url_decode`` would read it as a space)."""
    from pyspark.sql import functions as F

    encoded = F.parse_url(file_path, F.lit("PATH"))
    return F.url_decode(F.replace(encoded, F.lit("+"), F.lit("%2B")))


def path_component(uri: str) -> str:
    """The path component of a file's URI or absolute path as the log decodes it (its
    characters unescaped: ``#`` or ``%`` are part of the path, not URI syntax)."""
    if "://" not in uri:
        return uri
    rest = uri.split("://", 1)[1]
    return "/" + rest.split("/", 1)[1] if "/" in rest else "/"


def unmatched(listed: Sequence[str], vectors: Sequence[tuple[str, np.ndarray]]) -> list[str]:
    """The files of ``vectors`` that are none of ``listed`` (Spark's ``inputFiles()``, URIs
    as Spark escapes them)."""
    paths = {unquote(urlparse(uri).path) for uri in listed}
    return [path for path, _ in vectors if path not in paths]
