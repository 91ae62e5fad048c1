"""The change files of single commits, and the rows a change file reads, without Spark.

Commits are given as the log spells them (the actions of a ``_delta_log/NNN.json``); the
files are real Parquet files of a table delta-rs created, and the deletion vectors real inline
vectors in Delta's format. The Spark-level comparison with delta-spark is in
``interop/test_interop_cdf_read.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from pyroaring import BitMap64

from committers.delta.read._change_feed import (
    ChangeFileReader,
    ChangeRange,
    ChangeRangeSpec,
    commit_changes,
)
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import serialize_bitmap, z85_encode
from committers.delta.table._snapshot import SnapshotSpec, open_snapshot
from framework.errors import ConfigurationError, SinkError

STAMP = 1_700_000_000_000_000


def _identity(raw):
    return dict(raw)


def _changes(actions: list[dict]) -> list[tuple[str, str, dict]]:
    files = commit_changes("version 3", 3, STAMP, actions, _identity)
    return [(f.path, f.metadata["change"], dict(f.metadata)) for f in files]


def _vector(rows: list[int]) -> dict:
    data = serialize_bitmap(BitMap64(rows))
    return {
        "storageType": "i",
        "pathOrInlineDv": z85_encode(data),
        "sizeInBytes": len(data),
        "cardinality": len(rows),
    }


def _add(path: str, vector: dict | None = None, data_change: bool = True) -> dict:
    add = {"path": path, "size": 10, "partitionValues": {}, "dataChange": data_change}
    if vector is not None:
        add["deletionVector"] = vector
    return {"add": add}


def _remove(path: str, vector: dict | None = None, data_change: bool = True) -> dict:
    remove = {"path": path, "size": 10, "partitionValues": {}, "dataChange": data_change}
    if vector is not None:
        remove["deletionVector"] = vector
    return {"remove": remove}


def test_cdc_files_are_the_only_changes_of_their_commit():
    actions = [
        _remove("a.parquet"),
        _add("b.parquet"),
        {"cdc": {"path": "_change_data/c%201.parquet", "size": 5, "partitionValues": {}}},
    ]
    assert [(p, kind) for p, kind, _ in _changes(actions)] == [("_change_data/c 1.parquet", "cdc")]


def test_adds_and_removes_with_data_change_are_inserts_and_deletes():
    actions = [
        {"commitInfo": {"operation": "WRITE"}},
        _add("new.parquet"),
        _remove("old.parquet"),
        _add("compacted.parquet", data_change=False),
        _remove("small.parquet", data_change=False),
    ]
    changes = _changes(actions)
    assert [(p, kind) for p, kind, _ in changes] == [
        ("new.parquet", "insert"),
        ("old.parquet", "delete"),
    ]
    assert {m["version"] for *_, m in changes} == {"3"}
    assert {m["timestamp"] for *_, m in changes} == {str(STAMP)}


def test_a_merge_whose_metrics_say_nothing_changed_has_no_changes():
    metrics = {"numTargetRowsInserted": "0", "numTargetRowsUpdated": "0"}
    info = {"operation": "MERGE", "operationMetrics": {**metrics, "numTargetRowsDeleted": "0"}}
    actions = [{"commitInfo": info}, _remove("a.parquet"), _add("b.parquet")]
    assert _changes(actions) == []
    info["operationMetrics"]["numTargetRowsDeleted"] = "1"
    assert len(_changes(actions)) == 2
    del info["operationMetrics"]["numTargetRowsDeleted"]  # a missing metric: not skipped
    assert len(_changes(actions)) == 2


def test_a_file_removed_and_added_again_changes_the_rows_its_vectors_disagree_on():
    old, new = _vector([1, 2]), _vector([2, 5])
    # A first vector: its rows are deleted.
    (only,) = _changes([_remove("f.parquet"), _add("f.parquet", new)])
    assert only[1] == "delete"
    assert json.loads(only[2]["rowsIn"]) == new and "rowsNotIn" not in only[2]
    # Another vector: new rows deleted, rows the old one marked and the new one not re-added.
    deleted, readded = _changes([_remove("f.parquet", old), _add("f.parquet", new)])
    assert (deleted[1], json.loads(deleted[2]["rowsIn"]), json.loads(deleted[2]["rowsNotIn"])) == (
        "delete",
        new,
        old,
    )
    assert (readded[1], json.loads(readded[2]["rowsIn"]), json.loads(readded[2]["rowsNotIn"])) == (
        "insert",
        old,
        new,
    )
    # The vector dropped (RESTORE): the rows it marked are back.
    (back,) = _changes([_remove("f.parquet", old), _add("f.parquet")])
    assert back[1] == "insert" and json.loads(back[2]["rowsIn"]) == old
    with pytest.raises(SinkError, match=r"removes f\.parquet and adds it again without a deletion"):
        _changes([_remove("f.parquet"), _add("f.parquet")])


def test_a_change_file_reads_the_rows_its_vectors_select(tmp_path: Path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": pa.array([0], pa.int64())}))
    _table, snapshot = open_snapshot(TableLocation.of(uri), SnapshotSpec())
    pq.write_table(pa.table({"id": pa.array(range(10), pa.int64())}), f"{uri}/f.parquet")
    reader = ChangeFileReader(snapshot)

    def read(actions: list[dict]) -> list[tuple]:
        files = commit_changes("v", 3, STAMP, actions, _identity)
        rows = [r for f in files for batch in reader(f) for r in batch.to_pylist()]
        assert all(r["_commit_version"] == 3 for r in rows)
        assert {r["_commit_timestamp"].timestamp() for r in rows} <= {STAMP / 1e6}
        return sorted((r["id"], r["_change_type"]) for r in rows)

    old, new = _vector([1, 2, 7]), _vector([2, 5, 7, 9])
    assert read([_remove("f.parquet", old), _add("f.parquet", new)]) == [
        (1, "insert"),
        (5, "delete"),
        (9, "delete"),
    ]
    assert read([_add("f.parquet", new)]) == [(i, "insert") for i in (0, 1, 3, 4, 6, 8)]
    assert read([_remove("f.parquet", old)]) == [(i, "delete") for i in (0, 3, 4, 5, 6, 8, 9)]


def test_ranges(tmp_path: Path):
    uri = str(tmp_path / "t")
    for _ in range(4):
        write_deltalake(uri, pa.table({"id": pa.array([0], pa.int64())}), mode="append")
    _table, snapshot = open_snapshot(TableLocation.of(uri), SnapshotSpec())

    def resolve(**options) -> tuple[int, int]:
        changes = ChangeRange.resolve(snapshot, ChangeRangeSpec.of(options))
        return changes.start, changes.end

    assert resolve(startingversion="1") == (1, 3)
    assert resolve(startingversion="1", endingversion="9") == (1, 3)
    assert resolve(startingversion="2", endingversion="2") == (2, 2)
    assert resolve(startingtimestamp="2000-01-01") == (0, 3)
    for options, match in [
        ({}, "needs startingVersion or startingTimestamp"),
        ({"startingversion": "1", "startingtimestamp": "2000-01-01"}, "not both"),
        ({"startingversion": "-1"}, "startingVersion must be a version number"),
        ({"startingversion": "4"}, r"startingVersion=4 is after the latest version .* \(3\)"),
        ({"startingversion": "2", "endingversion": "1"}, "ends before it starts"),
        ({"startingversion": "0", "endingtimestamp": "2000-01-01"}, "endingTimestamp=.* before"),
    ]:
        with pytest.raises(ConfigurationError, match=match):
            resolve(**options)
