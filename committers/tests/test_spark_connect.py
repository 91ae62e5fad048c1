"""TwoPhaseSink + DeltaSink through Spark Connect, against a real Connect server (the plugin
running in the `spark` fixture's driver): streaming batches run in the server's foreachBatch
Python process, bounded writes from the client. Kept few and small: each streaming query starts
a Python process that must connect back to the server within 10 s."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import assert_no_duplicates, assert_no_orphans, ids
from committers.tests._spark_helpers import (
    file_stream,
    forget_newest_commit,
    make_source,
    run_available_now,
    write_source_file,
)
from framework import TwoPhaseSink
from framework.errors import ConfigurationError, NullConstraintError

pytestmark = [pytest.mark.spark, pytest.mark.slow]


class _JvmStderr:
    """Redirects the driver JVM's ``System.err`` into a file while active. The Python processes
    the Connect server starts (foreachBatch workers) have their stderr copied there."""

    def __init__(self, spark, path: Path) -> None:
        self._jvm = spark._jvm
        self._path = path

    def __enter__(self) -> _JvmStderr:
        system = self._jvm.java.lang.System
        self._original = system.err
        out = self._jvm.java.io.FileOutputStream(str(self._path), True)
        self._stream = self._jvm.java.io.PrintStream(out, True)
        system.setErr(self._stream)
        return self

    def __exit__(self, *exc: object) -> None:
        self._jvm.java.lang.System.setErr(self._original)
        self._stream.close()

    def text(self) -> str:
        return self._path.read_text(errors="replace") if self._path.exists() else ""


def test_streaming_query_over_connect_is_exactly_once_across_a_restart(
    spark, connect, tmp_path, caplog
):
    src, table, chk = make_source(tmp_path, 3), str(tmp_path / "table"), tmp_path / "chk"
    sink = TwoPhaseSink(DeltaSink(table, partition_by=["day"]))  # app id derived: query-<id>
    server_stderr = _JvmStderr(spark, tmp_path / "server-stderr.txt")
    with caplog.at_level("INFO", logger="framework.spark"), server_stderr:
        query = run_available_now(sink, file_stream(connect, src), chk)
    app_id = f"query-{query.id}"
    assert DeltaTable(table).transaction_version(app_id) == 2
    assert ids(table) == list(range(30))
    # The batches ran (and were recorded) in the server's Python process, not here ...
    assert sink.batches == []
    # ... which wrote the per-batch log line to its stderr, at the level this client had.
    logged = server_stderr.text()
    for batch in range(3):
        assert f"batch={batch} epoch={batch} app_id={app_id} status=committed" in logged, logged

    # Spark forgets it finished batch 2 and runs it again after the restart: skipped.
    forget_newest_commit(chk)
    write_source_file(src, "part-100", range(1000, 1010))
    version = DeltaTable(table).version()
    restarted = TwoPhaseSink(DeltaSink(table, partition_by=["day"]))
    query = run_available_now(restarted, file_stream(connect, src), chk)
    assert f"query-{query.id}" == app_id  # the same identity, read from the checkpoint
    assert DeltaTable(table).version() == version + 1  # only batch 3 was committed
    assert DeltaTable(table).transaction_version(app_id) == 3
    values = ids(table)
    assert_no_duplicates(values)
    assert values == [*range(30), *range(1000, 1010)]
    assert_no_orphans(table)


def test_bounded_write_over_connect(connect, tmp_path):
    table = str(tmp_path / "table")
    df = connect.range(0, 500, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as day")
    sink = TwoPhaseSink(DeltaSink(table, app_id="connect-backfill", partition_by=["day"]))
    metrics = sink.write(df, epoch_id=7)
    assert (metrics.status, metrics.rows, metrics.epoch_id) == ("committed", 500, 7)
    assert sink.last_batch == metrics  # a bounded write commits from this (client) process
    assert sink.write(df, epoch_id=7).status == "skipped"
    assert DeltaTable(table).transaction_version("connect-backfill:write") == 7
    assert ids(table) == list(range(500))
    assert_no_orphans(table)
    version = DeltaTable(table).version()
    with pytest.raises(ConfigurationError, match="Spark Connect client does not have"):
        DeltaSink(table).compact(connect)  # its tasks need the driver's SparkContext
    assert DeltaTable(table).version() == version


def _not_null_table(path: str) -> None:
    DeltaTable.create(path, schema=pa.schema([pa.field("id", pa.int64(), nullable=False)]))


@pytest.mark.parametrize("mode", ["classic", "connect"])
def test_null_in_not_null_column_fails_the_query_with_a_catchable_error(
    spark, connect, tmp_path, mode
):
    session = spark if mode == "classic" else connect
    table = str(tmp_path / "table")
    _not_null_table(table)
    src = tmp_path / "src"
    src.mkdir()
    (src / "part-000.json").write_text('{"id": 1}\n{"id": null}\n{"id": 3}\n')
    df = session.readStream.schema("id LONG").json(str(src))
    sink = TwoPhaseSink(DeltaSink(table, app_id=f"nulls-{mode}"))
    query = sink.write_stream(
        df, checkpoint_location=str(tmp_path / "chk"), trigger={"availableNow": True}
    )
    with pytest.raises(Exception, match="NullConstraintError") as raised:
        query.awaitTermination()
    assert not isinstance(raised.value, NullConstraintError)  # Spark's exception, not ours

    error = sink.failure(query)
    assert isinstance(error, NullConstraintError), error
    assert "'id'" in str(error)  # names the column (wording is the Delta sink's)
    if mode == "classic":  # the batch ran here: the very exception raised, traceback and all
        assert error.__traceback__ is not None
    else:  # rebuilt from the query's exception text, which stays attached
        assert error.__cause__ is not None and "foreachBatch" in str(error.__cause__)
    assert DeltaTable(table).version() == 0  # nothing committed
    assert ids(table) == []


class _LockedDeltaSink(DeltaSink):
    """A sink keeping a lock (which cannot pickle) in its state."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.guard = {"lock": threading.Lock()}


