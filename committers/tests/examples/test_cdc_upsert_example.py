"""examples/cdc_upsert.py on the test session's Spark (its killed run is a process of its own):
the table it leaves must be exactly the final state of its change feed."""

from __future__ import annotations

import importlib.util
import signal
import sys
from pathlib import Path
from types import ModuleType

import pytest

from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import TEST_JVM_OPTIONS

pytestmark = [pytest.mark.spark]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "cdc_upsert.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cdc_upsert_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_the_cdc_example_survives_its_killed_driver_with_the_exact_final_state(
    spark, tmp_path, monkeypatch
):
    # The example's killed drivers are JVMs of their own: the suite's settings (C1, serial GC).
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", TEST_JVM_OPTIONS)
    example = load_example()
    outcome = example.run(spark, tmp_path)

    assert outcome.killed_exit_code == -signal.SIGKILL
    first, restarted = outcome.runs
    assert first == [(b, "committed") for b in range(example.FIRST_RUN_FILES)]
    batches = range(example.FIRST_RUN_FILES, example.FIRST_RUN_FILES + example.LATER_FILES)
    assert restarted == [(b, "committed") for b in batches]
    assert outcome.txn_version == batches[-1]
    assert outcome.rows == outcome.expected and len(outcome.expected) > 20
    table = str(tmp_path / "customers")
    columns = example.COLUMNS
    assert sorted(tuple(r[c] for c in columns) for r in duckdb_rows(table)) == outcome.expected
    assert example.report(outcome)
