"""Speculative execution on a real multi-host standalone cluster (see ``_standalone_cluster``):
two attempts of one task write the same rows at the same time, and the table still holds
every row exactly once, under both staging strategies.

The job runs in a driver process of its own (``_speculation_driver``): one SparkContext per
process, and this test session already has a local one.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.tests._readers import duckdb_rows
from committers.tests._standalone_cluster import StandaloneCluster, standalone_cluster

# Kills processes: runs in its own pytest-xdist worker, beside the rest (`make test`).
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("kills_processes")]

ROOT = Path(__file__).resolve().parents[3]
ROWS = 2000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), workers=2) as running:
        yield running


@pytest.mark.parametrize("staging", ["spark", "arrow"])
def test_a_speculative_copy_racing_its_original_commits_every_row_once(
    cluster: StandaloneCluster, tmp_path: Path, staging: str
) -> None:
    table, markers = tmp_path / "table", tmp_path / "markers"
    markers.mkdir()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "committers.tests._speculation_driver",
            cluster.master_url,
            str(table),
            str(markers),
            staging,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"STATUS committed ROWS {ROWS}" in done.stdout

    # Both attempts of task 0 got past the barrier: two attempts really wrote its rows.
    assert {p.name for p in markers.iterdir()} >= {"passed-0-0", "passed-0-1"}
    delta = DeltaTable(str(table))
    ids = sorted(delta.to_pyarrow_table(columns=["id"]).column("id").to_pylist())
    assert ids == list(range(ROWS))
    assert sorted(row["id"] for row in duckdb_rows(str(table))) == list(range(ROWS))
    # No file of the losing attempt remains, and nothing is left staged.
    committed = {Path(uri).resolve() for uri in delta.file_uris()}
    on_disk = {p.resolve() for p in table.rglob("*.parquet") if "_delta_log" not in p.parts}
    assert on_disk == committed
    assert not [p for p in table.rglob("*") if "_temporary" in p.as_posix()]
    assert list((table / "_sink_staging").rglob("*")) == []
