"""Auto-compaction (``DeltaSink(auto_compact=...)``): a stream of small micro-batches compacts
its small files between batches, in ``dataChange=false`` commits that readers of the table as
a stream pass over; bounded writes and an opted-out stream do not; a driver killed inside or
right after a compaction leaves the table exact, without leftovers, and compacted once.

Rows are read back with deltalake and DuckDB's delta extension."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from committers.delta import DeltaSink, register
from committers.delta.commit import _compact as compact_module
from committers.delta.commit._auto_compact import OPERATION_FENCE, AutoCompactor
from committers.delta.commit._compact import COMMIT_OPERATION
from committers.delta.storage._storage import TableLocation
from committers.delta.table._table import referenced_paths
from committers.delta.write import AutoCompact
from committers.tests._campaign import AUTO_COMPACT_VARIABLE, _Source, start_driver
from committers.tests._campaign_driver import AUTO_COMPACT_MIN_FILES
from committers.tests._delta_helpers import data_files_on_disk, staging_leftovers
from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import file_stream, make_source, run_available_now
from framework import TwoPhaseSink
from framework.errors import ConfigurationError
from framework.sink import Epoch

pytestmark = pytest.mark.spark

PER_FILE = 10


# -- helpers --------------------------------------------------------------------------------


def _commits(uri: str) -> list[tuple[int, list[dict]]]:
    """(version, actions) of every commit file of a local table, oldest first."""
    log = Path(uri) / "_delta_log"
    return [
        (int(path.stem), [json.loads(line) for line in path.read_text().splitlines()])
        for path in sorted(log.glob("[0-9]*.json"))
    ]


def _compactions(uri: str) -> list[tuple[int, list[dict]]]:
    return [
        (version, actions)
        for version, actions in _commits(uri)
        if any(a.get("commitInfo", {}).get(COMMIT_OPERATION) == "compaction" for a in actions)
    ]


def _ids(uri: str) -> list[int]:
    """The table's ids read by deltalake, after checking DuckDB reads the same."""
    by_deltalake = DeltaTable(uri).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    assert sorted(r["id"] for r in duckdb_rows(uri)) == sorted(by_deltalake)
    return sorted(by_deltalake)


def _live_files(uri: str) -> int:
    return len(DeltaTable(uri).file_uris())


def _assert_no_leftovers(uri: str) -> None:
    """No staged manifest left, and every Parquet file on disk is one the log references
    (live, or replaced by a compaction and kept for time travel)."""
    assert staging_leftovers(uri) == []
    assert data_files_on_disk(uri) <= referenced_paths(TableLocation.of(uri))


