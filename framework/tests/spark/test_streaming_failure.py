"""Failed streaming queries: the sink's own exception class is what users get back, from
``TwoPhaseSink.failure(query)``; Py4J's extra copy of our errors is dropped from the log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from framework import TwoPhaseSink
from framework.errors import (
    ConcurrentWriterError,
    NullConstraintError,
    RecordTooLargeError,
    SinkError,
)
from framework.sink import Sink, SinkWriter, WriterContext
from framework.spark._errors import (
    OwnSinkErrorLogFilter,
    mark_reported,
    sink_error_in_text,
    translate_task_error,
)

# -- reading our errors out of Spark's texts ------------------------------------------------

CLASSIC_TEXT = """\
An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/py4j/clientserver.py", line 644, in _call_proxy
    return_value = getattr(self.pool[obj_id], method)(*params)
  File "/repo/framework/spark/_two_phase.py", line 531, in __call__
    raise ConcurrentWriterError(f"two writers: {app_id}")
framework.errors.ConcurrentWriterError: two writers use app id 'orders'

=== Streaming Query ===
Identifier: [id = 0f1e, runId = 77aa]
Logical Plan:
~WriteToMicroBatchDataSourceV1 ForeachBatchSink, 0f1e, Append
"""

CONNECT_TEXT = """\
(STREAM_FAILED) [PYTHON_EXCEPTION] [session: 95b8] [userId: ] Found error inside foreachBatch \
Python process: Traceback (most recent call last):
  File "/repo/framework/spark/_two_phase.py", line 392, in _run_epoch
    committables, rows = self._stage(df, epoch)
pyspark.errors.exceptions.connect.SparkRuntimeException: [USER_RAISED_EXCEPTION] \
NullConstraintError: NOT NULL column 'id' is violated by a row with id = NULL. SQLSTATE: P0001

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/repo/framework/spark/_two_phase.py", line 531, in __call__
framework.errors.NullConstraintError: NOT NULL column 'id' is violated by a row with id = NULL. \
(raised in a Spark task)
 SQLSTATE: 38000
