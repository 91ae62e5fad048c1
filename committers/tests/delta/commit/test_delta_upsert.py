"""Exactly-once upserts and deletes by key: ``DeltaSink(mode="upsert", keys=..., sequence_by=...,
delete_when=...)`` applies each batch as ONE copy-on-write transaction carrying its txn."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import signal
from decimal import Decimal
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.delta.write._upsert_spec import UpsertConflictError
from committers.tests._delta_helpers import (
    count_table_loads,
    data_files_on_disk,
    interfering,
    read_rows,
    staging_leftovers,
)
from committers.tests._readers import duckdb_rows
from committers.tests._upsert_driver import APP_ID, run_cdc_stream, run_then_kill_a_replay
from framework import TwoPhaseSink
from framework.errors import (
    ConfigurationError,
    ConstraintViolationError,
    NullConstraintError,
    SchemaMismatchError,
    StagingError,
    UnsupportedTypeError,
)

pytestmark = [pytest.mark.spark]

CHANGES = "id long, name string, ts long, op string"


def _apply(state: dict[int, tuple], changes: list[tuple]) -> None:
    """The documented rules, for ``(id, *values, ts, op)`` changes of one batch: per id the
    highest ts wins, then a change that is not a delete; it applies unless the stored row
    ranks higher (as a change that is not a delete, at its ts); a delete removes the row."""
    latest: dict[int, tuple] = {}
    for change in changes:
        rank = (change[-2], change[-1] != "D")
        held = latest.get(change[0])
        if held is None or rank > (held[-2], held[-1] != "D"):
            latest[change[0]] = change
    for key, change in latest.items():
        stored = state.get(key)
        if stored is not None and (stored[-1], True) > (change[-2], change[-1] != "D"):
            continue  # stale
        if change[-1] == "D":
            state.pop(key, None)
        else:
            state[key] = change[1:-1]


def _table_rows(uri: str, columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in read_rows(uri, columns))


def _duckdb_table_rows(uri: str, columns: list[str]) -> list[tuple]:
    return sorted(tuple(r[c] for c in columns) for r in duckdb_rows(uri))


def _log(uri: str) -> list[list[dict]]:
    """The actions of every commit, oldest first."""
    commits = sorted((Path(uri) / "_delta_log").glob("*.json"))
    return [[json.loads(line) for line in p.read_text().splitlines()] for p in commits]


def _files_ever_added(uri: str) -> set[str]:
    """Paths (relative, decoded: as on disk) of every file any commit added."""
    return {unquote(a["add"]["path"]) for commit in _log(uri) for a in commit if "add" in a}


def _assert_clean(uri: str) -> None:
    """No staged leftover: every data file on disk was committed at some version."""
    assert staging_leftovers(uri) == []
    assert data_files_on_disk(uri) <= _files_ever_added(uri)


def _four_files(tmp_path: Path) -> str:
    """A table (id, name, ts) of four files holding ids 0-9, 10-19, 20-29, 30-39."""
    uri = str(tmp_path / "t")
    for first in range(0, 40, 10):
        ids = list(range(first, first + 10))
        write_deltalake(
            uri,
            pa.table(
                {
                    "id": pa.array(ids, pa.int64()),
                    "name": [f"n{i}" for i in ids],
                    "ts": pa.array([0] * 10, pa.int64()),
                }
            ),
            mode="append",
        )
    return uri


def _upsert(uri: str, **options) -> TwoPhaseSink:
    return TwoPhaseSink(
        DeltaSink(
            uri,
            app_id="up",
            mode="upsert",
            keys=["id"],
            sequence_by="ts",
            delete_when="op = 'D'",
            **options,
        )
    )


def _changes(spark, rows: list[tuple]):
    return spark.createDataFrame(rows, CHANGES)


#: Who rewrites the touched files' kept rows: Python tasks (the default) or Spark.
KEPT_BY = pytest.mark.parametrize("staging", ["auto", "spark"])
#: How a batch's changes are found: its keys collected first (a batch without a repeated key
#: needs no shuffle), or, for a batch of more keys than the driver collects, reduced by key in
#: Spark (whose tasks then also fail a repeated key without sequence_by).
CHANGES_BY = pytest.mark.parametrize("keys_limit", [None, 1], ids=["collected", "spark"])


def _limit_collected_keys(monkeypatch, keys_limit: int | None) -> None:
    from committers.delta.spark import _upsert

    if keys_limit is not None:
        monkeypatch.setattr(_upsert, "PRUNE_KEYS_LIMIT", keys_limit)


# -- a CDC stream, replayed and killed ---------------------------------------------------------

CDC_BATCHES = [
    [(i, f"v{i}", f"d{i % 2}", 1, "I") for i in range(1, 7)],
    [
        (1, "v1b", "d1", 2, "U"),
        (2, "v2b", "d1", 2, "U"),  # moves from partition d0 to d1
        (3, None, None, 2, "D"),
        (4, "v4-newest", "d0", 3, "U"),
        (4, "v4-older", "d0", 2, "U"),  # lower sequence, later in the file: loses
        (7, None, None, 2, "D"),  # a delete of a key the table never held
    ],
    [
        (5, None, None, 4, "D"),
        (5, "v5-again", "d0", 5, "I"),  # a delete followed by a re-insert
        (6, "v6b", "d0", 3, "U"),
        (1, None, None, 9, "D"),
        (8, "v8", "d1", 3, "I"),
        (2, "v2-late", "d0", 1, "U"),  # older than the row batch 1 wrote: changes nothing
        (4, None, None, 2, "D"),  # a late delete: the same
    ],
]


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_a_cdc_stream_replayed_and_killed_before_a_commit_ends_exact(spark, tmp_path) -> None:
    """Batches 0 and 1 run here; the checkpoint then forgets that batch 1 finished. The stream
    restarts as its own process: batch 1 is a replay (skipped), and the process is SIGKILLed
    after staging batch 2, before its commit. Restarted here, batch 2 is staged again and
    committed once."""
    source, table, checkpoint = tmp_path / "changes", str(tmp_path / "t"), tmp_path / "chk"
    killed = run_then_kill_a_replay(spark, source, table, checkpoint, CDC_BATCHES)
    assert killed.first_batches == [(0, "committed"), (1, "committed")]
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "batch=1 epoch=1 app_id=cdc status=skipped" in killed.stderr
    assert "CRASH AT before_commit epoch=2" in killed.stdout
    assert DeltaTable(table).transaction_version(APP_ID) == 1  # batch 2 staged, not committed
    assert staging_leftovers(table)  # its manifest names what it staged

    restarted = run_cdc_stream(spark, str(source), table, str(checkpoint))
    assert [(b.batch_id, b.status) for b in restarted.batches] == [(2, "committed")]

    expected: dict[int, tuple] = {}
    for changes in CDC_BATCHES:
        _apply(expected, changes)
    rows = sorted((key, *values) for key, values in expected.items())
    columns = ["id", "name", "day", "ts"]  # op is what delete_when reads: not written
    assert [f.name for f in DeltaTable(table).schema().fields] == columns
    assert _table_rows(table, columns) == rows
    assert _duckdb_table_rows(table, columns) == rows
    assert DeltaTable(table).transaction_version(APP_ID) == 2
    epochs = [
        a["commitInfo"].get("sink.epochId") for c in _log(table) for a in c if "commitInfo" in a
    ]
    assert sorted(e for e in epochs if e is not None) == ["0", "1", "2"]  # each once
    _assert_clean(table)


# -- one batch ---------------------------------------------------------------------------------


@KEPT_BY
@CHANGES_BY
def test_out_of_order_duplicate_and_tied_changes_of_one_batch(
    spark, tmp_path, monkeypatch, staging, keys_limit
) -> None:
    _limit_collected_keys(monkeypatch, keys_limit)
    uri = str(tmp_path / "t")
    existing = {2: ("old2", 0), 3: ("old3", 0), 7: ("old7", 0)}
    write_deltalake(
        uri,
        pa.table(
            {
                "id": pa.array(list(existing), pa.int64()),
                "name": [v[0] for v in existing.values()],
                "ts": pa.array([v[1] for v in existing.values()], pa.int64()),
            }
        ),
    )
    batch = [
        (1, "late", 5, "U"),
        (1, "early", 3, "U"),  # a lower sequence later in the batch loses
        (2, "x", 4, "D"),
        (2, "back", 6, "I"),  # deleted, then inserted again: present
        (3, "new", 2, "I"),
        (3, None, 7, "D"),  # inserted, then deleted: gone (with the row the table held)
        (4, "tie-delete", 5, "D"),
        (4, "tie-upsert", 5, "U"),  # same sequence: the change that is not a delete wins
        (5, "a", 1, "I"),
        (5, "b", 1, "I"),  # same sequence, both upserts: the greatest row ('b' > 'a') wins
        (6, "same", 2, "U"),
        (6, "same", 2, "U"),  # an exact duplicate
    ]
    metrics = _upsert(uri, staging=staging).write(_changes(spark, batch).repartition(3))
    assert metrics.status == "committed"
    expected = [
        (1, "late", 5),
        (2, "back", 6),
        (4, "tie-upsert", 5),
        (5, "b", 1),
        (6, "same", 2),
        (7, "old7", 0),
    ]
    assert _table_rows(uri, ["id", "name", "ts"]) == expected
    info = next(a["commitInfo"] for a in _log(uri)[-1] if "commitInfo" in a)
    assert info["operationMetrics"]["numChanges"] == "6"
    assert info["operationMetrics"]["numTargetRowsDeleted"] == "1"  # id 3
    assert info["operationMetrics"]["numTargetRowsUpdated"] == "1"  # id 2
    assert info["isBlindAppend"] is False
    assert json.loads(info["operationParameters"]["upsertKeys"]) == ["id"]


@KEPT_BY
def test_only_the_file_holding_the_key_is_read_and_rewritten_or_none(
    spark, tmp_path, staging
) -> None:
    uri = _four_files(tmp_path)
    version = DeltaTable(uri).version()
    _upsert(uri, staging=staging).write(
        _changes(spark, [(15, "changed", 1, "U"), (99, None, 1, "D")])
    )
    actions = _log(uri)[-1]
    removed = [a["remove"]["path"] for a in actions if "remove" in a]
    holding_15 = next(
        a["add"]["path"]
        for commit in _log(uri)
        for a in commit
        if "add" in a and json.loads(a["add"]["stats"])["minValues"]["id"] == 10
    )
    assert removed == [holding_15]
    kept_files = [
        a for a in actions if "add" in a and a["add"]["path"].split("/")[0].endswith("-kept")
    ]
    assert len(kept_files) == (1 if staging == "auto" else 0)  # Python tasks' own directory
    metrics = next(a["commitInfo"] for a in actions if "commitInfo" in a)["operationMetrics"]
    assert metrics["numTargetFilesBeforeSkipping"] == "4"
    assert metrics["numTargetFilesAfterSkipping"] == "1"  # stats ruled out the other three
    assert metrics["numTargetRowsCopied"] == "9"
    assert DeltaTable(uri).version() == version + 1
    rows = _table_rows(uri, ["id", "name"])
    assert len(rows) == 40 and (15, "changed") in rows

    # Only deletes of keys no file can hold: nothing read or written, the txn still recorded.
    _upsert(uri, staging=staging).write(_changes(spark, [(999, None, 2, "D")]), epoch_id=5)
    actions = _log(uri)[-1]
    assert not [a for a in actions if "add" in a or "remove" in a]
    assert next(a["txn"] for a in actions if "txn" in a) == {"appId": "up:write", "version": 5}
    assert DeltaTable(uri).version() == version + 2 and len(read_rows(uri, ["id"])) == 40


# -- other writers -----------------------------------------------------------------------------


def _run_directories(uri: str, version: int) -> set[str]:
    """The runs whose files the commit ``version`` adds (new rows in ``batch-<e>-<run>/``, the
    kept rows of the rewritten files in ``batch-<e>-<run>-kept/``)."""
    added = [a["add"]["path"].split("/", 1)[0] for a in _log(uri)[version] if "add" in a]
    return {d.removesuffix("-kept") for d in added}


@KEPT_BY
def test_a_concurrent_append_survives_and_costs_a_commit_attempt_only(
    spark, tmp_path, monkeypatch, staging
) -> None:
    uri = _four_files(tmp_path)

    def append_once(call: int) -> None:
        if call == 1:
            appended = {"id": pa.array([200, 201], pa.int64()), "name": ["a", "b"], "ts": [0, 0]}
            write_deltalake(uri, pa.table(appended), mode="append")

    calls = interfering(monkeypatch, append_once)
    _upsert(uri, staging=staging).write(
        _changes(spark, [(5, "five", 1, "U"), (100, "new", 1, "I")])
    )
    assert len(calls) == 2  # the commit was attempted again, on the newer snapshot
    (run_directory,) = _run_directories(uri, DeltaTable(uri).version())
    assert not run_directory.endswith("-redo")  # without computing the batch again
    rows = dict(_table_rows(uri, ["id", "name"]))
    assert rows[5] == "five" and rows[100] == "new" and rows[200] == "a" and rows[201] == "b"
    assert len(rows) == 43 and len(read_rows(uri, ["id"])) == 43
    _assert_clean(uri)


def test_an_upsert_batch_loads_the_table_once(spark, tmp_path, monkeypatch) -> None:
    """A (re)started upsert opens the table once, its batch plans on the snapshot the replay
    check left (one refresh) and commits on it, and nothing reads the log back after the
    commit (it lands right on top of that snapshot or fails)."""
    uri = _four_files(tmp_path)
    changes = _changes(spark, [(5, "five", 1, "U"), (100, "new", 1, "I")])
    loads = count_table_loads(monkeypatch)
    _upsert(uri).write(changes)
    assert loads == {"is_deltatable": 1, "open": 1, "update_incremental": 1}
    rows = dict(_table_rows(uri, ["id", "name"]))
    assert rows[5] == "five" and rows[100] == "new" and len(rows) == 41


@KEPT_BY
def test_a_concurrent_rewrite_of_the_same_file_is_redone_once_then_fails_loudly(
    spark, tmp_path, monkeypatch, staging
) -> None:
    uri = _four_files(tmp_path)
    theirs: list[str] = []
    budget = [1]  # how many commits of ours another writer gets in before

    def update_the_same_row(call: int) -> None:  # rewrites the file holding id 5
        if budget[0] > 0:
            budget[0] -= 1
            theirs.append(f"theirs{len(theirs)}")
            DeltaTable(uri).update(updates={"name": f"'{theirs[-1]}'"}, predicate="id = 5")

    calls = interfering(monkeypatch, update_the_same_row)
    _upsert(uri, staging=staging).write(
        _changes(spark, [(5, "ours", 1, "U"), (15, "ours", 1, "U")])
    )
    assert len(calls) == 2 and theirs == ["theirs0"]
    (run_directory,) = _run_directories(uri, DeltaTable(uri).version())
    assert run_directory.endswith("-redo")  # computed again on the snapshot with theirs0
    rows = dict(_table_rows(uri, ["id", "name"]))
    assert rows[5] == "ours" and rows[15] == "ours" and len(rows) == 40
    _assert_clean(uri)

    version = DeltaTable(uri).version()
    budget[0] = 2  # now the first attempt and the redo each lose the file to the other writer
    with pytest.raises(UpsertConflictError, match="another writer removed a file it rewrites"):
        _upsert(uri, staging=staging).write(
            _changes(spark, [(5, "ours again", 2, "U")]), epoch_id=7
        )
    assert theirs == ["theirs0", "theirs1", "theirs2"]
    assert DeltaTable(uri).version() == version + 2  # the other writer's commits only
    assert DeltaTable(uri).transaction_version("up:write") == 0  # epoch 7 never committed
    rows = dict(_table_rows(uri, ["id", "name"]))
    assert rows[5] == "theirs2" and len(rows) == 40
    _assert_clean(uri)


# -- bad input ---------------------------------------------------------------------------------


def test_upsert_options_are_checked_at_construction(tmp_path) -> None:
    uri = str(tmp_path / "t")
    for options, message in [
        ({"keys": ["id"]}, r"keys is an option of mode='upsert' \(got mode='append'\)"),
        ({"sequence_by": "ts", "delete_when": "op = 'D'"}, "sequence_by, delete_when are"),
        ({"mode": "upsert"}, r"mode='upsert' needs keys=\[...\]"),
        ({"mode": "upsert", "keys": []}, r"mode='upsert' needs keys=\[...\]"),
        ({"mode": "upsert", "keys": ["id", "ID"]}, "keys lists a column twice"),
        ({"mode": "upsert", "keys": ["id"], "sequence_by": "id"}, "sequence_by names key"),
        ({"mode": "upsert", "keys": ["id"], "delete_when": ""}, "delete_when must be a"),
        ({"mode": "upsert", "keys": ["id"], "staging": "arrow"}, "staging='arrow' cannot"),
        ({"partial_updates": True}, "partial_updates is an option of mode='upsert'"),
        ({"mode": "upsert", "keys": ["id"], "partial_updates": "yes"}, "must be True or False"),
        ({"mode": "merge"}, "mode must be 'append', 'overwrite' or 'upsert'"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            DeltaSink(uri, **options)


def test_inputs_an_upsert_cannot_apply_are_refused_before_anything_runs(spark, tmp_path) -> None:
    uri = _four_files(tmp_path)
    version = DeltaTable(uri).version()
    changes = _changes(spark, [(1, "x", 1, "U")])
    cases = [
        (SchemaMismatchError, "keys names 'key', which is not a column", {"keys": ["key"]}),
        (SchemaMismatchError, "sequence_by names 'seq'", {"sequence_by": "seq"}),
        (ConfigurationError, "delete_when \"op = = 'D'\" is not a", {"delete_when": "op = = 'D'"}),
        (ConfigurationError, "delete_when \"kind = 'D'\" is not a", {"delete_when": "kind = 'D'"}),
        (ConfigurationError, "delete_when 'op' is of type string", {"delete_when": "op"}),
        (ConfigurationError, "is not deterministic", {"delete_when": "rand() > 0.5"}),
    ]
    for error, message, options in cases:
        sink = TwoPhaseSink(
            DeltaSink(uri, mode="upsert", **{"keys": ["id"], "sequence_by": "ts", **options})
        )
        with pytest.raises(error, match=message):
            sink.write(changes)
    mapped = spark.createDataFrame([(1, {"a": 1})], "id long, m map<string, int>")
    with pytest.raises(UnsupportedTypeError, match="sequence_by column 'm' is map"):
        TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["id"], sequence_by="m")).write(mapped)
    keyed = spark.createDataFrame([("k", "x", 1)], "key string, name string, ts long")
    with pytest.raises(SchemaMismatchError, match=r"keys \['key'\] are not columns of"):
        TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["key"])).write(keyed)
    floating = spark.createDataFrame([(1.5, "x")], "f double, name string")
    with pytest.raises(UnsupportedTypeError, match="key column 'f' is of type double"):
        TwoPhaseSink(DeltaSink(str(tmp_path / "new"), mode="upsert", keys=["f"])).write(floating)
    with pytest.raises(ConfigurationError, match="Spark has no Hadoop file system for gs://"):
        TwoPhaseSink(DeltaSink("gs://bucket/t", mode="upsert", keys=["id"])).write(changes)
    with pytest.raises(ConfigurationError, match=r"supports output modes \['append'\]"):
        TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["id"])).write_stream(
            spark.readStream.format("rate").load(),
            checkpoint_location=str(tmp_path / "chk"),
            output_mode="complete",
        )
    assert DeltaTable(uri).version() == version and not spark.streams.active
    assert not (tmp_path / "new").exists()
    _assert_clean(uri)


def test_an_append_only_table_is_refused(spark, tmp_path) -> None:
    """Made by delta-rs, not by the sink: a rewrite would break append-only."""
    uri = str(tmp_path / "table")
    DeltaTable.create(
        uri,
        schema=pa.schema([("id", pa.int64()), ("name", pa.string())]),
        configuration={"delta.appendOnly": "true"},
    )
    version = DeltaTable(uri).version()
    with pytest.raises(UnsupportedTableFeatureError, match="it is append-only"):
        TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["id"])).write(
            spark.createDataFrame([(1, "x")], "id long, name string")
        )
    assert DeltaTable(uri).version() == version
    _assert_clean(uri)


def test_deletion_vectors_on_storage_the_log_writer_cannot_commit_to_are_refused(
    spark, tmp_path, monkeypatch
) -> None:
    """The removes of files with deletion vectors are written by the sink's log writer (local
    and S3 only): on other storage (simulated here) the upsert is refused before any work,
    not after staging the batch."""
    from committers.delta.commit._log_store import LogStore

    uri = str(tmp_path / "table")
    DeltaTable.create(
        uri,
        schema=pa.schema([("id", pa.int64()), ("name", pa.string())]),
        configuration={"delta.enableDeletionVectors": "true"},
    )
    monkeypatch.setattr(LogStore, "supports", staticmethod(lambda location: False))
    version = DeltaTable(uri).version()
    with pytest.raises(UnsupportedTableFeatureError, match="it uses deletion vectors"):
        TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["id"])).write(
            spark.createDataFrame([(1, "x")], "id long, name string")
        )
    assert DeltaTable(uri).version() == version
    _assert_clean(uri)


@CHANGES_BY
def test_null_keys_and_unordered_repeated_keys_fail_the_batch_with_nothing_committed(
    spark, tmp_path, monkeypatch, keys_limit
) -> None:
    _limit_collected_keys(monkeypatch, keys_limit)
    uri = _four_files(tmp_path)
    version = DeltaTable(uri).version()
    with pytest.raises(NullConstraintError, match="key column 'id' must not be NULL"):
        _upsert(uri).write(_changes(spark, [(1, "x", 1, "U"), (None, "y", 1, "U")]))
    unordered = TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["id"]))
    with pytest.raises(ConstraintViolationError, match="no sequence_by orders its changes: id = 3"):
        unordered.write(
            spark.createDataFrame([(3, "a", 1), (3, "b", 1)], "id long, name string, ts long")
        )
    assert DeltaTable(uri).version() == version
    assert len(read_rows(uri, ["id"])) == 40
    _assert_clean(uri)


def test_a_file_to_rewrite_that_vanished_fails_the_batch_with_nothing_committed(
    spark, tmp_path
) -> None:
    uri = _four_files(tmp_path)
    version = DeltaTable(uri).version()
    holding_15 = next(
        p for p in DeltaTable(uri).file_uris() if 15 in pq.read_table(p).column("id").to_pylist()
    )
    os.remove(holding_15)  # as a VACUUM with too short a retention would
    with pytest.raises(StagingError, match="could not read a file of the snapshot it rewrites"):
        _upsert(uri).write(_changes(spark, [(15, "changed", 1, "U")]))
    assert DeltaTable(uri).version() == version
    assert staging_leftovers(uri) == []


def test_a_file_that_vanishes_before_python_tasks_rewrite_it_fails_the_batch_cleanly(
    spark, tmp_path, monkeypatch
) -> None:
    from committers.delta.spark._upsert import UpsertStager

    uri = _four_files(tmp_path)
    version = DeltaTable(uri).version()
    found = UpsertStager._touched

    def then_vanish(self, *args):  # type: ignore[no-untyped-def]
        touched, *found_too = found(self, *args)
        for f in touched:  # after the driver read it, before the tasks do
            os.remove(Path(uri) / f.path)
        return (touched, *found_too)

    monkeypatch.setattr(UpsertStager, "_touched", then_vanish)
    with pytest.raises(StagingError, match=r"the upsert could not read '.*\.parquet' of"):
        _upsert(uri).write(_changes(spark, [(15, "changed", 1, "U"), (100, "new", 1, "I")]))
    assert DeltaTable(uri).version() == version
    assert staging_leftovers(uri) == []
    assert not list(Path(uri).glob("batch-*/*.parquet"))  # the new rows' file deleted too


@KEPT_BY
def test_a_new_row_breaking_a_check_constraint_fails_the_batch_while_files_are_rewritten(
    spark, tmp_path, staging
) -> None:
    """A CHECK constraint added by delta-rs: the new row's task fails while the touched file's
    kept rows are being rewritten (alongside, by Python tasks, or in the same Spark job)."""
    uri = _four_files(tmp_path)
    DeltaTable(uri).alter.add_constraint({"named": "name <> 'forbidden'"})
    version = DeltaTable(uri).version()
    with pytest.raises(ConstraintViolationError, match="named"):
        _upsert(uri, staging=staging).write(
            _changes(spark, [(15, "changed", 1, "U"), (100, "forbidden", 1, "I")])
        )
    assert DeltaTable(uri).version() == version
    assert _table_rows(uri, ["id", "name"]) == [(i, f"n{i}") for i in range(40)]
    _assert_clean(uri)
    assert not list(Path(uri).glob("batch-*/*.parquet"))


# -- who rewrites the kept rows does not change the table --------------------------------------


HOUR = dt.datetime(2026, 11, 21, 10, tzinfo=dt.timezone.utc)


def _made_by_delta_rs(uri: str) -> None:
    """A table partitioned by a string and a timestamp, written by delta-rs in three commits:
    values at their extremes, rows with NULL keys (never matched), and a column the first files
    lack (added later). Every row is at sequence (``ts``) 0."""
    utc = dt.timezone.utc
    first = pa.table(
        {
            "day": ["d 1", "d 1", "d 1", "d2", "d2"],
            "hour": pa.array([HOUR] * 5, pa.timestamp("us", utc)),
            "id": pa.array([1, 2, None, 1, 2], pa.int64()),
            "name": ["", "\U0001f600 non-BMP", "null key", "x", "y"],
            "amount": pa.array(
                [Decimal("-99999999.99"), None, Decimal("0.01"), None, None], pa.decimal128(10, 2)
            ),
            "at": pa.array(
                [
                    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc),
                    None,
                    dt.datetime(1, 1, 1, tzinfo=utc),
                    None,
                    None,
                ],
                pa.timestamp("us", utc),
            ),
            "score": pa.array([float("nan"), float("inf"), -0.0, None, 1.5], pa.float64()),
            "tags": pa.array([["a"], [], None, ["b", None], None], pa.list_(pa.string())),
            "ts": pa.array([0] * 5, pa.int64()),
        }
    )
    write_deltalake(uri, first, partition_by=["day", "hour"])
    write_deltalake(
        uri,
        first.slice(3).set_column(2, "id", pa.array([3, 4], pa.int64())),
        mode="append",
        partition_by=["day", "hour"],
    )
    later = first.slice(0, 2).set_column(2, "id", pa.array([5, 6], pa.int64()))
    later = later.append_column("note", pa.array(["added later", None]))
    write_deltalake(uri, later, mode="append", partition_by=["day", "hour"], schema_mode="merge")


def test_kept_rows_rewritten_by_python_tasks_or_by_spark_give_the_same_table(
    spark, tmp_path
) -> None:
    """With partial updates: the changes lack most columns, which updated rows keep."""
    changes = spark.createDataFrame(
        [
            ("d 1", HOUR, 1, "updated", 1, "U"),
            ("d2", HOUR, 1, None, 1, "D"),
            ("d2", HOUR, 2, None, 1, "D"),  # the file of d2 from the first commit: no row kept
            ("d 1", HOUR, 6, None, 1, "D"),  # in a file that has the later column
            ("d 1", HOUR, 9, "inserted", 1, "I"),
            ("d 1", HOUR + dt.timedelta(hours=1), 2, None, 1, "D"),  # another hour: no such row
        ],
        "day string, hour timestamp, id long, name string, ts long, op string",
    )
    tables = {}
    for staging in ("auto", "spark"):
        uri = str(tmp_path / staging)
        _made_by_delta_rs(uri)
        before = DeltaTable(uri).version()
        TwoPhaseSink(
            DeltaSink(
                uri,
                mode="upsert",
                keys=["day", "hour", "id"],
                sequence_by="ts",
                delete_when="op = 'D'",
                staging=staging,
                partial_updates=True,
            )
        ).write(changes)
        assert DeltaTable(uri).version() == before + 1
        _assert_clean(uri)
        _assert_stats_describe_files(uri)
        tables[staging] = uri
    columns = ["day", "hour", "id", "name", "amount", "at", "score", "tags", "note"]
    ours, spark_side = (_comparable(read_rows(tables[s], columns)) for s in ("auto", "spark"))
    assert ours == spark_side
    assert _comparable(duckdb_rows(tables["auto"])) == _comparable(duckdb_rows(tables["spark"]))
    by_key = {(r["day"], r["id"]): r for r in read_rows(tables["auto"], columns)}
    assert sorted(by_key, key=str) == sorted(
        [("d 1", 1), ("d 1", 2), ("d 1", None), ("d 1", 5), ("d 1", 9), ("d2", 3), ("d2", 4)],
        key=str,
    )
    updated = by_key[("d 1", 1)]
    assert updated["name"] == "updated" and updated["amount"] == Decimal("-99999999.99")
    assert math.isnan(updated["score"]) and updated["tags"] == ["a"] and updated["note"] is None
    assert by_key[("d 1", 9)]["amount"] is None  # inserted: NULL where the input has nothing
    kept = by_key[("d 1", 2)]
    assert kept["name"] == "\U0001f600 non-BMP" and math.isinf(kept["score"])
    assert by_key[("d 1", 5)]["note"] == "added later" and by_key[("d 1", 2)]["note"] is None
    assert by_key[("d 1", None)]["at"] == dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc)
    assert {r["hour"] for r in by_key.values()} == {HOUR}
    removed = [a["remove"]["path"] for a in _log(tables["auto"])[-1] if "remove" in a]
    assert len(removed) == 3  # d 1 of commits 0 and 2, d2 of commit 0; d2 of commit 1 untouched
    for staging, kept_by_python in (("auto", 2), ("spark", 0)):  # (d2's file keeps no row)
        added = [a["add"]["path"] for a in _log(tables[staging])[-1] if "add" in a]
        assert sum(p.split("/")[0].endswith("-kept") for p in added) == kept_by_python


def _comparable(rows: list[dict]) -> list[tuple]:
    """Rows as sortable tuples (NaN spelled, so that equal tables compare equal)."""

    def value(v):  # type: ignore[no-untyped-def]
        if isinstance(v, float) and math.isnan(v):
            return "NaN"
        return repr(v)

    return sorted(tuple(sorted((k, value(v)) for k, v in r.items())) for r in rows)


def _assert_stats_describe_files(uri: str) -> None:
    """Every live file's logged numRecords, null count and id bounds (when logged: a file
    with NaN or an infinity in a float column gets none) are its contents'."""
    table = DeltaTable(uri)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    for action in actions:
        ids = pq.read_table(Path(uri) / unquote(action["path"])).column("id")
        assert action["num_records"] == len(ids)
        assert action["null_count.id"] == ids.null_count
        present = [i for i in ids.to_pylist() if i is not None]
        if action.get("min.id") is not None:
            assert action["min.id"] == min(present) and action["max.id"] == max(present)


