"""Upserts into tables whose files have deletion vectors, judged by delta-spark: a row a vector
deletes never comes back (not as a kept row of a rewritten file, not as a match of a change:
its key is inserted anew, once), the commit's removes name each rewritten file with its vector,
and delta-spark, DuckDB, DataFusion and ``read_table`` then read exactly the rows the changes
say. A vector another writer adds to a file between the upsert's read and its commit makes it
compute the batch again. With the change data feed on as well, ``table_changes`` reports the
live rows replaced, never a deleted one."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.delta import DeletionVectorError, DeltaSink
from committers.delta.commit import _committer
from committers.delta.spark import _upsert_touched
from committers.tests._delta_helpers import assert_no_orphans
from committers.tests._delta_spark import comparable
from committers.tests.delta.interop.test_interop_deletion_vectors_rewrite import (
    _dv_table,
    _every_reader,
    _live_vectors,
    _log,
)
from framework import TwoPhaseSink

pytestmark = pytest.mark.spark

CHANGES = "id long, s string, d double, op string"
#: Who finds the rows a change replaces: the driver (pyarrow, few small candidates) or Spark.
MATCHED_BY = pytest.mark.parametrize("matched_by", ["driver", "spark"])


def _upsert(uri: str, staging: str = "auto") -> TwoPhaseSink:
    return TwoPhaseSink(
        DeltaSink(
            uri,
            app_id="dv-upsert",
            mode="upsert",
            keys=["id"],
            delete_when="op = 'D'",
            staging=staging,
        )
    )


def _applied(before: dict[int, dict], changes: list[tuple]) -> list[dict]:
    rows = dict(before)
    for id_, s, d, op in changes:
        if op == "D":
            rows.pop(id_, None)
        else:
            rows[id_] = {"id": id_, "s": s, "d": d}
    return comparable(list(rows.values()))


def _match_in(monkeypatch, matched_by: str) -> None:
    if matched_by == "spark":
        monkeypatch.setattr(_upsert_touched, "DRIVER_MAX_FILES", 0)


@pytest.mark.parametrize(
    ("staging", "matched_by"),
    [("auto", "driver"), ("spark", "spark")],  # each way of matching, each way of keeping
)
def test_an_upsert_never_brings_back_a_deleted_row(
    delta_spark, tmp_path, monkeypatch, matched_by, staging
):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri)
    before = {r["id"]: r for r in _every_reader(spark, uri)}
    assert 3 not in before and 10 not in before  # (id % 7 = 3 was deleted by vectors)
    _match_in(monkeypatch, matched_by)
    changes = [
        (0, "0", -1.0, "U"),  # a live row, updated
        (1, "1", 0.0, "D"),  # a live row, deleted
        (3, "0", -3.0, "U"),  # a deleted row: inserted anew, once
        (10, "1", 0.0, "D"),  # a deleted row: nothing to delete
        (5000, "2", 5.0, "I"),  # a new key
    ]
    _upsert(uri, staging).write(spark.createDataFrame(changes, CHANGES))

    assert _every_reader(spark, uri) == _applied(before, changes)
    commit = _log(uri, 2)
    removed = {a["remove"]["path"]: a["remove"] for a in commit if "remove" in a}
    vectors_before = _live_vectors(uri, 1)
    assert removed and all(r["dataChange"] for r in removed.values())
    # Each remove names the logical file (path and vector) delta-spark holds live.
    assert {p: r["deletionVector"] for p, r in removed.items()} == {
        p: vectors_before[p] for p in removed
    }
    metrics = next(a["commitInfo"] for a in commit if "commitInfo" in a)["operationMetrics"]
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"]) == ("1", "1")
    assert set(_live_vectors(uri, 2)) == {p for p in vectors_before if p not in removed} | {
        a["add"]["path"] for a in commit if "add" in a
    }

    # delta-spark goes on: a DELETE (vectors on our files), a MERGE; then us again.
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id < 30")
    spark.sql(
        f"MERGE INTO delta.`{uri}` t USING (SELECT 5000L AS id, '2' AS s, 50.0D AS d) u "
        "ON t.id = u.id WHEN MATCHED THEN UPDATE SET d = u.d"
    )
    expected = {r["id"]: r for r in _applied(before, changes) if r["id"] >= 30}
    expected[5000] = {"id": 5000, "s": "2", "d": 50.0}
    assert _every_reader(spark, uri) == comparable(list(expected.values()))
    again = [(5000, "2", 7.0, "U"), (31, "1", 0.0, "D"), (3, "0", 3.0, "U")]
    _upsert(uri, staging).write(spark.createDataFrame(again, CHANGES), epoch_id=1)
    assert _every_reader(spark, uri) == _applied(expected, again)


@MATCHED_BY
def test_rows_deleted_between_the_read_and_the_commit_make_the_upsert_compute_again(
    delta_spark, tmp_path, monkeypatch, matched_by
):
    """delta-spark DELETEs rows of the file the upsert rewrites after the upsert read it (a
    new vector on the same path): committing the rewrite would bring them back, so the commit
    fails its liveness check and the batch is computed again on the newer snapshot."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri)
    before = {r["id"]: r for r in _every_reader(spark, uri)}
    _match_in(monkeypatch, matched_by)
    original = _committer.write_transaction
    interfered: list[int] = []

    def delete_first(*args, **kwargs):  # type: ignore[no-untyped-def]
        if not interfered:  # the rows of partition s=0 other than the changed one
            interfered.append(1)
            spark.sql(f"DELETE FROM delta.`{uri}` WHERE s = '0' AND id BETWEEN 6 AND 2000")
        return original(*args, **kwargs)

    monkeypatch.setattr(_committer, "write_transaction", delete_first)
    changes = [(0, "0", -1.0, "U"), (9, "0", 0.0, "D")]
    _upsert(uri).write(spark.createDataFrame(changes, CHANGES))

    assert interfered == [1]
    commit_info = next(a["commitInfo"] for a in _log(uri, 3) if "commitInfo" in a)
    assert commit_info["operation"] != "DELETE"  # ours came after theirs
    added = [a["add"]["path"] for a in _log(uri, 3) if "add" in a]
    assert added and all("-redo" in path for path in added)  # computed again
    deleted_meanwhile = {i for i in before if i % 3 == 0 and 6 <= i <= 2000}
    kept = {i: r for i, r in before.items() if i not in deleted_meanwhile}
    assert _every_reader(spark, uri) == _applied(kept, changes)


