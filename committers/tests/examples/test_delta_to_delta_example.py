"""examples/delta_to_delta.py on the test session's Spark (its killed runs are processes of
their own: one killed right after Spark wrote offsets/0, one before a later batch's commit):
the target table must hold exactly the expected rows, each once, for two readers."""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest

from committers.tests._spark_helpers import TEST_JVM_OPTIONS

pytestmark = [pytest.mark.spark]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "delta_to_delta.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("delta_to_delta_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_the_pipeline_survives_its_killed_driver_with_every_row_once(spark, tmp_path, monkeypatch):
    # The example's killed drivers are JVMs of their own: the suite's settings (C1, serial GC).
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", TEST_JVM_OPTIONS)
    example = load_example()
    outcome = example.run(spark, tmp_path)

    assert outcome.killed_exit_codes == [-signal.SIGKILL, -signal.SIGKILL]
    assert outcome.rows == outcome.expected == outcome.duckdb_rows
    assert len(outcome.expected) == len(set(outcome.expected)) > 100
    # Two files per append (two days), two files per batch: one batch per append.
    assert outcome.txn_version == example.FIRST_APPENDS + example.LATER_APPENDS - 1
    assert example.report(outcome)