# -- the driver's and Spark's count of the touched files agree ---------------------------------


def test_touched_files_found_on_the_driver_or_by_spark_give_the_same_commit(
    spark, tmp_path, monkeypatch
) -> None:
    from committers.delta.spark import _upsert_matching, _upsert_touched

    def table(name: str) -> str:
        uri = str(tmp_path / name)
        for day in ("d0", "d1"):
            for first in (0, 10):
                ids = list(range(first, first + 10))
                data = {
                    "day": [day] * 10,
                    "id": pa.array(ids, pa.int64()),
                    "name": [f"{day}-{i}" for i in ids],
                    "ts": pa.array([0] * 10, pa.int64()),
                }
                write_deltalake(uri, pa.table(data), mode="append", partition_by=["day"])
        return uri

    changes = spark.createDataFrame(
        [
            ("d0", 3, "changed", 1, "U"),
            ("d0", 3, None, 0, "D"),  # older: loses
            ("d1", 12, None, 1, "D"),
            ("d1", 14, None, 1, "D"),
            ("d1", 99, "new", 1, "I"),
            ("d2", 3, None, 1, "D"),  # a partition the table does not have
        ],
        "day string, id long, name string, ts long, op string",
    )
    decided: list[object] = []

    def recorded(*args):  # type: ignore[no-untyped-def]
        decided.append(_upsert_touched.driver_matches(*args))
        return decided[-1]

    def upsert(uri: str) -> tuple[list[tuple], dict[str, str], set[str]]:
        TwoPhaseSink(
            DeltaSink(
                uri, mode="upsert", keys=["day", "id"], sequence_by="ts", delete_when="op = 'D'"
            )
        ).write(changes)
        actions = _log(uri)[-1]
        metrics = next(a["commitInfo"] for a in actions if "commitInfo" in a)["operationMetrics"]
        metrics.pop("executionTimeMs", None)
        removed = {a["remove"]["path"] for a in actions if "remove" in a}
        return _table_rows(uri, ["day", "id", "name"]), metrics, removed

    monkeypatch.setattr(_upsert_matching, "driver_matches", recorded)
    on_driver = upsert(table("driver"))
    assert decided and decided[-1] is not None  # the driver decided
    monkeypatch.setattr(_upsert_touched, "DRIVER_MAX_FILES", 0)
    by_spark = upsert(table("spark"))
    assert decided[-1] is None  # Spark's join decided
    rows, metrics, removed = on_driver
    assert rows == by_spark[0] and metrics == by_spark[1]
    assert {p.split("/")[0] for p in removed} == {"day=d0", "day=d1"}
    assert len(removed) == len(by_spark[2]) == 2
    assert metrics["numTargetRowsUpdated"] == "1" and metrics["numTargetRowsDeleted"] == "2"
    assert metrics["numTargetRowsCopied"] == "17"
    expected = {(d, i, f"{d}-{i}") for d in ("d0", "d1") for i in range(20)}
    expected -= {("d0", 3, "d0-3"), ("d1", 12, "d1-12"), ("d1", 14, "d1-14")}
    expected |= {("d0", 3, "changed"), ("d1", 99, "new")}
    assert rows == sorted(expected)