def test_the_change_feed_of_an_upsert_reports_live_rows_only(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri)
    spark.sql(f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    before = {r["id"]: r for r in _every_reader(spark, uri)}
    changes = [(0, "0", -1.0, "U"), (1, "1", 0.0, "D"), (3, "0", -3.0, "U"), (10, "1", 0.0, "D")]
    _upsert(uri).write(spark.createDataFrame(changes, CHANGES))

    assert _every_reader(spark, uri) == _applied(before, changes)
    feed = spark.sql(f"SELECT * FROM table_changes_by_path('{uri}', 3)").drop("_commit_timestamp")
    assert comparable(feed.toArrow().to_pylist()) == comparable(
        [
            {**before[0], "_change_type": "update_preimage", "_commit_version": 3},
            {
                "id": 0,
                "s": "0",
                "d": -1.0,
                "_change_type": "update_postimage",
                "_commit_version": 3,
            },
            {**before[1], "_change_type": "delete", "_commit_version": 3},
            {"id": 3, "s": "0", "d": -3.0, "_change_type": "insert", "_commit_version": 3},
        ]
    )
    cdc = [a["cdc"] for a in _log(uri, 3) if "cdc" in a]
    removes = [a["remove"] for a in _log(uri, 3) if "remove" in a]
    assert cdc and removes and all(r.get("deletionVector") for r in removes)


@MATCHED_BY
def test_a_damaged_vector_fails_the_upsert_naming_it_with_nothing_committed(
    delta_spark, tmp_path, monkeypatch, matched_by
):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri)
    (vector_file,) = Path(uri).glob("deletion_vector_*.bin")  # (the DELETE's, for every file)
    damaged = bytearray(vector_file.read_bytes())
    for vector in _live_vectors(uri, 1).values():  # a byte of each bitmap, past its size
        assert vector is not None
        damaged[vector["offset"] + 4 + 6] ^= 0xFF
    vector_file.write_bytes(bytes(damaged))
    _match_in(monkeypatch, matched_by)

    changes = [(0, "0", -1.0, "U"), (5000, "2", 5.0, "I")]
    with pytest.raises(DeletionVectorError, match=r"deletion vector .*part-") as raised:
        _upsert(uri).write(spark.createDataFrame(changes, CHANGES))
    assert "CRC-32" in str(raised.value)
    assert DeltaTable(uri).version() == 1  # nothing committed
    assert_no_orphans(uri)  # nothing staged left behind
