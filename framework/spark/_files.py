"""DataFrames over an explicit list of Parquet files, without Spark's per-file listing job.

Given more than ``spark.sql.sources.parallelPartitionDiscovery.threshold`` (32) paths, Spark
checks and lists them with a job of one task per path, up to
``spark.sql.sources.parallelPartitionDiscovery.parallelism`` (10,000) tasks. For the file lists
of a Delta snapshot that is one tiny task per file: 2,000 files took about 10 s of task
overhead in ``local[2]``, against 0.5 s with the job capped at the cluster's parallelism
(each task then lists a share of the files; remote stores keep their parallel listing).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["LISTING_PARALLELISM_CONF", "parquet_files"]

LISTING_PARALLELISM_CONF = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
_conf_lock = threading.Lock()


def parquet_files(
    spark: SparkSession,
    paths: Sequence[str],
    *,
    schema: StructType | str,
    base_path: str | None = None,
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """A DataFrame reading exactly ``paths`` with ``schema`` (a StructType or Spark DDL);
    ``base_path`` and ``options`` are Spark's file source options.

    Spark lists the files while the DataFrame is created; during that call the session's
    listing parallelism is capped at ``spark.sparkContext.defaultParallelism`` (never raised)
    and then restored. The setting only sizes the listing job, so another thread's query
    planned meanwhile reads the same files either way.

    Raises:
        Exception: Spark's own error when a path does not exist or is not Parquet.
    """
    reader = spark.read.schema(schema)
    if base_path is not None:
        reader = reader.option("basePath", base_path)
    for name, value in (options or {}).items():
        reader = reader.option(name, value)
    with _conf_lock:
        before = spark.conf.get(LISTING_PARALLELISM_CONF)
        cap = max(1, spark.sparkContext.defaultParallelism)
        if before is not None and before.isdigit() and int(before) <= cap:
            return reader.parquet(*paths)
        spark.conf.set(LISTING_PARALLELISM_CONF, str(cap))
        try:
            return reader.parquet(*paths)
        finally:
            if before is None:
                spark.conf.unset(LISTING_PARALLELISM_CONF)
            else:
                spark.conf.set(LISTING_PARALLELISM_CONF, before)