# -- sequence_by across batches ----------------------------------------------------------------

#: The ways a batch is applied: who finds the rows it replaces (the driver with pyarrow, or a
#: Spark join) and who rewrites the touched files' kept rows (Python tasks or Spark); a batch of
#: more keys than the driver collects leaves all of it to Spark.
APPLIED_BY = pytest.mark.parametrize(
    ("staging", "found_by", "keys_limit"),
    [
        ("auto", "driver", None),
        ("auto", "spark", None),
        ("spark", "driver", None),
        ("auto", "spark", 1),
    ],
    ids=["python-tasks", "python-tasks-after-a-spark-join", "spark-rewrite", "keys-not-collected"],
)


def _apply_by(monkeypatch, found_by: str, keys_limit: int | None) -> None:
    from committers.delta.spark import _upsert_touched

    _limit_collected_keys(monkeypatch, keys_limit)
    if found_by == "spark":
        monkeypatch.setattr(_upsert_touched, "DRIVER_MAX_FILES", 0)


def _kept_by_python(uri: str) -> bool:
    """Whether the newest commit adds files the Python tasks rewrote (``<run>-kept/``)."""
    added = [a["add"]["path"] for a in _log(uri)[-1] if "add" in a]
    return any(p.split("/")[0].endswith("-kept") for p in added)