=== Streaming Query ===
"""


@pytest.mark.parametrize(
    ("text", "cls", "message"),
    [
        (CLASSIC_TEXT, ConcurrentWriterError, "two writers use app id 'orders'"),
        (CONNECT_TEXT, NullConstraintError, "NOT NULL column 'id' is violated by a row with id"),
    ],
)
def test_sink_error_is_read_from_a_failed_querys_text(text, cls, message):
    error = sink_error_in_text(text, origin="streaming query 0f1e")
    assert type(error) is cls
    assert message in str(error)
    assert "SQLSTATE" not in str(error)
    assert str(error).endswith("(raised in streaming query 0f1e)")
    assert "(raised in a Spark task)" not in str(error)


def test_only_framework_error_classes_followed_by_a_message_count():
    noise = (
        "ValueError: RecordTooLargeError is not raised here\n"  # a foreign class
        "KeyError: 'id'\n"
        "some.module.FooError: not ours\n"  # not a class of framework.errors
        'raise RecordTooLargeError("the source line, not the exception line")\n'
        "ThrottledErrorCount: 3\n"  # a longer name
    )
    assert sink_error_in_text(noise, origin="q") is None
    error = sink_error_in_text(noise + "framework.errors.RecordTooLargeError: 2 MiB\n", origin="q")
    assert type(error) is RecordTooLargeError and str(error) == "2 MiB (raised in q)"


class SourceGoneError(SinkError):
    """A SinkError subclass outside framework.errors, as a connector defines its own."""


def test_sink_error_subclasses_are_read_by_their_module_when_it_is_imported():
    """An error raised in Spark's Python streaming-source worker names its class by module
    (``committers.delta.read._stream.SourceTableChangedError: ...``)."""
    text = (
        "[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source "
        "perform latestOffset: Traceback (most recent call last):\n"
        '  File "/repo/committers/delta/read/_stream.py", line 464, in _appended\n'
        f"{__name__}.SourceGoneError: version 3 removes 1 data file(s)\n"
        " SQLSTATE: 38000 SQLSTATE: XXKST\n"
    )
    error = sink_error_in_text(text, origin="streaming query q")
    assert type(error) is SourceGoneError
    assert str(error) == "version 3 removes 1 data file(s) (raised in streaming query q)"
    # A module this process has not imported is not imported because of a text; a class that
    # is no SinkError does not count.
    foreign = "not.imported.anywhere.GoneError: x\njson.JSONDecodeError: y\n"
    assert sink_error_in_text(foreign, origin="q") is None


def test_translate_task_error_keeps_its_contract():
    ours = NullConstraintError("x")
    assert translate_task_error(ours) is ours
    foreign = RuntimeError("nothing of ours")
    assert translate_task_error(foreign) is foreign
    wrapped = RuntimeError("Traceback ...\nframework.errors.NullConstraintError: id is null")
    translated = translate_task_error(wrapped)
    assert type(translated) is NullConstraintError
    assert str(translated) == "id is null (raised in a Spark task)"
    assert translated.__cause__ is wrapped


def _record(exc: BaseException | None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("py4j.clientserver", logging.ERROR, "", 0, "boom", (), exc_info)


def test_log_filter_drops_only_the_errors_our_function_raised():
    reported = NullConstraintError("ours, raised by the foreachBatch function")
    mark_reported(reported)
    log_filter = OwnSinkErrorLogFilter()
    assert not log_filter.filter(_record(reported))
    assert log_filter.filter(_record(NullConstraintError("a SinkError from somewhere else")))
    assert log_filter.filter(_record(RuntimeError("not ours")))
    assert log_filter.filter(_record(None))


# -- on Spark: a tiny sink whose writers reject some rows -----------------------------------


class _PickyWriter(SinkWriter[pa.RecordBatch, None]):
    def write(self, batch: pa.RecordBatch) -> None:
        column = batch.column(0)
        if column.null_count:
            raise NullConstraintError("null in column 'id'")
        if -1 in column.to_pylist():
            raise RuntimeError("the destination fell over")

    def prepare_commit(self, flush: bool) -> list[None]:
        return []


class PickySink(Sink[pa.RecordBatch, None, None]):
    """At-least-once shaped (no committer): rejects a null id with NullConstraintError, and
    fails with a RuntimeError (not a SinkError) on id -1."""

    def create_writer(self, context: WriterContext) -> _PickyWriter:
        return _PickyWriter()


def _source(tmp_path: Path, rows: list[int | None]) -> Path:
    directory = tmp_path / "src"
    directory.mkdir()
    (directory / "part-000.json").write_text("".join(json.dumps({"id": i}) + "\n" for i in rows))
    return directory


def _run(spark, sink: TwoPhaseSink, source: Path, tmp_path: Path):
    df = spark.readStream.schema("id LONG").json(str(source))
    query = sink.write_stream(
        df, checkpoint_location=str(tmp_path / "chk"), trigger={"availableNow": True}
    )
    try:
        query.awaitTermination()
    except Exception as err:
        return query, err
    return query, None


@pytest.mark.spark
def test_failed_query_gives_back_the_sinks_own_exception(spark, tmp_path, caplog):
    sink = TwoPhaseSink(PickySink())
    with caplog.at_level(logging.ERROR):
        query, raised = _run(spark, sink, _source(tmp_path, [1, None, 3]), tmp_path)
    assert raised is not None and not isinstance(raised, SinkError)
    assert "NullConstraintError: null in column 'id'" in str(raised)

    error = sink.failure(query)
    assert type(error) is NullConstraintError
    assert error is sink.failure(query)  # the exception the batch raised in this process
    assert error.__traceback__ is not None and error.__cause__ is not None
    # Py4J's copy of the traceback is dropped from the log; Spark's exception still has it.
    py4j_records = [r for r in caplog.records if r.name == "py4j.clientserver"]
    assert not [r for r in py4j_records if r.exc_info and r.exc_info[1] is error], py4j_records

    # Any other object reads it from the query's exception text: same class and message.
    parsed = TwoPhaseSink(PickySink()).failure(query)
    assert type(parsed) is NullConstraintError
    assert str(parsed) == f"null in column 'id' (raised in streaming query {query.id})"


@pytest.mark.spark
def test_no_sink_error_means_none_and_foreign_errors_stay_logged(spark, tmp_path, caplog):
    sink = TwoPhaseSink(PickySink())
    done, raised = _run(spark, sink, _source(tmp_path, [1, 2]), tmp_path)
    assert raised is None and sink.failure(done) is None
    assert [b.status for b in sink.batches] == ["delivered"]

    other = tmp_path / "other"
    other.mkdir()
    with caplog.at_level(logging.ERROR):
        failed, raised = _run(spark, sink, _source(other, [1, -1]), other)
    assert raised is not None and "the destination fell over" in str(raised)
    assert sink.failure(failed) is None
    logged = [r for r in caplog.records if r.name == "py4j.clientserver" and r.exc_info]
    assert logged, "Py4J's record of an error that is not ours must stay"
    assert "the destination fell over" in "".join(str(r.exc_info[1]) for r in logged)
