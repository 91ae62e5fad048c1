"""Options and calls the sinks refuse before touching anything: the exact error, and no table,
checkpoint or staged file left behind."""

from __future__ import annotations

from typing import Any

import pytest

from committers.delta import DeltaSink, WriterOptions
from committers.delta.write import UpsertSpec
from committers.tests._spark_helpers import file_stream, make_source
from framework import TwoPhaseSink
from framework.errors import ConfigurationError
from framework.sink import GlobalCommitter, Sink


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"table_uri": ""}, "table_uri must be a non-empty string, got ''"),
        ({"table_uri": 42}, "table_uri must be a non-empty string, got 42"),
        ({"app_id": "a\nb"}, "app_id must not contain control characters: 'a\\\\nb'"),
        ({"app_id": "  "}, "app_id must be a non-empty string or None"),
        ({"staging": "jvm"}, "staging must be 'auto', 'spark' or 'arrow', got 'jvm'"),
        ({"user_metadata": 7}, "user_metadata must be a string, got 7"),
        (
            {"table_configuration": {"delta.columnMapping.mode": "name"}},
            "the sink cannot create a column-mapped table",
        ),
        (
            {"table_configuration": {"delta.enableInCommitTimestamps": "true"}},
            "the sink cannot create a table with in-commit timestamps",
        ),
    ],
)
def test_delta_sink_options_are_checked_at_construction(tmp_path, kwargs, message):
    arguments: dict[str, Any] = {"table_uri": str(tmp_path / "t"), **kwargs}
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DeltaSink(arguments.pop("table_uri"), **arguments)
    assert not (tmp_path / "t").exists()


class _NoSerializerSink(Sink[Any, Any, Any]):
    """A sink with a global committer but no way to ship committables to it."""

    def create_writer(self, context):  # pragma: no cover - never reached
        raise AssertionError("no writer may run")

    def create_global_committer(self) -> GlobalCommitter[Any, Any]:
        class _Committer(GlobalCommitter[Any, Any]):
            def is_committed(self, epoch):
                return False

            def combine(self, epoch, committables):
                return committables

            def commit(self, global_committables):
                return []

        return _Committer()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sink": object()}, "TwoPhaseSink needs a framework Sink, got object"),
        ({"on_checkpoint_reset": "ignore"}, "on_checkpoint_reset must be 'error' or 'continue'"),
        ({"commit_attempts": 0}, "commit_attempts must be >= 1, got 0"),
    ],
)
def test_two_phase_sink_options_are_checked_at_construction(tmp_path, kwargs, message):
    arguments: dict[str, Any] = {"sink": DeltaSink(str(tmp_path / "t")), **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        TwoPhaseSink(arguments.pop("sink"), **arguments)


@pytest.mark.spark
def test_write_calls_refuse_the_wrong_kind_of_dataframe_and_missing_checkpoints(spark, tmp_path):
    sink = TwoPhaseSink(DeltaSink(str(tmp_path / "t")))
    bounded = spark.range(3)
    stream = file_stream(spark, make_source(tmp_path, 1))
    with pytest.raises(ConfigurationError, match=r"write_stream needs a streaming DataFrame"):
        sink.write_stream(bounded, checkpoint_location=str(tmp_path / "c"))
    with pytest.raises(ConfigurationError, match=r"write needs a bounded DataFrame"):
        sink.write(stream)
    with pytest.raises(ConfigurationError, match="checkpoint_location is required"):
        sink.write_stream(stream, checkpoint_location="")
    with pytest.raises(TypeError, match="epoch_id"):
        sink.write(bounded, epoch=3)  # misspelt: the message names the close match
    assert not spark.streams.active
    assert not (tmp_path / "t").exists() and not (tmp_path / "c").exists()


@pytest.mark.spark
def test_a_global_committer_without_a_serializer_is_refused(spark, tmp_path):
    with pytest.raises(ConfigurationError, match="has a global committer but no committable"):
        TwoPhaseSink(_NoSerializerSink()).write(spark.range(3))


def test_delta_sink_takes_its_writer_and_upsert_options_as_values(tmp_path):
    """``writer_options=`` and ``upsert=`` give the same sink as the keywords they stand for."""
    uri = str(tmp_path / "t")
    by_keywords = DeltaSink(
        uri,
        target_file_size=1 << 20,
        compression="zstd",
        mode="upsert",
        keys="id",
        sequence_by=["ts", "lsn"],
        delete_when="op = 'D'",
        partial_updates=True,
    )
    by_values = DeltaSink(
        uri,
        writer_options=WriterOptions(target_file_size=1 << 20, compression="zstd"),
        mode="upsert",
        upsert=UpsertSpec(
            keys=["id"], sequence_by=("ts", "lsn"), delete_when="op = 'D'", partial_updates=True
        ),
    )
    assert (
        by_values.options
        == by_keywords.options
        == WriterOptions(target_file_size=1 << 20, compression="zstd")
    )
    assert by_values._upsert_spec == by_keywords._upsert_spec
    assert by_values._upsert_spec == UpsertSpec(("id",), ("ts", "lsn"), "op = 'D'", True)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"writer_options": WriterOptions(), "target_file_size": 1 << 20},
            "target_file_size given both as keyword and through writer_options",
        ),
        ({"writer_options": {"compression": "zstd"}}, "writer_options must be a WriterOptions"),
        ({"upsert": UpsertSpec(keys=("id",))}, "upsert=UpsertSpec(...) needs mode='upsert'"),
        (
            {"mode": "upsert", "upsert": UpsertSpec(keys=("id",)), "keys": ["id"]},
            "keys given both as keyword and through upsert=UpsertSpec(...)",
        ),
        ({"mode": "upsert", "upsert": {"keys": ["id"]}}, "upsert must be an UpsertSpec"),
    ],
)
def test_option_values_clashing_with_keywords_are_refused(tmp_path, kwargs, message):
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DeltaSink(str(tmp_path / "t"), **kwargs)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": ()}, r"mode='upsert' needs keys=\[...\]"),
        ({"keys": ("id", "ID")}, r"keys lists a column twice: \['id', 'ID'\]"),
        ({"keys": ("id",), "sequence_by": ("ID",)}, r"sequence_by names key column\(s\) \['id'\]"),
        ({"keys": ("id",), "sequence_by": []}, "sequence_by must be a column name or a non-empty"),
        ({"keys": ("id",), "delete_when": ""}, "delete_when must be a Spark SQL predicate"),
        ({"keys": ("id",), "partial_updates": "yes"}, "partial_updates must be True or False"),
    ],
)
def test_an_upsert_spec_is_checked_when_it_is_made(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        UpsertSpec(**kwargs)