def _metrics(uri: str) -> dict[str, str]:
    return next(a["commitInfo"] for a in _log(uri)[-1] if "commitInfo" in a)["operationMetrics"]


def _file_holding(uri: str, key: int) -> str:
    """The logged path of the live file whose id stats hold ``key``."""
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    (path,) = [a["path"] for a in actions if a["min.id"] <= key <= a["max.id"]]
    return path


@APPLIED_BY
def test_a_change_older_than_the_stored_row_is_not_applied(
    spark, tmp_path, monkeypatch, staging, found_by, keys_limit
) -> None:
    _apply_by(monkeypatch, found_by, keys_limit)
    uri = str(tmp_path / "t")
    for ids in ([1, 2, 3], [4, 5], [6, 8]):  # three files, every row at ts 5
        stamped = {"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids]}
        stamped["ts"] = pa.array([5] * len(ids), pa.int64())
        write_deltalake(uri, pa.table(stamped), mode="append")
    first, untouched, third = (_file_holding(uri, key) for key in (1, 4, 6))
    batch = [
        (1, "newer", 6, "U"),
        (2, "older", 4, "U"),  # a late update: the stored row (ts 5) is newer
        (3, "tie", 5, "U"),  # a tie with the stored row: the later arrival wins
        (4, None, 4, "D"),  # a late delete does nothing
        (5, None, 5, "D"),  # a tie: a non-delete (the stored row) wins over a delete
        (6, None, 6, "D"),
        (7, "new", 1, "I"),  # no stored row: inserted whatever its sequence
    ]
    _upsert(uri, staging=staging).write(_changes(spark, batch))
    columns = ["id", "name", "ts"]
    expected = [
        (1, "newer", 6),
        (2, "n2", 5),
        (3, "tie", 5),
        (4, "n4", 5),
        (5, "n5", 5),
        (7, "new", 1),
        (8, "n8", 5),
    ]
    assert _table_rows(uri, columns) == expected
    assert _duckdb_table_rows(uri, columns) == expected
    removed = {a["remove"]["path"] for a in _log(uri)[-1] if "remove" in a}
    assert removed == {first, third}  # the file of 4 and 5 holds stale matches only
    live = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).column("path").to_pylist()
    assert untouched in live
    metrics = _metrics(uri)
    assert metrics["numStaleChanges"] == "3"
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsDeleted"]) == ("2", "1")
    assert metrics["numTargetRowsCopied"] == "2"  # 2 and 8
    assert _kept_by_python(uri) == (staging == "auto" and keys_limit is None)

    # The next batch is compared with the rows this one wrote.
    later = [(1, "late", 5, "U"), (7, "later", 2, "U"), (2, None, 6, "D")]
    _upsert(uri, staging=staging).write(_changes(spark, later))
    expected = [r for r in expected if r[0] != 2]
    expected[expected.index((7, "new", 1))] = (7, "later", 2)
    assert _table_rows(uri, columns) == expected
    assert _duckdb_table_rows(uri, columns) == expected
    assert _metrics(uri)["numStaleChanges"] == "1"
    _assert_clean(uri)


