"""Upserts into tables whose files have deletion vectors, judged by delta-spark, both ways:
copy-on-write (``deletion_vectors="off"``: touched files rewritten) and merge-on-read (the
default on tables that enable vectors: the replaced rows marked in new vectors, only new rows
written). A row a vector deletes never comes back (not as a kept row of a rewritten file, not
as a match of a change: its key is inserted anew, once), the commit's removes name each touched
file with its vector, and delta-spark, DuckDB, DataFusion and ``read_table`` then read exactly
the rows the changes say. A vector another writer adds to a file between the upsert's read and
its commit makes it compute the batch again. With the change data feed on as well,
``table_changes`` reports the live rows replaced, never a deleted one."""

from __future__ import annotations

import copy as copy_module
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.delta import DeletionVectorError, DeltaSink, register
from committers.delta.commit import _epoch_write
from committers.delta.spark import _upsert_touched
from committers.tests._delta_helpers import assert_no_orphans, staging_leftovers
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


@pytest.fixture(scope="module")
def dv_table(delta_spark, tmp_path_factory) -> Callable[..., dict[int, dict]]:
    """Copies ``_dv_table``'s table to a path; returns its rows by id, every reader agreeing on
    them. The table of each size is made and read once for the module: a copy costs
    milliseconds where making it costs two Spark commits and reading it four readers (a local
    table's log names its files relative to its root, so a copy is the same table)."""
    made: dict[tuple[int, int], tuple[str, dict[int, dict]]] = {}

    def copy(uri: str, *, rows: int = 3000, files: int = 4) -> dict[int, dict]:
        if (rows, files) not in made:
            template = str(tmp_path_factory.mktemp("dv") / "t")
            _dv_table(delta_spark, template, rows=rows, files=files)
            rows_by_id = {r["id"]: r for r in _every_reader(delta_spark, template)}
            made[rows, files] = (template, rows_by_id)
        template, before = made[rows, files]
        shutil.copytree(template, uri)
        return copy_module.deepcopy(before)

    return copy


def _upsert(uri: str, staging: str = "auto", deletion_vectors: str = "auto") -> TwoPhaseSink:
    return TwoPhaseSink(
        DeltaSink(
            uri,
            app_id="dv-upsert",
            mode="upsert",
            keys=["id"],
            delete_when="op = 'D'",
            staging=staging,
            deletion_vectors=deletion_vectors,
        )
    )


def _check_marked(uri: str, version: int, read_version: int) -> dict[str, dict]:
    """Commit ``version`` is a merge-on-read upsert: it removes each touched file with its
    vector at ``read_version`` and adds the same file back with a new vector (in the batch's
    run directory) deleting those rows and more, its stats loose; path -> new vector."""
    commit = _log(uri, version)
    removed = {a["remove"]["path"]: a["remove"] for a in commit if "remove" in a}
    adds = {a["add"]["path"]: a["add"] for a in commit if "add" in a}
    before = _live_vectors(uri, read_version)
    assert removed and set(removed) <= set(adds)  # every touched file added back
    marked = {}
    for path, remove in removed.items():
        assert remove.get("deletionVector") == before[path]
        add = adds[path]
        vector = add["deletionVector"]
        assert vector["storageType"] == "u" and vector["pathOrInlineDv"].startswith("batch-")
        old = (before[path] or {}).get("cardinality", 0)
        assert vector["cardinality"] > old
        assert json.loads(add["stats"])["tightBounds"] is False
        assert add["size"] == remove["size"] and add["dataChange"]
        marked[path] = vector
    assert all(not a.get("deletionVector") for p, a in adds.items() if p not in removed)
    return marked


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
    ("staging", "matched_by", "deletion_vectors"),
    [  # each way of matching and keeping rows; rows marked deleted (merge-on-read) with
        # Spark's matching here, with the driver's in the tests below
        ("auto", "driver", "off"),
        ("spark", "spark", "off"),
        ("spark", "spark", "auto"),
    ],
)
def test_an_upsert_never_brings_back_a_deleted_row(
    delta_spark, dv_table, tmp_path, monkeypatch, matched_by, staging, deletion_vectors
):
    spark = delta_spark
    uri = str(tmp_path / "t")
    before = dv_table(uri)
    assert 3 not in before and 10 not in before  # (id % 7 = 3 was deleted by vectors)
    _match_in(monkeypatch, matched_by)
    changes = [
        (0, "0", -1.0, "U"),  # a live row, updated
        (1, "1", 0.0, "D"),  # a live row, deleted
        (3, "0", -3.0, "U"),  # a deleted row: inserted anew, once
        (10, "1", 0.0, "D"),  # a deleted row: nothing to delete
        (5000, "2", 5.0, "I"),  # a new key
    ]
    _upsert(uri, staging, deletion_vectors).write(spark.createDataFrame(changes, CHANGES))

    assert _every_reader(spark, uri) == _applied(before, changes)
    commit = _log(uri, 2)
    if deletion_vectors == "auto":  # 0 and 1 marked in their files' vectors, nothing rewritten
        assert len(_check_marked(uri, 2, 1)) == 2
    else:
        assert not {a["add"]["path"] for a in commit if "add" in a} & {
            a["remove"]["path"] for a in commit if "remove" in a
        }
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
    _upsert(uri, staging, deletion_vectors).write(spark.createDataFrame(again, CHANGES), epoch_id=1)
    assert _every_reader(spark, uri) == _applied(expected, again)
    if deletion_vectors == "auto":  # (on files with vectors of ours and of delta-spark's)
        _check_marked(uri, 5, 4)
    assert staging_leftovers(uri) == []


