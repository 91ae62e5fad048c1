"""framework.spark._source: a bounded framework Source read as a Spark Python data source.

The source is a tiny in-memory ``FileGroupSource`` ("files" are keys of a dict of Arrow
batches). Planning and reading are checked in-process first (no JVM), then once through Spark.
"""

from __future__ import annotations

import sys

import pyarrow as pa
import pytest
from pyspark.sql.datasource import DataSource, InputPartition
from pyspark.sql.types import LongType, StringType, StructField, StructType

from framework.errors import ConfigurationError, SinkError
from framework.sink import deserialize_versioned
from framework.source import Boundedness, FileGroupSource, FileSourceConfig, FileSplit
from framework.spark._source import (
    FILTER_PUSHDOWN_CONF,
    WORKER_PYTHON_CONF,
    BoundedSourceReader,
    SplitsPartition,
    plan_splits,
    register_data_source,
)

MiB = 1024 * 1024
SCHEMA = StructType([StructField("id", LongType()), StructField("name", StringType())])


def _batch(start: int, stop: int) -> pa.RecordBatch:
    # Narrower type and other column order than the read schema: the adapter conforms them.
    ids = pa.array(range(start, stop), pa.int32())
    names = pa.array([f"n{i}" for i in range(start, stop)])
    return pa.RecordBatch.from_arrays([names, ids], names=["name", "id"])


# Four "files" of 1 MiB each (declared sizes), with 1, 2, 0 and 3 batches.
FILES = {
    "a": [_batch(0, 3)],
    "b": [_batch(3, 5), _batch(5, 9)],
    "c": [],
    "d": [_batch(9, 10), _batch(10, 10), pa.Table.from_batches([_batch(10, 12)])],
}


class _ListFiles:
    def __init__(self, names):
        self.names = names

    def __call__(self):
        return [FileSplit(path=name, size_bytes=MiB) for name in self.names]


def _read_file(file: FileSplit):
    return iter(FILES[file.path])


def _source(names=tuple(FILES), read_file=_read_file) -> FileGroupSource:
    return FileGroupSource(
        _ListFiles(names), read_file, config=FileSourceConfig(max_split_bytes=2 * MiB)
    )


class MemorySource(DataSource):
    """``spark.read.format("memory_source")``: the four files above."""

    @classmethod
    def name(cls):
        return "memory_source"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return BoundedSourceReader(schema, _source())


def _ids(batches) -> list[int]:
    return sorted(i for batch in batches for i in batch.column("id").to_pylist())


def test_planning_makes_one_partition_per_split_and_reading_them_yields_every_row_once():
    reader = BoundedSourceReader(SCHEMA, _source())
    partitions = reader.partitions()
    # 2 MiB splits of 1 MiB files: (a, b), (c, d).
    assert [p.index for p in partitions] == [0, 1]
    assert all(isinstance(p, SplitsPartition) and len(p.splits) == 1 for p in partitions)
    split = deserialize_versioned(_source().split_serializer(), partitions[1].splits[0])
    assert [f.path for f in split.files] == ["c", "d"]

    batches = [b for p in partitions for b in reader.read(p)]
    assert _ids(batches) == list(range(12))
    target = pa.schema([pa.field("id", pa.int64()), pa.field("name", pa.string())])
    assert all(b.schema.equals(target) and b.num_rows > 0 for b in batches)


def test_an_empty_source_plans_no_partition_and_spark_stand_in_reads_nothing():
    reader = BoundedSourceReader(SCHEMA, _source(names=()))
    assert reader.partitions() == []
    assert list(reader.read(InputPartition(None))) == []


def test_a_record_that_is_not_arrow_or_lacks_a_column_fails_the_task_clearly():
    rows = BoundedSourceReader(SCHEMA, _source(names=("a",), read_file=lambda f: iter([(1, "x")])))
    with pytest.raises(SinkError, match="Arrow record batches, but the source emitted tuple"):
        list(rows.read(rows.partitions()[0]))
    narrow = pa.RecordBatch.from_pydict({"id": [1]})
    lacking = BoundedSourceReader(SCHEMA, _source(names=("a",), read_file=lambda f: iter([narrow])))
    with pytest.raises(SinkError, match=r"lacks the column\(s\) \['name'\]"):
        list(lacking.read(lacking.partitions()[0]))


def test_an_unbounded_source_is_refused_at_planning():
    class Endless(FileGroupSource):
        @property
        def boundedness(self):
            return Boundedness.CONTINUOUS_UNBOUNDED

    with pytest.raises(ConfigurationError, match="unbounded"):
        plan_splits(Endless(_ListFiles(()), _read_file))


@pytest.mark.spark
def test_spark_reads_the_source_through_the_python_data_source_api(spark):
    before = spark.conf.get(FILTER_PUSHDOWN_CONF, "false")
    try:
        register_data_source(spark, MemorySource, filter_pushdown=True)
        assert spark.conf.get(FILTER_PUSHDOWN_CONF) == "true"
        df = spark.read.format("memory_source").load()
        assert df.schema == SCHEMA
        rows = sorted((r.id, r.name) for r in df.collect())
        assert rows == [(i, f"n{i}") for i in range(12)]
    finally:
        spark.conf.set(FILTER_PUSHDOWN_CONF, before)


@pytest.mark.spark
def test_a_source_is_planned_with_the_drivers_python_when_the_workers_is_not_here(spark):
    """spark-submit --archives env.tar.gz#environment --conf
    spark.pyspark.python=./environment/bin/python: the workers' interpreter is relative to each
    executor's working directory; the driver, which plans the source, has none there."""
    context = spark.sparkContext
    workers, shipped = context.pythonExec, "./shipped-environment/bin/python"
    assert spark.conf.get(WORKER_PYTHON_CONF, None) is None
    context.pythonExec = shipped
    try:
        # Local mode's executors have no shipped environment either: give them this Python.
        spark.conf.set(WORKER_PYTHON_CONF, sys.executable)
        register_data_source(spark, MemorySource, filter_pushdown=False)
        assert context.pythonExec == shipped
        rows = spark.read.format("memory_source").load().collect()
        assert sorted((r.id, r.name) for r in rows) == [(i, f"n{i}") for i in range(12)]
        # Unless told otherwise, the executors' workers keep the shipped interpreter.
        spark.conf.unset(WORKER_PYTHON_CONF)
        register_data_source(spark, MemorySource, filter_pushdown=False)
        assert spark.conf.get(WORKER_PYTHON_CONF) == shipped
    finally:
        context.pythonExec = workers
        spark.conf.unset(WORKER_PYTHON_CONF)
