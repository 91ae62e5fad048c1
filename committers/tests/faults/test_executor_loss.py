"""Executor loss on a multi-process cluster (``local-cluster[2,1,1024]``: executor JVMs and
their Python workers are processes of their own). An executor is SIGKILLed, Python workers
included, while it stages; Spark reschedules its tasks and the table ends exact, with no file
of the dead attempt left."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.tests._delta_helpers import committed_files, data_files_on_disk, staging_leftovers
from committers.tests._executor_loss_driver import ROWS
from committers.tests._readers import duckdb_rows

# Kills processes: runs in its own pytest-xdist worker, beside the rest (`make test`).
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.xdist_group("kills_processes")]

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("staging", ["spark", "arrow"])
def test_an_executor_lost_while_staging_leaves_the_table_exact(tmp_path, staging):
    table = str(tmp_path / "table")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "committers.tests._executor_loss_driver",
            table,
            staging,
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "SPARK_LOCAL_IP": "127.0.0.1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "KILLED EXECUTOR" in done.stdout, done.stdout
    assert f"ROWS {ROWS} " in done.stdout
    expected = Counter(range(ROWS))
    assert Counter(DeltaTable(table).to_pyarrow_table().column("id").to_pylist()) == expected
    assert Counter(row["id"] for row in duckdb_rows(table)) == expected
    # The clean-up after the commit deleted what the dead attempt had started.
    assert data_files_on_disk(table) == committed_files(table)
    assert staging_leftovers(table) == []