def test_spark_and_pyarrow_order_a_change_against_the_stored_row_alike(spark) -> None:
    """The rule of test_upsert_touched.py's cases, evaluated by Spark (the kept rows of
    ``staging="spark"`` and of large batches, the Spark join's count)."""
    from committers.delta.spark._upsert_stored import _DELETE, _applies, _sequence, _stored
    from committers.tests.delta.spark.test_upsert_touched import APPLIES_CASES, APPLIES_NAN_CASES

    for cases, kind in ((APPLIES_CASES, "long"), (APPLIES_NAN_CASES, "double")):
        for width in sorted({len(stored) for stored, *_ in cases}):
            subset = [c for c in cases if len(c[0]) == width]
            columns = [f"{_stored(i)} {kind}" for i in range(width)]
            columns += [f"{_sequence(i)} {kind}" for i in range(width)]
            ddl = ", ".join([*columns, f"{_DELETE} boolean", "expected boolean"])
            rows = [
                (*stored, *change, deletes, expected)
                for stored, change, deletes, expected in subset
            ]
            got = spark.createDataFrame(rows, ddl).select(
                _applies(["s"] * width).alias("applies"), "expected"
            )
            assert [(r.applies, r.expected) for r in got.collect()] == [
                (expected, expected) for *_, expected in subset
            ]


