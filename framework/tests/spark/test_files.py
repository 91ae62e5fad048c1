"""framework.spark._files.parquet_files: a scan of an explicit list of Parquet files, with the
files' statuses given (Spark lists nothing) or listed by Spark."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from framework.spark.connector import parquet_files


def _files(root, layout: dict[str, list[int]]) -> tuple[list[str], list[tuple[int, int]]]:
    """Parquet files of ids under ``root`` (relative path -> ids); their paths and statuses."""
    paths, statuses = [], []
    for relative, ids in layout.items():
        path = os.path.join(root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        pq.write_table(pa.table({"id": pa.array(ids, pa.int64())}), path)
        stat = os.stat(path)
        paths.append(path)
        statuses.append((stat.st_size, stat.st_mtime_ns // 1_000_000))
    return paths, statuses


def _metrics(spark):
    metrics = spark._jvm.org.apache.spark.metrics.source.HiveCatalogMetrics
    return metrics.METRIC_FILES_DISCOVERED().getCount(), metrics.METRIC_FILE_CACHE_HITS().getCount()


def test_given_statuses_spark_lists_nothing_and_reads_every_row(spark, tmp_path):
    paths, statuses = _files(tmp_path, {f"f{i}.parquet": [2 * i, 2 * i + 1] for i in range(40)})
    discovered, hits = _metrics(spark)
    df = parquet_files(spark, paths, schema="id long", statuses=statuses)
    assert _metrics(spark) == (discovered, hits + 40)  # every file from the given statuses
    assert sorted(r.id for r in df.collect()) == list(range(80))
    assert sorted(df.inputFiles()) == sorted(f"file://{p}" for p in paths)
    # The same without statuses: Spark lists the 40 files itself.
    listed = parquet_files(spark, paths, schema="id long")
    assert _metrics(spark)[0] == discovered + 40
    assert sorted(r.id for r in listed.collect()) == list(range(80))


def test_given_statuses_partitions_come_from_the_directories(spark, tmp_path):
    paths, statuses = _files(
        tmp_path, {"run-1/day=1/a.parquet": [1, 2], "run-2/day=2/b.parquet": [3]}
    )
    df = parquet_files(
        spark,
        paths,
        schema="id long, day int",
        base_path=str(tmp_path),
        options={"ignoreInvalidPartitionPaths": "true"},
        statuses=statuses,
    )
    assert df.columns == ["id", "day"]
    assert sorted(tuple(r) for r in df.collect()) == [(1, 1), (2, 1), (3, 2)]
    assert sorted(tuple(r) for r in df.where("day = 2").collect()) == [(3, 2)]
    metadata = df.select(df.metadataColumn("_metadata").getField("row_index").alias("i"))
    assert sorted(r.i for r in metadata.collect()) == [0, 0, 1]


def test_a_file_gone_since_fails_the_read_not_the_plan(spark, tmp_path):
    paths, statuses = _files(tmp_path, {"a.parquet": [1], "b.parquet": [2]})
    os.remove(paths[1])
    df = parquet_files(spark, paths, schema="id long", statuses=statuses)
    with pytest.raises(Exception, match=r"b\.parquet"):
        df.collect()


def test_statuses_must_match_the_paths(spark, tmp_path):
    paths, statuses = _files(tmp_path, {"a.parquet": [1]})
    with pytest.raises(ValueError, match="2 statuses for 1 paths"):
        parquet_files(spark, paths, schema="id long", statuses=statuses * 2)