def _stream_ids(spark, uri: str, checkpoint: Path) -> list[int]:
    """Every id our "deltalake" source delivers reading the table as a stream from its start."""
    register(spark)
    delivered: list[int] = []

    def collect(df, _batch_id):
        delivered.extend(r.id for r in df.select("id").collect())

    query = (
        spark.readStream.format("deltalake")
        .load(uri)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return delivered


# -- streaming ------------------------------------------------------------------------------


def test_a_stream_of_small_batches_is_compacted_between_batches(spark, tmp_path):
    """Ten batches of one small file each, compacted every four small files: the same rows
    once, fewer live files, compaction commits that only move rows (``dataChange=false`` on
    every add and remove, as many records added as removed), and a stream reading the table
    sees every row exactly once."""
    src = make_source(tmp_path, files=10, per_file=PER_FILE)
    uri = str(tmp_path / "table")
    seen_at_report: dict[int, int] = {}  # batch -> table version when its metrics came
    sink = TwoPhaseSink(
        DeltaSink(uri, app_id="small", auto_compact=AutoCompact(min_num_files=4)),
        on_batch=lambda m: seen_at_report.update({m.batch_id: DeltaTable(uri).version()}),
    )
    run_available_now(sink, file_stream(spark, src), tmp_path / "chk")

    assert [b.status for b in sink.batches] == ["committed"] * 10
    # a batch's metrics come after its upkeep, the compaction it triggered included
    compacted_after = {b.batch_id for b in sink.batches if b.version + 1 in dict(_compactions(uri))}
    assert compacted_after
    for batch in sink.batches:
        assert batch.upkeep_ms > 0
        assert seen_at_report[batch.batch_id] == batch.version + (batch.batch_id in compacted_after)
    assert _ids(uri) == list(range(10 * PER_FILE))
    compactions = _compactions(uri)
    assert len(compactions) >= 2
    records: dict[str, int] = {}  # numRecords of every file ever added
    for version, actions in _commits(uri):
        for action in actions:
            if "add" in action:
                records[action["add"]["path"]] = json.loads(action["add"]["stats"])["numRecords"]
        if version not in dict(compactions):
            continue
        adds = [a["add"] for a in actions if "add" in a]
        removes = [a["remove"] for a in actions if "remove" in a]
        assert adds and removes and not any("txn" in a for a in actions)
        assert all(a["dataChange"] is False for a in adds + removes)
        assert sum(records[a["path"]] for a in adds) == sum(records[r["path"]] for r in removes)
    assert _live_files(uri) < 4  # ten batch files, compacted every four
    _assert_no_leftovers(uri)
    assert sorted(_stream_ids(spark, uri, tmp_path / "reader")) == list(range(10 * PER_FILE))


def test_an_opted_out_stream_does_not_compact(spark, tmp_path):
    src = make_source(tmp_path, files=4, per_file=PER_FILE)
    uri = str(tmp_path / "table")
    off = AutoCompact(enabled=False, min_num_files=2)
    run_available_now(
        TwoPhaseSink(DeltaSink(uri, app_id="off", auto_compact=off)),
        file_stream(spark, src),
        tmp_path / "chk",
    )
    assert _compactions(uri) == []
    assert _live_files(uri) == 4
    assert _ids(uri) == list(range(4 * PER_FILE))


def test_bounded_writes_compact_only_when_asked(spark, tmp_path):
    """Bounded writes do not compact by default, even past the threshold; with
    ``auto_compact=True`` the write that reaches it does."""
    uri = str(tmp_path / "table")
    sink = TwoPhaseSink(DeltaSink(uri, app_id="nightly", auto_compact=AutoCompact(min_num_files=3)))
    for n in range(4):
        sink.write(spark.range(n * PER_FILE, (n + 1) * PER_FILE).coalesce(1))
    assert _compactions(uri) == []
    assert _live_files(uri) == 4

    TwoPhaseSink(DeltaSink(uri, app_id="nightly", auto_compact=True)).write(
        spark.range(4 * PER_FILE, 5 * PER_FILE).coalesce(1)
    )
    assert _live_files(uri) == 5  # below the default 50 small files: nothing yet
    asked = AutoCompact(enabled=True, min_num_files=3)
    TwoPhaseSink(DeltaSink(uri, app_id="nightly", auto_compact=asked)).write(
        spark.range(5 * PER_FILE, 6 * PER_FILE).coalesce(1)
    )
    assert len(_compactions(uri)) == 1
    assert _live_files(uri) == 1
    assert _ids(uri) == list(range(6 * PER_FILE))
    _assert_no_leftovers(uri)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("yes", "auto_compact must be None"),
        (AutoCompact, "auto_compact must be None"),
        ({"min_num_files": 2}, "auto_compact must be None"),
    ],
)
def test_a_bad_auto_compact_value_is_refused(tmp_path, value, message):
    with pytest.raises(ConfigurationError, match=message):
        DeltaSink(str(tmp_path / "t"), auto_compact=value)
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"enabled": "true"}, "must be True, False or None"),
        ({"min_num_files": 1}, "at least 2"),
        ({"min_num_files": 2.5}, "at least 2"),
        ({"min_num_files": True}, "at least 2"),
        ({"max_file_size": 1000}, "at least 1048576 bytes"),
        ({"min_file_size": 0}, "positive integer"),
        ({"min_file_size": 4 << 20, "max_file_size": 2 << 20}, "larger than max_file_size"),
    ],
)
def test_bad_auto_compact_options_are_refused(options, message):
    with pytest.raises(ConfigurationError, match=message):
        AutoCompact(**options)


def test_a_small_file_threshold_above_the_sinks_target_is_refused(tmp_path):
    with pytest.raises(ConfigurationError, match="larger than the compaction's target"):
        DeltaSink(
            str(tmp_path / "t"),
            target_file_size=8 << 20,
            auto_compact=AutoCompact(min_file_size=16 << 20),
        )


# -- crashes --------------------------------------------------------------------------------


def _run_driver(source: _Source, uri: str, checkpoint: Path, crash_at: str | None) -> bool:
    """Run the campaign's streaming job over the source once; whether it was killed."""
    process = start_driver(
        "committers.tests._campaign_driver",
        [str(source.directory), uri, str(checkpoint), "auto", "0", "json"],
        crash_log=checkpoint.parent / "crashes.log",
        crash_at=crash_at,
        env={AUTO_COMPACT_VARIABLE: "1"},
    )
    _, stderr = process.communicate(timeout=300)
    if process.returncode == -signal.SIGKILL:
        return True
    assert process.returncode == 0, stderr[-4000:]
    return False


def _compaction_manifests(uri: str) -> list[str]:
    return [p for p in staging_leftovers(uri) if "/sink-compaction/" in p]


