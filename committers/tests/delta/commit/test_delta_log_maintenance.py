"""Checkpoints and expired-log clean-up on a worker thread (``_log_maintenance``): due at the
table's interval, never waited for by a commit, failures logged and retried."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from committers.delta.commit import _log_maintenance
from committers.delta.commit._log_maintenance import LogMaintenance
from committers.delta.storage._storage import TableLocation

REPO_ROOT = Path(__file__).resolve().parents[4]

ROWS = pa.table({"id": [1]})


def table_with_versions(root: Path, versions: int, configuration=None) -> str:
    uri = str(root)
    write_deltalake(uri, ROWS, configuration=configuration)
    for _ in range(versions - 1):
        write_deltalake(uri, ROWS, mode="append")
    return uri


def last_checkpoint(uri: str) -> int | None:
    path = Path(uri) / "_delta_log" / "_last_checkpoint"
    return json.loads(path.read_text())["version"] if path.exists() else None


def test_checkpoint_written_in_the_background_while_the_commit_returns(tmp_path, monkeypatch):
    uri = table_with_versions(tmp_path / "t", 5)
    started, release = threading.Event(), threading.Event()
    original = DeltaTable.create_checkpoint

    def slow_checkpoint(self):
        started.set()
        release.wait(30)
        return original(self)

    monkeypatch.setattr(DeltaTable, "create_checkpoint", slow_checkpoint)
    maintenance = LogMaintenance(TableLocation.of(uri))
    config = {"delta.checkpointInterval": "2"}
    maintenance.committed(3, config)  # not due: no multiple of 2 crossed since nothing
    assert not started.wait(0.2)
    maintenance.committed(4, config)  # due: returns at once, the worker is held up
    assert started.wait(30)
    assert last_checkpoint(uri) is None
    maintenance.committed(5, config)  # a commit meanwhile is not held up either
    release.set()
    assert maintenance.wait_idle(30)
    assert last_checkpoint(uri) == 4
    assert DeltaTable(uri).version() == 4


def test_failed_checkpoint_is_logged_and_retried(tmp_path, monkeypatch, caplog):
    uri = table_with_versions(tmp_path / "t", 3)
    monkeypatch.setattr(_log_maintenance, "FIRST_RETRY_DELAY", 0.05)
    original, calls = DeltaTable.create_checkpoint, []

    def flaky(self):
        calls.append(self.version())
        if len(calls) == 1:
            raise OSError("storage unavailable")
        return original(self)

    monkeypatch.setattr(DeltaTable, "create_checkpoint", flaky)
    maintenance = LogMaintenance(TableLocation.of(uri))
    with caplog.at_level(logging.WARNING, logger="committers.delta"):
        maintenance.committed(2, {"delta.checkpointInterval": "2"})
        assert maintenance.wait_idle(30)
    assert maintenance.failures == 1 and len(calls) == 2
    assert "storage unavailable" in caplog.text
    assert last_checkpoint(uri) == 2


def test_expired_log_cleanup_every_n_versions_and_its_opt_out(tmp_path):
    retention = {"delta.logRetentionDuration": "interval 0 seconds"}
    uri = table_with_versions(tmp_path / "t", 5, configuration=retention)
    DeltaTable(uri).create_checkpoint()  # at 4: versions before it may expire
    maintenance = LogMaintenance(TableLocation.of(uri), cleanup_every=2)
    maintenance.committed(3, {**retention, "delta.enableExpiredLogCleanup": "false"})
    maintenance.committed(4, {**retention, "delta.enableExpiredLogCleanup": "false"})
    assert maintenance.wait_idle(30)
    log_dir = Path(uri) / "_delta_log"
    assert (log_dir / f"{0:020d}.json").exists()
    maintenance.committed(6, retention)
    assert maintenance.wait_idle(30)
    assert not (log_dir / f"{0:020d}.json").exists()
    assert DeltaTable(uri).version() == 4
    assert len(DeltaTable(uri).to_pyarrow_table()) == 5


def test_a_process_exiting_during_a_background_checkpoint_exits_cleanly(s3, bucket):
    """A streaming committer is never closed, so a job can end while its worker is inside
    delta-rs writing a checkpoint on S3; that native call still running while the interpreter
    finalised crashed the process with SIGSEGV (seven exits in ten). Now the exit waits for
    the step: every exit is clean, and the checkpoint it waited for is there."""
    uri = f"s3://{bucket}/exit-during-checkpoint"
    options = s3.storage_options()
    for part in range(30):
        write_deltalake(uri, pa.table({"id": [part]}), mode="append", storage_options=options)
    codes = []
    for delay in (0.0, 0.01, 0.05, 0.1, 0.2):
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "committers.tests._exit_during_checkpoint_driver",
                uri,
                json.dumps(options),
                str(delay),
            ],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=120,
        )
        codes.append((run.returncode, run.stderr[-2000:]))
    assert [code for code, _ in codes] == [0] * 5, codes
    table = DeltaTable(uri, storage_options=options)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == list(range(30))
    checkpoint = json.loads(
        TableLocation.of(uri, options)
        .filesystem()
        .cat_file(f"{bucket}/exit-during-checkpoint/_delta_log/_last_checkpoint")
    )
    assert checkpoint["version"] == 29
