"""The engine-agnostic core: public surface, serializers, and independence from pyspark."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import framework
import framework.sink
from framework import errors
from framework.sink import deserialize_versioned, serialize_versioned


def test_public_surface_is_pinned():
    assert sorted(framework.__all__) == [
        "Committer",
        "Epoch",
        "GlobalCommitter",
        "Sink",
        "SinkError",
        "SinkWriter",
        "TwoPhaseSink",
        "WriterContext",
        "errors",
    ]
    assert sorted(framework.sink.__all__) == [
        "Committer",
        "Epoch",
        "GlobalCommitter",
        "InputPlan",
        "OutputMode",
        "PlannedColumn",
        "RowCheck",
        "Sink",
        "SinkWriter",
        "VersionedSerializer",
        "WriterContext",
        "deserialize_versioned",
        "serialize_versioned",
        "sql_string",
    ]


def test_runtime_and_testing_surfaces_are_pinned():
    import framework.testing

    assert sorted(framework.testing.__all__) == ["CONFORMANCE_CHECKS", "ConformanceHarness"]
    spark_init = (Path(framework.__file__).parent / "spark" / "__init__.py").read_text()
    # framework.spark imports pyspark; its surface is pinned from source, not by importing it.
    assert '__all__ = ["BatchMetrics", "TwoPhaseSink"]' in spark_init


def test_retry_toolkit_is_pinned():
    """The one retry toolkit the async writer, the uploads and the Delta commit share."""
    import framework.asyncsink
    import framework.retry

    assert sorted(framework.retry.__all__) == [
        "Backoff",
        "Classifier",
        "CommitResult",
        "ErrorClassification",
        "Verdict",
        "commit_with_reconciliation",
        "retry_call",
    ]
    # the async writer's verdict is the toolkit's, not a copy
    assert framework.asyncsink.ErrorClassification is framework.retry.ErrorClassification


def test_retry_policy_is_a_backoff_in_milliseconds():
    """The async sink's public RetryPolicy is configuration the toolkit's Backoff runs."""
    from framework.asyncsink import RetryPolicy
    from framework.retry import Backoff

    policy = RetryPolicy(
        max_attempts=4,
        initial_backoff_ms=250,
        max_backoff_ms=2_000,
        backoff_multiplier=3.0,
        jitter=0.25,
        max_retry_after_ms=9_000,
    )
    assert policy.backoff() == Backoff(
        max_attempts=4,
        initial_delay=0.25,
        max_delay=2.0,
        multiplier=3.0,
        jitter=0.25,
        deadline=None,
        max_retry_after=9.0,
    )


def test_connector_apis_are_pinned():
    """What connectors may use of the framework beyond its packages' APIs: the engine-agnostic
    helpers and the Spark runtime's (pinned from source: importing it imports pyspark)."""
    import framework.connector

    assert sorted(framework.connector.__all__) == [
        "check_row_count",
        "crash_point",
        "crash_with_workers",
        "refuse_unknown_options",
    ]
    source = (Path(framework.__file__).parent / "spark" / "connector.py").read_text()
    assigned = next(
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__"
    )
    assert sorted(ast.literal_eval(assigned)) == [
        "AdmissionLimit",
        "BoundedSourceReader",
        "FileDiscovery",
        "FileStreamReader",
        "PlansEachBatch",
        "SinkBatchWriter",
        "SinkStreamWriter",
        "SparkStager",
        "StagesWithSpark",
        "apply_input_plan",
        "arrow_schema_of",
        "compiled_class",
        "is_connect_dataframe",
        "new_instance",
        "parquet_files",
        "register_data_source",
        "staging_job_group",
        "translate_task_error",
        "wait_for_tasks_to_end",
    ]


def test_core_imports_without_pyspark_or_deltalake():
    code = (
        "import sys\n"
        "sys.modules['pyspark'] = None\n"
        "sys.modules['deltalake'] = None\n"
        "import framework, framework.sink, framework.errors, framework.connector\n"
        "assert 'pyspark' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_every_error_descends_from_sink_error():
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.SinkError), name
    # "retry" and "reconcile" are different branches of the tree, never one another.
    assert not issubclass(errors.CommitStateUnknownError, errors.CommitConflictError)
    assert not issubclass(errors.CommitConflictError, errors.CommitStateUnknownError)
    assert not issubclass(errors.ConcurrentWriterError, errors.CommitConflictError)


class _PointV1:
    version = 1

    def serialize(self, obj):
        return json.dumps({"x": obj[0]}).encode()

    def deserialize(self, version, data):
        return (json.loads(data)["x"], 0)


class _PointV2:
    """Version 2 adds a field and still reads what version 1 wrote."""

    version = 2

    def serialize(self, obj):
        return json.dumps({"x": obj[0], "y": obj[1]}).encode()

    def deserialize(self, version, data):
        raw = json.loads(data)
        if version == 1:
            return (raw["x"], 0)
        return (raw["x"], raw["y"])


def test_versioned_round_trip_and_old_versions_stay_readable():
    assert deserialize_versioned(_PointV2(), serialize_versioned(_PointV2(), (3, 4))) == (3, 4)
    written_by_v1 = serialize_versioned(_PointV1(), (7, 99))
    assert deserialize_versioned(_PointV2(), written_by_v1) == (7, 0)


def test_newer_version_than_reader_is_a_clear_error():
    written_by_v2 = serialize_versioned(_PointV2(), (1, 2))
    with pytest.raises(errors.SinkError, match="newer than this release reads"):
        deserialize_versioned(_PointV1(), written_by_v2)


@pytest.mark.parametrize("cut", [0, 3, 9])
def test_truncated_data_is_a_clear_error(cut):
    data = serialize_versioned(_PointV1(), (1, 0))[:cut]
    with pytest.raises(errors.SinkError, match=r"too short|truncated"):
        deserialize_versioned(_PointV1(), data)