def test_the_sequence_by_column_must_be_stored_by_the_table(spark, tmp_path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"]}))
    changes = _changes(spark, [(1, "x", 3, "U")])
    with pytest.raises(
        SchemaMismatchError,
        match=r"sequence_by names \['ts'\], not a column of .*schema_mode='merge' adds it",
    ):
        _upsert(uri).write(changes)
    assert DeltaTable(uri).version() == 0
    _upsert(uri, schema_mode="merge").write(changes)  # adds ts: the rows held have none
    late = _changes(spark, [(1, "late", 2, "U"), (2, None, 0, "D")])
    _upsert(uri, schema_mode="merge").write(late)
    assert _table_rows(uri, ["id", "name", "ts"]) == [(1, "x", 3)]  # 2 stored without: older
    assert _duckdb_table_rows(uri, ["id", "name", "ts"]) == [(1, "x", 3)]
    partitioned = str(tmp_path / "p")
    write_deltalake(
        partitioned,
        pa.table({"id": pa.array([1], pa.int64()), "ts": pa.array([1], pa.int64())}),
        partition_by=["ts"],
    )
    with pytest.raises(ConfigurationError, match=r"sequence_by names \['ts'\], partition col"):
        _upsert(partitioned).write(_changes(spark, [(1, "x", 3, "U")]).drop("name"))
    assert DeltaTable(partitioned).version() == 0
    _assert_clean(uri)


def test_a_late_change_after_a_delete_comes_back_unless_deletes_are_kept_as_rows(
    spark, tmp_path
) -> None:
    """The documented gap: a delete leaves no row to compare a later change with. A soft
    delete (an update that marks the row) keeps the sequence, so the late change is stale."""
    uri = str(tmp_path / "hard")
    _upsert(uri).write(_changes(spark, [(1, "a", 1, "I")]))
    _upsert(uri).write(_changes(spark, [(1, None, 5, "D")]))
    _upsert(uri).write(_changes(spark, [(1, "late", 3, "U")]))
    assert _table_rows(uri, ["id", "name", "ts"]) == [(1, "late", 3)]  # back, as documented

    uri = str(tmp_path / "soft")
    soft = "id long, name string, ts long, deleted boolean"
    sink = TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["id"], sequence_by="ts"))
    sink.write(spark.createDataFrame([(1, "a", 1, False)], soft))
    sink.write(spark.createDataFrame([(1, "a", 5, True)], soft))
    sink.write(spark.createDataFrame([(1, "late", 3, False)], soft))
    expected = [(1, "a", 5, True)]
    assert _table_rows(uri, ["id", "name", "ts", "deleted"]) == expected
    assert _duckdb_table_rows(uri, ["id", "name", "ts", "deleted"]) == expected
    _assert_clean(uri)


