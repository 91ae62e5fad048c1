"""A Delta-to-Delta relay (``"deltalake"`` source and writer) killed again and again while its
source table keeps growing: the target must end up with every source row exactly once.

Table A gets a delta-rs commit every 0.4 s (up to ``MAX_COMMITS``). A child process streams A into B
(``_relay_driver.py``) and is SIGKILLed, whole process group, three times: right after Spark
wrote ``offsets/0`` (before the first batch commits), right after B's next commit, and at a
random moment. A is compacted while the stream is down. A last run in this process finishes
with ``availableNow``. B is read back by deltalake and DuckDB.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from committers.tests._campaign import start_driver
from committers.tests._readers import duckdb_rows
from committers.tests._relay_driver import relay

pytestmark = [pytest.mark.spark]

COMMIT_INTERVAL_SECONDS = 0.4
ROWS_PER_COMMIT = 40
MAX_COMMITS = 30  # of the appender thread: the last run's work stays small
RUN_TIMEOUT_SECONDS = 240
RANDOM_KILL_WINDOW = (1.0, 12.0)  # seconds after the start: Spark's start-up, batches


class _Appender:
    """Appends ``ROWS_PER_COMMIT`` fresh ids to a table every ``COMMIT_INTERVAL_SECONDS`` in a
    thread, ``MAX_COMMITS`` times at most; :meth:`paused` holds it (for a compaction)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.next_id = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.error: BaseException | None = None

    def append(self) -> None:
        with self._lock:
            ids = range(self.next_id, self.next_id + ROWS_PER_COMMIT)
            rows = pa.table({"id": pa.array(ids, pa.int64()), "s": [f"row-{i}" for i in ids]})
            write_deltalake(self.uri, rows, mode="append")
            self.next_id += ROWS_PER_COMMIT

    def _run(self) -> None:
        try:
            for _ in range(MAX_COMMITS):
                if self._stop.wait(COMMIT_INTERVAL_SECONDS):
                    return
                self.append()
        except BaseException as err:  # reported by stop()
            self.error = err

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            yield


def _run_killed(
    source: str,
    target: str,
    checkpoint: Path,
    *,
    crash_at: str | None = None,
    kill_after: float | None = None,
) -> str:
    """Run the relay as a process group of its own until a crash point (``crash_at``) or this
    process (after ``kill_after`` seconds) kills it; returns the crash log's text."""
    crash_log = checkpoint.parent / "crashes.log"
    process = start_driver(
        "committers.tests._relay_driver",
        [source, target, str(checkpoint)],
        crash_log=crash_log,
        crash_at=crash_at,
    )
    try:
        _out, err = process.communicate(timeout=kill_after or RUN_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _out, err = process.communicate()
        if kill_after is None:
            pytest.fail(f"the relay did not reach {crash_at} in {RUN_TIMEOUT_SECONDS}s:\n{err}")
    assert process.returncode == -signal.SIGKILL, err[-4000:]
    return crash_log.read_text() if crash_log.exists() else ""


def _ids(uri: str) -> list[int]:
    return DeltaTable(uri).to_pyarrow_table(columns=["id"]).column("id").to_pylist()


def test_a_relay_killed_before_its_first_commit_and_later_delivers_every_row_once(spark, tmp_path):
    source, target = str(tmp_path / "a"), str(tmp_path / "b")
    checkpoint = tmp_path / "checkpoint"
    appender = _Appender(source)
    for _ in range(6):  # the starting snapshot: six files, more than one micro-batch
        appender.append()
    appender.start()
    try:
        log = _run_killed(source, target, checkpoint, crash_at="offsets_written")
        assert "CRASH AT offsets_written" in log
        assert (checkpoint / "offsets" / "0").exists()
        assert not (checkpoint / "commits" / "0").exists()
        appender.append()  # the table moves on past the first batch's snapshot, whatever the
        with appender.paused():  # thread did meanwhile; compacted while the stream is down
            DeltaTable(source).optimize.compact()
        log = _run_killed(source, target, checkpoint, crash_at="after_commit")
        assert "CRASH AT after_commit epoch=0" in log  # the replayed first batch committed
        _run_killed(
            source, target, checkpoint, kill_after=random.Random(23).uniform(*RANDOM_KILL_WINDOW)
        )
    finally:
        appender.stop()
    DeltaTable(source).optimize.compact()
    query = relay(spark, source, target, checkpoint, available_now=True)
    query.awaitTermination()
    assert query.exception() is None

    expected = sorted(_ids(source))
    assert expected == list(range(appender.next_id))
    for ids in (_ids(target), [row["id"] for row in duckdb_rows(target)]):
        assert [i for i, n in Counter(ids).items() if n > 1] == []
        assert sorted(set(expected) - set(ids)) == []
        assert sorted(ids) == expected