def test_sink_that_does_not_pickle_is_refused_before_the_query_starts(spark, tmp_path):
    src, chk = make_source(tmp_path, 1), tmp_path / "chk"
    sink = TwoPhaseSink(_LockedDeltaSink(str(tmp_path / "table")))
    with pytest.raises(ConfigurationError, match=r"TwoPhaseSink\.sink\.guard\['lock'\] \(_thread"):
        sink.write_stream(file_stream(spark, src), checkpoint_location=str(chk))
    assert not (chk / "metadata").exists()  # never started


def test_prepared_delta_sink_pickles(spark, tmp_path):
    """What Connect ships: a TwoPhaseSink whose DeltaSink has been prepared (table opened)."""
    from pyspark import cloudpickle

    table = str(tmp_path / "table")
    TwoPhaseSink(DeltaSink(table, app_id="p")).write(spark.range(0, 3))  # the table exists
    sink = TwoPhaseSink(DeltaSink(table, app_id="p"))
    sink.write(spark.range(3, 6))  # prepared against the existing table; committer used
    copy = cloudpickle.loads(cloudpickle.dumps(sink))
    assert copy.batches == [] and copy.sink.table_uri == sink.sink.table_uri


class _ConnectLikeBatch:
    """Stands for a Connect batch DataFrame: no SparkContext; ``read.text`` answers."""

    def __init__(self, metadata_line: str) -> None:
        self.read_paths: list[str] = []
        outer = self

        class _Text:
            def first(self):
                return (metadata_line,)

        class _Reader:
            def text(self, path):
                outer.read_paths.append(path)
                return _Text()

        class _Session:
            read = _Reader()

            @property
            def sparkContext(self):
                raise AttributeError("[JVM_ATTRIBUTE_NOT_SUPPORTED] sparkContext")

        self.sparkSession = _Session()


def test_query_id_comes_from_spark_when_the_checkpoint_is_unreadable_here():
    from framework.spark._two_phase import _query_id_from_checkpoint, _query_id_of_batch

    batch = _ConnectLikeBatch('{"id":"3bef8c55-0d54-42c1-b324-c59583e3968d"}')
    assert _query_id_of_batch(batch) is None
    # No fsspec implementation for this scheme in this process: Spark reads it.
    checkpoint = "nosuchscheme://bucket/chk/"
    assert _query_id_from_checkpoint(checkpoint, batch) == "3bef8c55-0d54-42c1-b324-c59583e3968d"
    assert batch.read_paths == ["nosuchscheme://bucket/chk/metadata"]
