"""delta-spark and the sink writing the same table at the same time, in the session's JVM.

The race is made deterministic by a hook between the sink's read of the snapshot and its
commit: delta-spark's operation runs there, so it commits first and the sink's commit must
reconcile with it as Delta's conflict rules say (an append lands on top, an upsert whose files
another commit removed is computed again on the newer snapshot). The other order, delta-spark's
MERGE losing the race to the sink's append, is held open by a gate inside the MERGE's source.
Each case checks exact rows with delta-spark and a delta-rs based reader."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from committers.tests._delta_helpers import interfering
from committers.tests._delta_spark import assert_all_read, comparable
from committers.tests._log_races import race_before_write
from committers.tests.delta.interop.test_interop_delta_spark_write import (
    ROWS,
    _append,
    _create,
    _log_version,
    _upsert,
)

pytestmark = pytest.mark.spark


def _commit(uri: str, version: int) -> dict:
    """The ``commitInfo`` of ``version``."""
    path = Path(uri) / "_delta_log" / f"{version:020d}.json"
    (info,) = [
        a["commitInfo"] for a in map(json.loads, path.read_text().splitlines()) if "commitInfo" in a
    ]
    return info


def _is_ours(info: dict) -> bool:
    return "sink.runId" in info


def _rows(*pairs: tuple[int, int]) -> list[dict]:
    return comparable([{"id": i, "v": v} for i, v in pairs])


def test_appends_from_both_land_once(delta_spark, tmp_path, monkeypatch):
    """delta-spark's INSERT commits between the sink's probe of the log and its write of the
    next version: appends never conflict, so the sink's put-if-absent loses, it reads the new
    commit and lands on top of it; both rows are there once, and delta-spark then appends on
    top of the sink's commit."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, ROWS, "INSERT INTO {t} VALUES (1, 1)")
    race_before_write(monkeypatch, lambda: spark.sql(f"INSERT INTO delta.`{uri}` VALUES (2, 2)"))
    result = _append(uri, spark.createDataFrame([(3, 3)], ROWS))
    assert result.version == 3
    assert not _is_ours(_commit(uri, 2)) and _is_ours(_commit(uri, 3))
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (4, 4)")
    assert assert_all_read(spark, uri) == _rows((1, 1), (2, 2), (3, 3), (4, 4))


def test_appends_from_both_in_threads_land_once(delta_spark, tmp_path):
    """Both writers append in a loop at once, from two threads: every row is there once."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, ROWS)
    errors: list[BaseException] = []

    def delta_spark_inserts() -> None:
        try:
            for i in range(100, 104):
                spark.sql(f"INSERT INTO delta.`{uri}` VALUES ({i}, {i})")
        except BaseException as err:  # reported by the test thread
            errors.append(err)

    thread = threading.Thread(target=delta_spark_inserts)
    thread.start()
    for i in range(4):
        _append(uri, spark.createDataFrame([(i, i)], ROWS), app_id=f"ours{i}")
    thread.join()
    assert errors == []
    assert _log_version(uri) == 8
    expected = [(i, i) for i in [*range(4), *range(100, 104)]]
    assert assert_all_read(spark, uri) == _rows(*expected)


def _two_files(spark, uri: str) -> None:
    """A delta-spark table of ``ROWS`` in two files: ids 1, 2 and ids 3, 4."""
    _create(
        spark,
        uri,
        ROWS,
        "INSERT INTO {t} SELECT /*+ REPARTITION(1) */ * FROM VALUES (1, 1), (2, 2)",
        "INSERT INTO {t} SELECT /*+ REPARTITION(1) */ * FROM VALUES (3, 3), (4, 4)",
    )


def test_our_upsert_against_delta_spark_optimize(delta_spark, tmp_path, monkeypatch):
    """delta-spark's OPTIMIZE commits after the upsert read its snapshot and removes the file
    the upsert rewrites: the upsert's commit loses (it must land right on top of what it
    read), and it is computed again on the compacted snapshot and committed once; no update
    lost, no row doubled by the compaction."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _two_files(spark, uri)

    def optimize_by_delta_spark(call: int) -> None:
        if call == 1:
            spark.sql(f"OPTIMIZE delta.`{uri}`")

    calls = interfering(monkeypatch, optimize_by_delta_spark)
    changes = spark.createDataFrame([(1, 10, "U"), (5, 5, "I")], ROWS + ", op STRING")
    result = _upsert(uri, changes)
    assert len(calls) == 2  # the first attempt lost to OPTIMIZE; the redo committed
    assert _commit(uri, 3)["operation"] == "OPTIMIZE" and result.version == 4
    assert _commit(uri, 4)["readVersion"] == 3  # recomputed on the compacted snapshot
    assert assert_all_read(spark, uri) == _rows((1, 10), (2, 2), (3, 3), (4, 4), (5, 5))