# -- deletes that carry only their key ---------------------------------------------------------


@pytest.mark.parametrize("keys", [["id"], ["day", "id"]], ids=["day-not-a-key", "day-a-key"])
@APPLIED_BY
def test_a_delete_carrying_only_its_key_deletes_the_row_wherever_it_lives(
    spark, tmp_path, monkeypatch, staging, found_by, keys_limit, keys
) -> None:
    """As CDC tools emit deletes: the key, the sequence and the operation; every other column
    NULL, the partition column too unless it is part of the key."""
    _apply_by(monkeypatch, found_by, keys_limit)
    uri = str(tmp_path / "t")
    write_deltalake(
        uri,
        pa.table(
            {
                "id": pa.array([1, 2, 3, 4], pa.int64()),
                "day": ["d1", "d2", "d2", "d1"],
                "name": ["a", "b", "c", "d"],
                "ts": pa.array([1, 1, 1, 5], pa.int64()),
            }
        ),
        partition_by=["day"],
    )
    day = (lambda d: d) if keys == ["day", "id"] else (lambda d: None)
    deletes = [
        (1, day("d1"), None, 2, "D"),
        (2, day("d2"), None, 2, "D"),
        (4, day("d1"), None, 4, "D"),
    ]
    TwoPhaseSink(
        DeltaSink(
            uri,
            mode="upsert",
            keys=keys,
            sequence_by="ts",
            delete_when="op = 'D'",
            staging=staging,
        )
    ).write(spark.createDataFrame(deletes, "id long, day string, name string, ts long, op string"))
    expected = [(3, "d2", "c", 1), (4, "d1", "d", 5)]  # 4's delete is older than the row
    columns = ["id", "day", "name", "ts"]
    assert _table_rows(uri, columns) == expected
    assert _duckdb_table_rows(uri, columns) == expected
    assert _metrics(uri)["numTargetRowsDeleted"] == "2"
    _assert_clean(uri)