@pytest.mark.parametrize(
    ("matched_by", "deletion_vectors"), [("driver", "off"), ("spark", "off"), ("spark", "auto")]
)
def test_rows_deleted_between_the_read_and_the_commit_make_the_upsert_compute_again(
    delta_spark, dv_table, tmp_path, monkeypatch, matched_by, deletion_vectors
):
    """delta-spark DELETEs rows of the file the upsert rewrites (or marks) after the upsert
    read it (a new vector on the same path): committing would bring them back, so the commit
    fails its liveness check and the batch is computed again on the newer snapshot."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    before = dv_table(uri)
    _match_in(monkeypatch, matched_by)
    interfered: list[int] = []

    def delete_first(original):  # type: ignore[no-untyped-def]
        def commit(*args, **kwargs):  # type: ignore[no-untyped-def]
            if not interfered:  # the rows of partition s=0 other than the changed one
                interfered.append(1)
                spark.sql(f"DELETE FROM delta.`{uri}` WHERE s = '0' AND id BETWEEN 6 AND 2000")
            return original(*args, **kwargs)

        return commit

    for commit in ("write_transaction", "write_commit_with_changes"):  # (merge-on-read: ours)
        monkeypatch.setattr(_epoch_write, commit, delete_first(getattr(_epoch_write, commit)))
    changes = [(0, "0", -1.0, "U"), (9, "0", 0.0, "D")]
    _upsert(uri, deletion_vectors=deletion_vectors).write(spark.createDataFrame(changes, CHANGES))

    assert interfered == [1]
    commit_info = next(a["commitInfo"] for a in _log(uri, 3) if "commitInfo" in a)
    assert commit_info["operation"] != "DELETE"  # ours came after theirs
    removed = {a["remove"]["path"] for a in _log(uri, 3) if "remove" in a}
    adds = [a["add"]["path"] for a in _log(uri, 3) if "add" in a]
    added = [path for path in adds if path not in removed]
    assert added and all("-redo" in path for path in added)  # computed again
    if deletion_vectors == "auto":  # marked on the vectors of the DELETE
        marked = _check_marked(uri, 3, 2)
        assert all("-redo" in v["pathOrInlineDv"] for v in marked.values())
    deleted_meanwhile = {i for i in before if i % 3 == 0 and 6 <= i <= 2000}
    kept = {i: r for i, r in before.items() if i not in deleted_meanwhile}
    assert _every_reader(spark, uri) == _applied(kept, changes)


def test_the_change_feed_of_an_upsert_reports_live_rows_only(delta_spark, dv_table, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    dv_table(uri)
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
    _check_marked(uri, 3, 2)  # merge-on-read, with the change files in the same commit


@MATCHED_BY
def test_a_damaged_vector_fails_the_upsert_naming_it_with_nothing_committed(
    delta_spark, dv_table, tmp_path, monkeypatch, matched_by
):
    spark = delta_spark
    uri = str(tmp_path / "t")
    dv_table(uri)
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


def test_merge_on_read_vectors_are_read_and_maintained_by_delta_spark(
    delta_spark, dv_table, tmp_path
):
    """The sink's vectors (one file of them per batch, in its run directory; one extending
    delta-spark's vector, one a file's first): every reader drops exactly the rows they mark,
    no data file is rewritten, and delta-spark keeps deleting, merging, optimizing and
    vacuuming on top of them; then a batch of deletes only marks rows of delta-spark's files
    (a commit of vectors alone)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    dv_table(uri, rows=600, files=2)
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (1000, '0', 0.5)")  # a file with no vector
    before = {r["id"]: r for r in _every_reader(spark, uri)}
    files_before = set(_live_vectors(uri, 2))
    changes = [(1000, "0", 0.0, "D"), (0, "0", 1.5, "U"), (9, "0", 0.0, "D"), (601, "1", 6.0, "I")]
    _upsert(uri).write(spark.createDataFrame(changes, CHANGES))

    marked = _check_marked(uri, 3, 2)
    vectors_before = _live_vectors(uri, 2)
    # the files of 0 and 9 (with delta-spark's vector), 1000's (with none)
    with_none = [vectors_before[p] is None for p in marked]
    assert with_none.count(True) == 1 and 1 <= with_none.count(False) <= 2
    assert files_before <= set(_live_vectors(uri, 3))  # nothing rewritten
    expected = _applied(before, changes)
    assert _every_reader(spark, uri) == expected
    register(spark)
    by_format = spark.read.format("deltalake").load(uri).toArrow().to_pylist()
    assert comparable(by_format) == expected
    metrics = next(a["commitInfo"] for a in _log(uri, 3) if "commitInfo" in a)["operationMetrics"]
    assert metrics["numTargetDeletionVectorsAdded"] == str(len(marked))
    assert metrics["numTargetRowsCopied"] == "0"

    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id % 5 = 0")
    spark.sql(
        f"MERGE INTO delta.`{uri}` t USING (SELECT 1000L AS id, '0' AS s, 9.0D AS d) u "
        "ON t.id = u.id WHEN MATCHED THEN UPDATE SET d = u.d WHEN NOT MATCHED THEN INSERT *"
    )
    expected = [r for r in expected if r["id"] % 5]
    expected.append({"id": 1000, "s": "0", "d": 9.0})  # deleted by our vector, inserted again
    assert _every_reader(spark, uri) == comparable(expected)
    spark.sql(f"OPTIMIZE delta.`{uri}`")
    spark.sql("SET spark.databricks.delta.retentionDurationCheck.enabled = false")
    spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS")
    spark.sql("SET spark.databricks.delta.retentionDurationCheck.enabled = true")
    assert _every_reader(spark, uri) == comparable(expected)
    assert not list(Path(uri).glob("batch-*/*.bin"))  # VACUUM deleted our purged vectors

    again = [(1000, "0", 1.0, "D"), (2, "2", 0.0, "D")]  # deletes only: vectors, no new file
    _upsert(uri).write(spark.createDataFrame(again, CHANGES), epoch_id=1)
    version = DeltaTable(uri).version()
    _check_marked(uri, version, version - 1)
    assert _every_reader(spark, uri) == _applied({r["id"]: r for r in expected}, again)


