"""The row-count guard: every write path commits only files holding exactly the rows its job
wrote, counted as the job wrote them. A staged file lost on its way to the commit (here: a
listing or a task result that drops one) fails the batch before its commit, with an error that
names both numbers; nothing is committed and nothing staged is left behind."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from committers.delta import DeltaSink
from committers.delta.spark._spark_staging import SparkParquetStager
from committers.tests._delta_helpers import (
    assert_no_orphans,
    committed_files,
    data_files_on_disk,
    ids,
    read_rows,
    staging_leftovers,
)
from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import file_stream, make_source, write_source_file
from framework import TwoPhaseSink
from framework.errors import RowCountMismatchError, StagingError

MISMATCH = "would commit {committed} rows, but its write job wrote {written} rows"


@dataclasses.dataclass
class Lost:
    """Rows of the staged file a hook dropped (``None``: nothing dropped yet)."""

    rows: int | None = None


def lose_a_listed_file(monkeypatch) -> Lost:
    """Spark staging's listing of the files Spark wrote drops one that holds rows (as the
    listing that took ``_2=...`` partition directories for hidden ones did)."""
    listed = SparkParquetStager._read_footers
    lost = Lost()

    def losing(self, directory):
        files = listed(self, directory)
        victim = next(f for f in files if f.num_records)
        lost.rows = victim.num_records
        return [f for f in files if f is not victim]

    monkeypatch.setattr(SparkParquetStager, "_read_footers", losing)
    return lost


def lose_a_task_result(monkeypatch) -> Lost:
    """One file the Python writers staged goes missing between their tasks and the commit."""
    staged = TwoPhaseSink._stage
    lost = Lost()

    def losing(self, df, epoch):
        committables, rows, counters = staged(self, df, epoch)
        victim = next(c for c in committables if c.num_records)
        lost.rows = victim.num_records
        return [c for c in committables if c is not victim], rows, counters

    monkeypatch.setattr(TwoPhaseSink, "_stage", losing)
    return lost


def lose_a_rewritten_file(monkeypatch, *, with_its_counts: bool) -> Lost:
    """The Python tasks' rewrite (compaction, an upsert's kept rows) loses one group's file
    on the driver, either alone (its task's counts arrive) or together with its counts."""
    from committers.delta.spark import _arrow_rewrite

    in_tasks = _arrow_rewrite.in_tasks
    lost = Lost()

    def losing(spark, groups, work):
        outcomes = in_tasks(spark, groups, work)
        index = next(i for i, o in enumerate(outcomes) if o.file is not None)
        lost.rows = outcomes[index].file.num_records
        if with_its_counts:
            return outcomes[:index] + outcomes[index + 1 :]
        outcomes[index] = dataclasses.replace(outcomes[index], file=None)
        return outcomes

    monkeypatch.setattr(_arrow_rewrite, "in_tasks", losing)
    return lost


def lose_a_file_rewritten_for_replace_where(monkeypatch) -> Lost:
    """An overwrite's rewrite of the files holding rows its data predicate matches loses the
    file of one candidate's kept rows (its task's counts arrive)."""
    from committers.delta.spark import _replace_rewrite

    in_tasks = _replace_rewrite.in_tasks_or_threads
    lost = Lost()

    def losing(spark, groups, work, failure):
        results = in_tasks(spark, groups, work, failure)
        index = next(i for i, (_, o) in enumerate(results) if o.file is not None)
        candidate, outcome = results[index]
        lost.rows = outcome.file.num_records
        results[index] = (candidate, dataclasses.replace(outcome, file=None))
        return results

    monkeypatch.setattr(_replace_rewrite, "in_tasks_or_threads", losing)
    return lost


def _mismatch(written: int, lost: Lost) -> str:
    assert lost.rows, "the hook dropped no file"
    return MISMATCH.format(committed=written - lost.rows, written=written)


def _days(spark, first: int, count: int, partitions: int = 2):
    return spark.range(first, first + count, numPartitions=partitions).selectExpr(
        "id", "concat('d', CAST(id % 3 AS STRING)) AS day"
    )


def _jobs_of(spark, write) -> int:
    """Spark jobs ``write()`` runs (in a job group of its own)."""
    context = spark.sparkContext
    group = f"count-{uuid.uuid4()}"
    context.setJobGroup(group, "jobs of one write")
    try:
        write()
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    return len(context.statusTracker().getJobIdsForGroup(group))


# -- appends, overwrites, complete mode ---------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("staging", ["spark", "arrow"])
def test_a_lost_file_fails_an_append_before_its_commit(spark, tmp_path, monkeypatch, staging):
    table = str(tmp_path / "t")
    sink = TwoPhaseSink(DeltaSink(table, app_id="lose", partition_by=["day"], staging=staging))
    # The count rides along the write: one Spark job per batch, as without it.
    assert _jobs_of(spark, lambda: sink.write(_days(spark, 0, 30))) == 1
    lose = lose_a_listed_file if staging == "spark" else lose_a_task_result
    lost = lose(monkeypatch)
    with pytest.raises(RowCountMismatchError) as refused:
        sink.write(_days(spark, 100, 60))
    assert _mismatch(60, lost) in str(refused.value)
    assert isinstance(refused.value, StagingError)
    assert DeltaTable(table).version() == 0
    assert ids(table) == list(range(30))
    assert_no_orphans(table)  # the batch's staged files (the lost one too) are deleted


@pytest.mark.spark
def test_a_lost_file_fails_an_overwrite_with_replace_where(spark, tmp_path, monkeypatch):
    table = str(tmp_path / "t")
    TwoPhaseSink(DeltaSink(table, partition_by=["day"], staging="spark")).write(_days(spark, 0, 30))
    before = read_rows(table)
    lost = lose_a_listed_file(monkeypatch)
    replace = DeltaSink(table, mode="overwrite", replace_where="day = 'd1'", staging="spark")
    new_d1 = spark.range(1000, 1040, 3, numPartitions=2).selectExpr("id", "'d1' AS day")
    with pytest.raises(RowCountMismatchError) as refused:
        TwoPhaseSink(replace).write(new_d1)
    assert _mismatch(new_d1.count(), lost) in str(refused.value)
    assert DeltaTable(table).version() == 0
    assert read_rows(table) == before
    assert_no_orphans(table)


@pytest.mark.spark
def test_a_lost_file_fails_an_overwrite_whose_replace_where_reads_a_data_column(
    spark, tmp_path, monkeypatch
):
    """The files that hold rows the predicate matches are rewritten without them (Python
    tasks); one rewritten file is lost: the overwrite fails before its commit."""
    table = str(tmp_path / "t")
    for file_ids in ([1, 2, 3, 4], [5, 7]):  # a file of mixed rows, a file of odd rows only
        evens = [i % 2 == 0 for i in file_ids]
        rows = pa.table({"id": pa.array(file_ids, pa.int64()), "is_even": evens})
        write_deltalake(table, rows, mode="append")
    before, version, on_disk = read_rows(table), DeltaTable(table).version(), _on_disk(table)
    lost = lose_a_file_rewritten_for_replace_where(monkeypatch)
    replace = DeltaSink(table, mode="overwrite", replace_where="is_even = true")
    new_rows = spark.createDataFrame([(10, True), (12, True)], "id long, is_even boolean")
    with pytest.raises(RowCountMismatchError) as refused:
        TwoPhaseSink(replace).write(new_rows)
    assert lost.rows == 2  # ids 1 and 3, kept
    assert MISMATCH.format(committed=0, written=2) in str(refused.value)
    assert DeltaTable(table).version() == version
    assert read_rows(table) == before
    assert _on_disk(table) == on_disk


@pytest.mark.spark
@pytest.mark.parametrize(("output_mode", "staging"), [("append", "arrow"), ("complete", "spark")])
def test_a_lost_file_fails_a_micro_batch_and_its_query(
    spark, tmp_path, monkeypatch, output_mode, staging
):
    src, table, checkpoint = make_source(tmp_path, 2), str(tmp_path / "t"), tmp_path / "chk"
    stream = file_stream(spark, src)
    if output_mode == "complete":
        stream = stream.groupBy("day").count()
    sink = TwoPhaseSink(DeltaSink(table, app_id="stream", staging=staging))

    def run():
        return sink.write_stream(
            stream,
            checkpoint_location=str(checkpoint),
            output_mode=output_mode,
            trigger={"availableNow": True},
        )

    run().awaitTermination()
    version, before, on_disk = DeltaTable(table).version(), read_rows(table), _on_disk(table)
    write_source_file(src, "part-002", range(20, 30))
    lost = (lose_a_listed_file if staging == "spark" else lose_a_task_result)(monkeypatch)
    query = run()
    with pytest.raises(Exception, match="RowCountMismatchError"):
        query.awaitTermination()
    failure = sink.failure(query)
    assert isinstance(failure, RowCountMismatchError)
    written = 3 if output_mode == "complete" else 10  # three days' counts; ten new ids
    assert _mismatch(written, lost) in str(failure)
    assert DeltaTable(table).version() == version
    assert read_rows(table) == before
    assert _on_disk(table) == on_disk


def _on_disk(table: str) -> tuple[set[str], list[str]]:
    """The data files and the staging files under ``table``."""
    return data_files_on_disk(table), staging_leftovers(table)


# -- upserts ------------------------------------------------------------------------------------


def _two_files(tmp_path: Path) -> str:
    """A table (id, name, ts) of two files: ids 0-9 and 10-19."""
    uri = str(tmp_path / "t")
    for first in (0, 10):
        write_deltalake(
            uri,
            pa.table(
                {
                    "id": pa.array(range(first, first + 10), pa.int64()),
                    "name": [f"n{i}" for i in range(first, first + 10)],
                    "ts": pa.array([0] * 10, pa.int64()),
                }
            ),
            mode="append",
        )
    return uri


@pytest.mark.spark
@pytest.mark.parametrize("staging", ["auto", "spark"])
def test_a_lost_file_fails_an_upsert_before_its_commit(spark, tmp_path, monkeypatch, staging):
    """Python tasks keep the touched file's rows (``auto``; here the file is lost with its
    task's counts: rows kept + new rows no longer add up) or Spark does (``spark``; its
    listing loses a file)."""
    uri = _two_files(tmp_path)
    before, version = read_rows(uri), DeltaTable(uri).version()
    if staging == "auto":
        lost = lose_a_rewritten_file(monkeypatch, with_its_counts=True)
    else:
        lost = lose_a_listed_file(monkeypatch)
    upsert = DeltaSink(uri, app_id="up", mode="upsert", keys=["id"], staging=staging)
    changes = spark.createDataFrame(
        [(5, "changed", 1), (100, "new", 1)], "id long, name string, ts long"
    ).coalesce(1)
    with pytest.raises(RowCountMismatchError) as refused:
        TwoPhaseSink(upsert).write(changes)
    if staging == "auto":  # the 9 rows kept of ids 0-9 lost: only the 2 new rows written
        assert lost.rows == 9
        expected = "wrote 2 rows where the files it rewrites keep 9 and the batch adds 2 (11)"
        assert expected in str(refused.value)
    else:  # kept and new rows in one Spark job, a file lost from its listing
        assert _mismatch(11, lost) in str(refused.value)
    assert DeltaTable(uri).version() == version
    assert read_rows(uri) == before
    assert sorted(duckdb_rows(uri), key=lambda r: r["id"]) == sorted(before, key=lambda r: r["id"])
    assert staging_leftovers(uri) == []
    assert data_files_on_disk(uri) == committed_files(uri)


# -- compaction ---------------------------------------------------------------------------------


@pytest.mark.spark
@pytest.mark.parametrize("staging", ["arrow", "spark"])
def test_a_lost_file_fails_a_compaction_before_its_commit(spark, tmp_path, monkeypatch, staging):
    uri = str(tmp_path / "t")
    for first in range(0, 40, 10):
        rows = pa.table(
            {
                "id": pa.array(range(first, first + 10), pa.int64()),
                "day": [f"d{i % 2}" for i in range(first, first + 10)],
            }
        )
        write_deltalake(uri, rows, mode="append", partition_by=["day"])
    before, version, files = read_rows(uri), DeltaTable(uri).version(), committed_files(uri)
    if staging == "arrow":  # the file is lost, its task's counts arrive
        lost = lose_a_rewritten_file(monkeypatch, with_its_counts=False)
    else:
        lost = lose_a_listed_file(monkeypatch)
    with pytest.raises(RowCountMismatchError) as refused:
        DeltaSink(uri, staging=staging).compact(spark)
    assert _mismatch(40, lost) in str(refused.value)
    assert DeltaTable(uri).version() == version
    assert read_rows(uri) == before
    assert committed_files(uri) == files == data_files_on_disk(uri)
    assert staging_leftovers(uri) == []


# -- the "deltalake" format's writer -------------------------------------------------------------


def test_a_lost_file_fails_a_format_write_before_its_commit(tmp_path):
    """The format's commit (run by Spark in a driver-side Python worker) gets the tasks'
    messages; one of them lost a staged file: nothing is committed, the files are deleted."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from committers.delta.format._format_writer import batch_writer
    from framework.spark._format_writer import StagedMessage

    table = str(tmp_path / "t")
    schema = StructType([StructField("id", LongType()), StructField("day", StringType())])
    writer = batch_writer({"path": table, "partitionBy": "day"}, schema, overwrite=False)
    rows = pa.record_batch({"id": pa.array(range(10), pa.int64()), "day": ["a", "b"] * 5})
    message = writer.write(iter([rows]))  # as a task would: one file per day
    assert (message.rows, len(message.committables)) == (10, 2)
    with pytest.raises(RowCountMismatchError, match=MISMATCH.format(committed=5, written=10)):
        writer.commit([StagedMessage(committables=message.committables[1:], rows=message.rows)])
    assert not DeltaTable.is_deltatable(table)
    assert not list(Path(table).rglob("*.parquet"))
    assert staging_leftovers(table) == []