# -- partial updates ---------------------------------------------------------------------------


def _customers(uri: str) -> None:
    """A table made by delta-rs: email NOT NULL, tier partitions it, shout is generated from
    name."""
    from deltalake import Field, Schema

    shout = Field("shout", "string", metadata={"delta.generationExpression": "upper(name)"})
    DeltaTable.create(
        uri,
        schema=Schema(
            [
                Field("id", "long"),
                Field("name", "string"),
                Field("email", "string", nullable=False),
                Field("tier", "string"),
                Field("ts", "long"),
                shout,
            ]
        ),
        partition_by=["tier"],
    )
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "name": ["a", "b", "c", "d"],
            "email": ["a@x", "b@x", "c@x", "d@x"],
            "tier": ["gold", "gold", None, "gold"],
            "ts": pa.array([1, 1, 1, 1], pa.int64()),
            "shout": ["A", "B", "C", "D"],
        },
        schema=pa.schema(
            [
                ("id", pa.int64()),
                ("name", pa.string()),
                ("email", pa.string(), False),
                ("tier", pa.string()),
                ("ts", pa.int64()),
                ("shout", pa.string()),
            ]
        ),
    )
    write_deltalake(uri, rows, mode="append")


def test_an_input_lacking_a_table_column_is_refused_unless_partial_updates(spark, tmp_path) -> None:
    uri = str(tmp_path / "t")
    _customers(uri)
    version = DeltaTable(uri).version()
    feed = "id long, name string, ts long, op string"  # no email, no tier (shout is generated)
    changes = spark.createDataFrame([(1, "renamed", 2, "U")], feed)
    with pytest.raises(
        SchemaMismatchError,
        match=r"the input lacks column\(s\) \['email', 'tier'\] of .*partial_updates=True",
    ):
        _upsert(uri).write(changes)
    assert DeltaTable(uri).version() == version
    _assert_clean(uri)


@KEPT_BY
def test_partial_updates_keep_the_stored_values_of_the_columns_the_input_lacks(
    spark, tmp_path, staging
) -> None:
    uri = str(tmp_path / "t")
    _customers(uri)
    feed = "id long, name string, ts long, op string"
    sink = _upsert(uri, staging=staging, partial_updates=True)
    sink.write(
        spark.createDataFrame(
            [(1, "renamed", 2, "U"), (3, "late", 0, "U"), (2, None, 2, "D")], feed
        )
    )
    expected = [
        (1, "renamed", "a@x", "gold", 2, "RENAMED"),  # email and tier kept, shout recomputed
        (3, "c", "c@x", None, 1, "C"),  # stale
        (4, "d", "d@x", "gold", 1, "D"),
    ]
    columns = ["id", "name", "email", "tier", "ts", "shout"]
    assert _table_rows(uri, columns) == expected
    assert _duckdb_table_rows(uri, columns) == expected
    assert _kept_by_python(uri) == (staging == "auto")
    version = DeltaTable(uri).version()
    with pytest.raises(NullConstraintError, match="email"):  # an insert has no email to keep
        sink.write(spark.createDataFrame([(1, "again", 3, "U"), (9, "new", 3, "I")], feed))
    assert DeltaTable(uri).version() == version
    assert _table_rows(uri, columns) == expected
    _assert_clean(uri)


def test_partial_updates_insert_nulls_where_the_table_allows_them(spark, tmp_path) -> None:
    uri = _four_files(tmp_path)
    changes = spark.createDataFrame([(5, 1, "U"), (100, 1, "I")], "id long, ts long, op string")
    _upsert(uri, partial_updates=True).write(changes)
    rows = dict(_table_rows(uri, ["id", "name"]))
    assert rows[5] == "n5" and rows[100] is None and len(rows) == 41
    assert dict(_duckdb_table_rows(uri, ["id", "name"])) == rows


# -- Spark Connect -----------------------------------------------------------------------------


def test_an_upsert_under_spark_connect_is_refused_naming_spark_connect(
    spark, connect, tmp_path, monkeypatch
) -> None:
    uri = str(tmp_path / "t")
    changes = connect.createDataFrame([(1, "x")], "id long, name string")
    message = "mode='upsert' cannot run under Spark Connect"
    with pytest.raises(ConfigurationError, match=message):  # a Connect DataFrame
        TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["id"])).write(changes)
    # SparkSession.builder.remote(...) makes every new session a Connect one, in a process
    # that may also run the Connect server (and so a JVM): Spark Connect is the reason then too.
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    with pytest.raises(ConfigurationError, match=message) as refused:
        TwoPhaseSink(DeltaSink(uri, mode="upsert", keys=["id"])).write(changes)
    assert "Hadoop" not in str(refused.value)
    assert not (tmp_path / "t").exists()