def test_a_merge_on_read_batch_that_fails_to_commit_leaves_nothing_and_replays_once(
    delta_spark, dv_table, tmp_path, monkeypatch
):
    """The batch's vector file is written, then its commit fails: nothing is committed, the
    vector file and the new rows are deleted, the table reads as before; written again, the
    batch commits once, and a replay of it changes nothing. Compaction then purges the
    vectors (every file of this small table deletes more than 5 % of its rows)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    before = dv_table(uri, rows=600, files=2)
    changes = [(0, "0", 1.5, "U"), (1, "1", 0.0, "D"), (700, "1", 7.0, "I")]

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        assert list(Path(uri).glob("batch-*/*.bin"))  # (the vectors were staged)
        raise RuntimeError("the commit failed")

    with monkeypatch.context() as patched:
        patched.setattr(_epoch_write, "write_commit_with_changes", refuse)
        with pytest.raises(RuntimeError, match="the commit failed"):
            _upsert(uri).write(spark.createDataFrame(changes, CHANGES), epoch_id=7)
    assert DeltaTable(uri).version() == 1
    assert not list(Path(uri).glob("batch-*/*.bin"))
    assert_no_orphans(uri)
    assert _every_reader(spark, uri) == comparable(list(before.values()))

    for _ in range(2):  # the write, then its replay (found committed: nothing more)
        _upsert(uri).write(spark.createDataFrame(changes, CHANGES), epoch_id=7)
    assert DeltaTable(uri).version() == 2
    _check_marked(uri, 2, 1)
    assert _every_reader(spark, uri) == _applied(before, changes)
    assert_no_orphans(uri)

    DeltaSink(uri).compact(spark)  # our own compaction purges our vectors
    assert not any(_live_vectors(uri, 3).values())
    assert _every_reader(spark, uri) == _applied(before, changes)