@pytest.mark.slow
@pytest.mark.xdist_group("kills_processes")
def test_a_driver_killed_inside_and_after_a_compaction_leaves_it_exact_and_done_once(tmp_path):
    """The campaign's job (partitioned by day, compacting a partition at three small files),
    killed right before a compaction's commit, then right after one, then run to the end:
    every row once, no staged file left, and each compaction committed once (the one that
    landed is not redone after the restart)."""
    source = _Source(tmp_path / "source")
    uri = str(tmp_path / "table")
    checkpoint = tmp_path / "checkpoint"
    for _ in range(AUTO_COMPACT_MIN_FILES):  # a batch per file, a file per day in each
        source.add_file()

    # 1. Killed with the compaction's files staged, before its commit: nothing committed.
    assert _run_driver(source, uri, checkpoint, "compaction_commit")
    assert _compactions(uri) == []
    assert _compaction_manifests(uri), "the kill left no staged compaction to settle"
    assert _live_files(uri) == 3 * AUTO_COMPACT_MIN_FILES
    assert _ids(uri) == list(range(source.next_id))

    # 2. The restart replays the last batch as a skip, deletes the killed run's files and
    #    compacts; killed right after that commit, before its staging manifest is deleted.
    assert _run_driver(source, uri, checkpoint, "compaction_committed")
    assert len(_compactions(uri)) == 1
    assert _compaction_manifests(uri), "the kill left no manifest of the landed compaction"
    assert _live_files(uri) == 3  # one file per day

    # 3. The restart settles the landed run (keeps its files) and compacts nothing more.
    assert not _run_driver(source, uri, checkpoint, None)
    assert len(_compactions(uri)) == 1
    assert _live_files(uri) == 3
    assert _ids(uri) == list(range(source.next_id))  # sorted: a duplicate would show
    _assert_no_leftovers(uri)


# -- a stalled process (zombie) -------------------------------------------------------------


def _compactor(uri: str, min_num_files: int) -> AutoCompactor:
    return AutoCompactor(
        TableLocation.of(uri),
        AutoCompact(min_num_files=min_num_files),
        target_file_size=128 << 20,
        compression="snappy",
        staging="arrow",
        user_metadata=None,
        skip_conditional_put_check=False,
    )


def _epoch(epoch_id: int) -> Epoch:
    return Epoch(app_id="stalled", epoch_id=epoch_id, writer_identity="w", run_id=f"r{epoch_id}")


def _fences(uri: str) -> list[int]:
    return [
        version
        for version, actions in _commits(uri)
        if any(a.get("commitInfo", {}).get(COMMIT_OPERATION) == OPERATION_FENCE for a in actions)
    ]


@pytest.mark.parametrize("moment", ["before_its_commit_request", "right_after_its_commit"])
def test_a_stalled_process_whose_compaction_its_successor_settled_loses_no_file(
    spark, tmp_path, monkeypatch, moment
):
    """A process of the writer stalls with a compaction past its last check (its manifest is
    there) and before its commit request, or right after its commit; meanwhile the writer's
    next process settles that run as left by a killed process. Before the fence the successor
    deleted the staged files and the stalled commit then landed pointing at them. Now: either
    the stalled commit loses its version to the fence and gives up, or it landed below the
    fence and its files are kept. Every live file exists, the rows are the same (deltalake
    and DuckDB), one fence, at most one compaction, nothing staged left."""
    uri = str(tmp_path / "table")
    for part in range(4):
        write_deltalake(
            uri, pa.table({"id": list(range(part * 10, part * 10 + 10))}), mode="append"
        )
    stalled, successor = _compactor(uri, 2), _compactor(uri, 1000)  # the successor only settles
    commit_request = compact_module.write_transaction
    calls = []

    def stalling(*args, **kwargs):
        calls.append(moment)
        if moment == "before_its_commit_request" and len(calls) == 1:
            successor.after_epoch(_epoch(2), lambda: DeltaTable(uri))
        commit_request(*args, **kwargs)
        if moment == "right_after_its_commit":
            successor.after_epoch(_epoch(2), lambda: DeltaTable(uri))

    monkeypatch.setattr(compact_module, "write_transaction", stalling)
    stalled.after_epoch(_epoch(1), lambda: DeltaTable(uri))

    missing = [path for path in DeltaTable(uri).file_uris() if not Path(path).exists()]
    assert missing == []
    assert _ids(uri) == list(range(40))
    assert len(_fences(uri)) == 1
    if moment == "before_its_commit_request":
        assert calls == [moment]  # its next attempt found the manifest gone: no second request
        assert stalled.last_result is None and _compactions(uri) == []
        assert _live_files(uri) == 4
    else:
        assert len(_compactions(uri)) == 1 and _compactions(uri)[0][0] < _fences(uri)[0]
        assert _live_files(uri) == 1
    _assert_no_leftovers(uri)
