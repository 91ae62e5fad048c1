"""Zombie drivers: a driver frozen (SIGSTOP of its whole process tree) in the middle of a
batch, a new driver started on the same checkpoint that finishes the batches, then the old one
resumed (SIGCONT). Nothing may be duplicated or lost, and the old driver must fail, not go on
writing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.delta.storage._storage import TableLocation
from committers.delta.table._table import remove_orphan_files
from committers.tests._delta_helpers import committed_files, data_files_on_disk, staging_leftovers
from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import make_source
from framework._crash import LOG_VARIABLE, PAUSE_VARIABLE

# Kills processes: runs in its own pytest-xdist worker, beside the rest (`make test`).
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.xdist_group("kills_processes")]

REPO_ROOT = Path(__file__).resolve().parents[3]
FILES, PER_FILE = 3, 10


def start_driver(src: Path, table: str, checkpoint: Path, log: Path, pause_at: str | None):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), LOG_VARIABLE: str(log)}
    env.pop(PAUSE_VARIABLE, None)
    if pause_at:
        env[PAUSE_VARIABLE] = pause_at
    command = [sys.executable, "-m", "committers.tests._campaign_driver"]
    return subprocess.Popen(
        [*command, str(src), table, str(checkpoint), "auto", "0", "json"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_pause(process: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and "PAUSE AT" in log.read_text():
            time.sleep(0.5)  # the SIGSTOP follows the line
            return
        if process.poll() is not None:
            raise AssertionError(f"driver ended before pausing:\n{process.stderr.read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError("driver never reached the pause")


# Between staging and commit, and at the start of the commit. (After the commit, the zombie
# only has clean-up left: `make campaign`'s after_commit kills cover the successor's side.)
@pytest.mark.parametrize("step", ["before_commit", "commit_write"])
def test_a_resumed_zombie_driver_fails_and_the_table_stays_exact(tmp_path, step):
    src = make_source(tmp_path, FILES, per_file=PER_FILE)
    table, checkpoint = str(tmp_path / "table"), tmp_path / "checkpoint"
    zombie = start_driver(src, table, checkpoint, tmp_path / "zombie.log", f"{step}@1")
    try:
        wait_for_pause(zombie, tmp_path / "zombie.log")
        successor = start_driver(src, table, checkpoint, tmp_path / "successor.log", None)
        _, err = successor.communicate(timeout=300)
        assert successor.returncode == 0, err[-3000:]
    finally:
        os.killpg(zombie.pid, signal.SIGCONT)
    _, zombie_err = zombie.communicate(timeout=300)

    # The zombie does not carry on as if nothing happened: Spark finds the batch it was
    # running recorded by another run of the query and stops it (after the sink found the
    # batch in the table and committed nothing of its own).
    assert zombie.returncode != 0
    assert "[CONCURRENT_STREAM_LOG_UPDATE]" in zombie_err, zombie_err[-3000:]
    assert "Multiple streaming jobs detected for 1" in zombie_err

    expected = Counter(range(FILES * PER_FILE))
    assert Counter(DeltaTable(table).to_pyarrow_table().column("id").to_pylist()) == expected
    assert Counter(row["id"] for row in duckdb_rows(table)) == expected
    assert DeltaTable(table).transaction_version("campaign") == FILES - 1
    location = TableLocation.of(table)
    remove_orphan_files(location, retention_seconds=0, unsafe_allow_short_retention=True)
    assert data_files_on_disk(table) == committed_files(table)
    assert staging_leftovers(table) == []
