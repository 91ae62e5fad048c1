"""Change files of a rewrite, written by Spark (see :mod:`committers.delta.table._change_feed`).

A rewrite of a table with the change data feed on (an upsert, an overwrite's
``replace_where`` on data columns) hands its changed rows here as a DataFrame shaped as the
table's writers receive rows (data columns, then partition values spelled as the log stores
them) plus ``_change_type``. Spark's Parquet writer writes them, partitioned like the data,
under ``_change_data/batch-<epoch>-<run id>/<column>=<value>/``; the files carry the data
columns and ``_change_type``, their partition values go into the ``cdc`` actions. The
directory is named in the run's staging manifest before anything is written, so the change
files of a run that does not commit are deleted by the epoch's clean-up with its data files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from committers.delta.spark._deleted_rows import decoded_path
from committers.delta.spark._scan import read_schema, scan_root_path
from committers.delta.spark._spark_staging import SparkParquetStager, run_directory, spark_uri
from committers.delta.storage._storage import TableLocation
from committers.delta.table._change_feed import CHANGE_DATA_DIR, CHANGE_TYPE
from committers.delta.table._delta_schema import quote
from committers.delta.table._rules import FileLayout
from committers.delta.write._committable import StagedFile
from committers.delta.write._options import WriterOptions
from framework.errors import RowCountMismatchError
from framework.sink import Epoch
from framework.spark.connector import parquet_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["change_directory", "stage_changes", "staged_rows"]

_FILE = "__sparksink_file__"


def change_directory(epoch: Epoch) -> str:
    """Where ``epoch``'s run writes its change files, relative to the table root."""
    return f"{CHANGE_DATA_DIR}/{run_directory(epoch)}"


def stage_changes(
    location: TableLocation,
    layout: FileLayout,
    options: WriterOptions,
    changes: DataFrame,
    epoch: Epoch,
    *,
    expected_rows: int,
    what: str,
) -> tuple[StagedFile, ...]:
    """Write ``changes`` (the received columns of ``layout`` and ``_change_type``) into
    :func:`change_directory` (which the run's manifest must name already).

    Returns:
        The change files, each with its partition values (no empty file).

    Raises:
        RowCountMismatchError: the job wrote another number of rows than ``expected_rows``
            (the changes ``what`` describes, counted apart), or the files do not hold them;
            the files are left for the epoch's clean-up.
    """
    change_layout = FileLayout(
        file_schema=layout.file_schema.append(pa.field(CHANGE_TYPE, pa.string())),
        partition_columns=layout.partition_columns,
        hive_directories=layout.hive_directories,
    )
    columns = [*change_layout.file_schema.names, *layout.partition_columns]
    stager = SparkParquetStager(location, change_layout, options)
    directory = change_directory(epoch)
    staged, rows = stager.write(changes.select(*map(quote, columns)), epoch, directory)
    if rows != expected_rows:
        raise RowCountMismatchError(
            f"{what} wrote {rows} change rows into {directory} where it changed "
            f"{expected_rows} rows; nothing was committed. A file may have been deleted while "
            "it was read (VACUUM)."
        )
    return tuple(staged)


def staged_rows(
    session: SparkSession,
    location: TableLocation,
    layout: FileLayout,
    files: Sequence[StagedFile],
) -> DataFrame:
    """The rows of staged data ``files`` in the received shape of ``layout``: their data
    columns, then each file's partition values as its add action logs them."""
    from pyspark.sql import functions as F

    root = spark_uri(location.uri.rstrip("/"))
    root_path = scan_root_path(session, root)
    scan = parquet_files(session, [f"{root}/{f.path}" for f in files], schema=read_schema(layout))
    data = [F.col(quote(c)) for c in layout.file_schema.names]
    partitions = list(layout.partition_columns)
    if not partitions:
        return scan.select(*data)
    file_path = scan.metadataColumn("_metadata").getField("file_path")
    key = decoded_path(file_path)
    values = pa.table(
        [pa.array([f"{root_path}/{f.path}" for f in files], pa.string())]
        + [pa.array([f.partition_values.get(c) for f in files], pa.string()) for c in partitions],
        names=[_FILE, *partitions],
    )
    rows = scan.select(*data, key.alias(_FILE))
    joined = rows.join(F.broadcast(session.createDataFrame(values)), on=_FILE)
    return joined.select(*data, *[F.col(quote(c)) for c in partitions])