def test_our_upsert_against_delta_spark_delete(delta_spark, tmp_path, monkeypatch):
    """delta-spark's DELETE commits after the upsert read its snapshot. In the file the upsert
    rewrites, the upsert is computed again on the newer snapshot: the deleted row stays
    deleted and the update is kept. In another file, it costs the upsert one commit attempt
    only."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _two_files(spark, uri)
    deletes = {1: "id = 2", 3: "id = 1"}  # before our 1st commit call, and before the 3rd

    def delete_by_delta_spark(call: int) -> None:
        if call in deletes:
            spark.sql(f"DELETE FROM delta.`{uri}` WHERE {deletes[call]}")

    calls = interfering(monkeypatch, delete_by_delta_spark)
    first = _upsert(uri, spark.createDataFrame([(1, 10, "U")], ROWS + ", op STRING"))
    assert len(calls) == 2 and _commit(uri, 3)["operation"] == "DELETE"
    assert first.version == 4 and _commit(uri, 4)["readVersion"] == 3  # recomputed
    assert assert_all_read(spark, uri) == _rows((1, 10), (3, 3), (4, 4))

    second = _upsert(uri, spark.createDataFrame([(3, 30, "U")], ROWS + ", op STRING"))
    assert len(calls) == 4 and _commit(uri, 5)["operation"] == "DELETE"
    assert second.version == 6 and _commit(uri, 6)["readVersion"] == 4  # not recomputed
    assert assert_all_read(spark, uri) == _rows((3, 30), (4, 4))


def test_delta_spark_merge_against_our_append(delta_spark, tmp_path, monkeypatch):
    """delta-spark's MERGE commits between the sink's probe of the log and its write: a blind
    append reads nothing MERGE changed, so it lands on top, and MERGE's update and insert are
    kept."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _two_files(spark, uri)
    race_before_write(
        monkeypatch,
        lambda: spark.sql(
            f"MERGE INTO delta.`{uri}` t USING (SELECT * FROM VALUES (1, 100), (50, 50) "
            "AS s(id, v)) s "
            "ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v "
            "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"
        ),
    )
    result = _append(uri, spark.createDataFrame([(6, 6), (60, 60)], ROWS))
    assert _commit(uri, 3)["operation"] == "MERGE" and result.version == 4
    expected = [(1, 100), (2, 2), (3, 3), (4, 4), (6, 6), (50, 50), (60, 60)]
    assert assert_all_read(spark, uri) == _rows(*expected)


def test_delta_spark_merge_that_read_before_our_append(delta_spark, tmp_path):
    """delta-spark's MERGE reads its snapshot, then the sink's append commits (recorded as a
    blind append), then MERGE tries to commit: delta-spark 4.4 refuses it with
    ConcurrentAppendException (nothing of it lands), and MERGE run again commits on top of
    the append; every row is there once. The refusal is delta-spark's rule: its only isolation
    level for data changes is Serializable, under which a MERGE that read the whole table
    conflicts with any append since, blind or not (ConflictChecker's
    checkForAddedFilesThatShouldHaveBeenReadByCurrentTxn)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _two_files(spark, uri)
    entered, gate = tmp_path / "entered", tmp_path / "gate"

    def wait_for_gate(v: int) -> int:  # runs in a Python worker, inside MERGE's job
        entered.touch()
        for _ in range(6000):
            if gate.exists():
                break
            time.sleep(0.05)
        return v

    spark.udf.register("wait_for_gate", wait_for_gate, "int")
    errors: list[BaseException] = []

    def merge_by_delta_spark() -> None:
        try:
            spark.sql(
                # One task holds the gate: the sink's append needs the other local core.
                f"MERGE INTO delta.`{uri}` t USING (SELECT /*+ COALESCE(1) */ id, "
                "wait_for_gate(v) AS v FROM VALUES (1, 100), (50, 50) AS s(id, v)) s "
                "ON t.id = s.id "
                "WHEN MATCHED THEN UPDATE SET v = s.v "
                "WHEN NOT MATCHED THEN INSERT (id, v) VALUES (s.id, s.v)"
            )
        except BaseException as err:  # reported by the test thread
            errors.append(err)

    thread = threading.Thread(target=merge_by_delta_spark)
    thread.start()
    for _ in range(6000):
        if entered.exists() or not thread.is_alive():
            break
        time.sleep(0.05)
    assert entered.exists() and errors == []
    ours = _append(uri, spark.createDataFrame([(6, 6)], ROWS))
    gate.touch()
    thread.join()
    assert ours.version == 3 and _commit(uri, 3)["isBlindAppend"] is True
    (error,) = errors
    assert "DELTA_CONCURRENT_APPEND" in str(error) and _log_version(uri) == 3
    assert assert_all_read(spark, uri) == _rows((1, 1), (2, 2), (3, 3), (4, 4), (6, 6))
    errors.clear()
    merge_by_delta_spark()  # the gate is open: run again, it reads the append
    assert errors == [] and _commit(uri, 4)["operation"] == "MERGE"
    expected = [(1, 100), (2, 2), (3, 3), (4, 4), (6, 6), (50, 50)]
    assert assert_all_read(spark, uri) == _rows(*expected)
