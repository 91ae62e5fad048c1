"""Delta writer and global committer, driven directly (no Spark): commits, replays, races,
cleanup, statistics and file shaping."""

from __future__ import annotations

import datetime
import json
import shutil
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaGlobalCommitter, DeltaSink, StagedFile, StagedFileSerializer
from committers.delta.commit import _epoch_write as epoch_write_module
from committers.delta.storage._staging import STAGING_DIR
from committers.delta.storage._storage import TableLocation
from committers.delta.table._table import open_table
from committers.tests._delta_helpers import (
    assert_no_duplicates,
    assert_no_orphans,
    batch,
    committed_files,
    data_files_on_disk,
    epoch,
    ids,
    read_rows,
    stage,
    staging_leftovers,
)
from framework.errors import (
    ConcurrentWriterError,
    ConfigurationError,
)
from framework.sink import Epoch, deserialize_versioned, serialize_versioned

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.string())])


def make_sink(tmp_path, **kwargs) -> DeltaSink:
    sink = DeltaSink(str(tmp_path / "t"), app_id="app", partition_by=["day"], **kwargs)
    sink.prepare(SCHEMA)
    return sink


def day_batch(start: int, stop: int) -> pa.RecordBatch:
    values = list(range(start, stop))
    return batch(values, day=pa.array([f"d{i % 3}" for i in values]))


def commit_epoch(sink, ep, batches, committer=None):
    committer = committer or sink.create_global_committer()
    files = stage(sink, ep, batches)
    committer.commit([committer.combine(ep, files)])
    committer.clean_up(ep)
    return committer, files


def test_one_transaction_per_epoch_with_txn_and_partitions(tmp_path):
    sink = make_sink(tmp_path)
    _, files = commit_epoch(sink, epoch(0), [day_batch(0, 50), day_batch(50, 100)])
    table = DeltaTable(sink.table_uri)
    assert table.version() == 0  # the first commit creates the table with its data
    assert table.transaction_version("app") == 0
    assert ids(sink.table_uri) == list(range(100))
    assert {f.partition_values["day"] for f in files} == {"d0", "d1", "d2"}
    assert all(f.path.startswith(f"day={f.partition_values['day']}/") for f in files)
    assert sorted(r["day"] for r in read_rows(sink.table_uri)) == sorted(
        f"d{i % 3}" for i in range(100)
    )
    assert_no_orphans(sink.table_uri)


def test_replay_by_a_new_committer_process_is_detected_from_the_table(tmp_path):
    sink = make_sink(tmp_path)
    ep = epoch(3)
    commit_epoch(sink, ep, [day_batch(0, 10)])
    fresh = sink.create_global_committer()  # as after a driver restart
    assert fresh.is_committed(epoch(3)) and fresh.is_committed(epoch(2))
    assert not fresh.is_committed(epoch(4))
    assert fresh.last_committed_epoch("app") == 3
    assert fresh.last_committed_epoch("other") is None


def test_racing_commits_of_the_same_epoch_land_once(tmp_path):
    sink = make_sink(tmp_path)
    ep_a, ep_b = epoch(0, writer="query-A"), epoch(0, writer="query-B")
    files_a, files_b = stage(sink, ep_a, [day_batch(0, 10)]), stage(sink, ep_b, [day_batch(0, 10)])
    committers = [sink.create_global_committer(), sink.create_global_committer()]
    for c in committers:
        c.table()  # both read the same snapshot before racing
    outcomes: list[object] = []
    barrier = threading.Barrier(2)

    def run(committer, ep, files):
        barrier.wait()
        try:
            committer.commit([committer.combine(ep, files)])
            outcomes.append("ok")
        except ConcurrentWriterError as err:
            outcomes.append(err)

    threads = [
        threading.Thread(target=run, args=(committers[0], ep_a, files_a)),
        threading.Thread(target=run, args=(committers[1], ep_b, files_b)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(map(str, outcomes)).count("ok") == 1, outcomes
    assert sum(isinstance(o, ConcurrentWriterError) for o in outcomes) == 1
    assert ids(sink.table_uri) == list(range(10))
    assert DeltaTable(sink.table_uri).transaction_version("app") == 0


def test_different_app_ids_racing_both_land(tmp_path):
    sink = make_sink(tmp_path)
    eps = [epoch(0, app_id=f"app-{i}") for i in range(4)]
    staged = [stage(sink, ep, [day_batch(i * 100, i * 100 + 20)]) for i, ep in enumerate(eps)]
    barrier = threading.Barrier(len(eps))

    def run(ep, files):
        committer = sink.create_global_committer()
        committer.table()
        barrier.wait()
        committer.commit([committer.combine(ep, files)])

    threads = [threading.Thread(target=run, args=pair) for pair in zip(eps, staged, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expected = sorted(i * 100 + j for i in range(4) for j in range(20))
    assert ids(sink.table_uri) == expected
    table = DeltaTable(sink.table_uri)
    assert [table.transaction_version(ep.app_id) for ep in eps] == [0, 0, 0, 0]


def test_a_table_another_writer_creates_while_it_is_opened_is_opened(tmp_path, monkeypatch):
    """Between the look for a log (none yet) and the listing of the root, another writer
    commits the table's first version and deletes the manifest that named its run directory:
    the root then holds files no manifest names. That is the new table, not foreign files."""
    sink = make_sink(tmp_path)
    other = epoch(0, app_id="first-writer")
    committer = sink.create_global_committer()
    committer.commit([committer.combine(other, stage(sink, other, [day_batch(0, 10)]))])
    shutil.rmtree(Path(sink.table_uri, STAGING_DIR))  # as its committed epoch's clean-up does
    real = DeltaTable.is_deltatable
    looks: list[bool] = []

    def not_yet_then_real(uri, storage_options=None):  # the first look came too early
        looks.append(bool(looks) and real(uri, storage_options=storage_options))
        return looks[-1]

    monkeypatch.setattr(DeltaTable, "is_deltatable", staticmethod(not_yet_then_real))
    opened = open_table(TableLocation.of(sink.table_uri))
    assert looks == [False, True]
    assert opened is not None and opened.version() == 0


def test_writer_abort_removes_its_files_and_manifest(tmp_path):
    sink = make_sink(tmp_path)
    from framework.sink import WriterContext

    writer = sink.create_writer(
        WriterContext(epoch=epoch(0), partition_id=0, attempt_number=0, task_attempt_id=0)
    )
    writer.write(day_batch(0, 10))
    assert staging_leftovers(sink.table_uri)  # the manifest exists before any file
    writer.abort()
    assert data_files_on_disk(sink.table_uri) == set()
    assert staging_leftovers(sink.table_uri) == []


def test_stats_match_the_data(tmp_path):
    schema = pa.schema(
        [
            ("id", pa.int64()),
            ("s", pa.string()),
            ("ts", pa.timestamp("us", tz="UTC")),
            ("d", pa.date32()),
            ("f", pa.float64()),
            ("flag", pa.bool_()),
            ("st", pa.struct([("x", pa.int32())])),
        ]
    )
    sink = DeltaSink(str(tmp_path / "t"), app_id="app")
    sink.prepare(schema)
    t0 = datetime.datetime(2026, 11, 21, 10, 0, 0, 123456, tzinfo=datetime.timezone.utc)
    end_of_time = datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=datetime.timezone.utc)

    def stats_of(f: list[float]) -> dict:
        data = pa.RecordBatch.from_pydict(
            {
                "id": [5, 1, None],
                "s": ["b", "𠮷" * 40, "z"],
                "ts": [t0, end_of_time, None],
                "d": [datetime.date(2026, 1, 2), datetime.date(2025, 1, 1), None],
                "f": f,
                "flag": [True, None, True],
                "st": [{"x": 1}, None, {"x": None}],
            },
            schema=schema,
        )
        (staged,) = stage(sink, epoch(0), [data])
        assert "\\u" not in staged.stats  # raw UTF-8, no surrogate pairs
        return json.loads(staged.stats)

    stats = stats_of([1.5, 0.0, -2.0])
    assert stats["numRecords"] == 3
    assert stats["nullCount"] == {
        "id": 1,
        "s": 0,
        "ts": 1,
        "d": 1,
        "f": 0,
        "flag": 1,
        "st": {"x": 2},
    }
    assert stats["minValues"] == {
        "id": 1,
        "s": "b",
        "ts": "2026-11-21T10:00:00.123456Z",
        "d": "2025-01-01",
        "f": -2.0,
        "flag": True,
        "st": {"x": 1},
    }
    assert stats["maxValues"] == {
        "id": 5,
        "s": "𠮷" * 32 + "\U0010ffff",  # delta-spark's truncation: a prefix and a tie-breaker
        "ts": "9999-12-31T23:59:59.999999Z",
        "d": "2026-01-02",
        "f": 1.5,
        "flag": True,
        "st": {"x": 1},
    }
    # NaN sorts above every number in Spark SQL and Delta, and Parquet bounds leave it out:
    # such a file gets no bounds at all (readers take a one-sided bound as null).
    with_nan = stats_of([1.5, float("nan"), -2.0])
    assert "minValues" not in with_nan and "maxValues" not in with_nan
    assert with_nan["nullCount"] == stats["nullCount"]


def test_files_roll_at_target_size_and_row_groups_are_large(tmp_path):
    sink = DeltaSink(
        str(tmp_path / "t"),
        app_id="app",
        target_file_size=256 * 1024,
        row_group_rows=20_000,
        row_group_bytes=1 << 30,
    )
    schema = pa.schema([("id", pa.int64()), ("s", pa.string())])
    sink.prepare(schema)
    batches = [
        pa.RecordBatch.from_pydict(
            {"id": list(range(i, i + 5000)), "s": [f"value-{j}" * 3 for j in range(i, i + 5000)]},
            schema=schema,
        )
        for i in range(0, 200_000, 5000)
    ]
    files = stage(sink, epoch(0), batches)
    assert len(files) > 1
    assert sum(f.num_records for f in files) == 200_000
    for f in files[:-1]:
        metadata = pq.read_metadata(str(tmp_path / "t" / f.path))
        assert f.size >= 256 * 1024
        # 5,000-row input batches are merged into 20,000-row row groups
        assert {metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)} == {20_000}


def test_timestamps_are_int64_micros_not_int96(tmp_path):
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
    sink = DeltaSink(str(tmp_path / "t"), app_id="app")
    sink.prepare(schema)
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    (staged,) = stage(sink, epoch(0), [pa.RecordBatch.from_pydict({"id": [1], "ts": [now]})])
    column = pq.read_metadata(str(tmp_path / "t" / staged.path)).schema.column(1)
    assert column.physical_type == "INT64"
    assert "timeUnit=microseconds" in str(column.logical_type)


def test_committable_serializer_round_trip():
    staged = StagedFile(
        path="day=a/part-1.parquet",
        size=10,
        partition_values={"day": "a", "k": None},
        num_records=3,
        stats='{"numRecords":3}',
        modification_time=123,
        task_attempt_id=7,
    )
    serializer = StagedFileSerializer()
    assert deserialize_versioned(serializer, serialize_versioned(serializer, staged)) == staged


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"app_id": ""}, "app_id"),
        ({"partition_by": ["a", "a"]}, "twice"),
        ({"schema_mode": "replace"}, "schema_mode must be 'strict', 'merge' or 'overwrite'"),
        ({"schema_mode": "overwrite"}, "schema_mode='overwrite' .* needs mode='overwrite'"),
        ({"target_file_size": 0}, "target_file_size"),
        ({"compression": "lzma"}, "compression"),
        ({"upload_part_size": 1024 * 1024}, "between 5 MiB and 5 GiB"),
        ({"upload_concurrency": 0}, "upload_concurrency"),
    ],
)
def test_bad_options_are_rejected_at_construction(tmp_path, kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        DeltaSink(str(tmp_path / "t"), **kwargs)


def test_many_epochs_keep_txn_monotonic_and_rows_exact(tmp_path):
    sink = make_sink(tmp_path)
    committer = sink.create_global_committer()
    for e in range(12):
        commit_epoch(sink, epoch(e), [day_batch(e * 10, e * 10 + 10)], committer)
    values = ids(sink.table_uri)
    assert_no_duplicates(values)
    assert values == list(range(120))
    assert DeltaTable(sink.table_uri).transaction_version("app") == 11
    assert_no_orphans(sink.table_uri)


def _age(path, seconds):
    import os
    import time

    old = time.time() - seconds
    os.utime(path, (old, old))


def test_remove_orphan_files_keeps_committed_and_young_files(tmp_path):
    sink = make_sink(tmp_path)
    _, committed = commit_epoch(sink, epoch(0), [day_batch(0, 10)])
    orphaned_old = stage(sink, epoch(1, writer="crashed"), [day_batch(10, 20)])
    orphaned_young = stage(sink, epoch(2, writer="running"), [day_batch(20, 30)])
    root = tmp_path / "t"
    for f in [*committed, *orphaned_old]:
        _age(root / f.path, 3 * 86400)
    for manifest in (root / "_sink_staging").rglob("*.json"):
        if "crashed" in manifest.as_posix():
            _age(manifest, 3 * 86400)
    week = datetime.timedelta(days=1)
    dry = sink.remove_orphan_files(retention=week, dry_run=True)
    assert {f.path for f in orphaned_old} <= set(dry)
    assert data_files_on_disk(sink.table_uri) >= {f.path for f in orphaned_old}  # dry run
    removed = sink.remove_orphan_files(retention=week)
    assert removed == dry
    on_disk = data_files_on_disk(sink.table_uri)
    assert on_disk == {f.path for f in committed} | {f.path for f in orphaned_young}
    assert not [m for m in staging_leftovers(sink.table_uri) if "crashed" in m]
    assert ids(sink.table_uri) == list(range(10))


def test_remove_orphan_files_refuses_a_short_retention(tmp_path):
    sink = make_sink(tmp_path)
    with pytest.raises(ConfigurationError, match="shorter than"):
        sink.remove_orphan_files(retention=datetime.timedelta(minutes=5))


def test_remove_orphan_files_spares_files_of_a_live_writer_and_foreign_files(tmp_path):
    sink = make_sink(tmp_path)
    commit_epoch(sink, epoch(0), [day_batch(0, 10)])
    live = stage(sink, epoch(1, writer="still-running"), [day_batch(10, 20)])
    root = tmp_path / "t"
    foreign = root / "notes.txt"
    foreign.write_text("not the table's")
    for f in live:  # old data files, but their writer's manifest is fresh: it may still commit
        _age(root / f.path, 3 * 86400)
    _age(foreign, 3 * 86400)
    assert sink.remove_orphan_files(retention=datetime.timedelta(days=1)) == []
    assert {f.path for f in live} <= data_files_on_disk(sink.table_uri)
    assert foreign.exists()


def test_aborting_one_run_keeps_another_live_runs_staged_files(tmp_path):
    """Two runs of one epoch under one identity (a zombie driver and its restart, or two
    re-runs of write(df, epoch_id=N)): one aborting must not delete what the other commits."""
    sink = make_sink(tmp_path)
    surviving, aborting = epoch(0, writer="w"), epoch(0, writer="w")
    kept = stage(sink, surviving, [day_batch(0, 10)])
    stage(sink, aborting, [day_batch(100, 110)])
    sink.create_global_committer().abort(aborting)
    assert {f.path for f in kept} <= data_files_on_disk(sink.table_uri)
    committer = sink.create_global_committer()
    committer.commit([committer.combine(surviving, kept)])
    committer.clean_up(surviving)
    assert ids(sink.table_uri) == list(range(10))
    assert_no_orphans(sink.table_uri)


def test_same_app_id_commit_after_both_checked_is_refused(tmp_path):
    """Deterministic race: both writers pass the replay check, then commit one after the other;
    the second is caught (by the txn re-check or delta-rs conflict detection), never applied."""
    sink = make_sink(tmp_path)
    ep_a, ep_b = epoch(0, writer="query-A"), epoch(0, writer="query-B")
    files_a, files_b = stage(sink, ep_a, [day_batch(0, 10)]), stage(sink, ep_b, [day_batch(0, 10)])
    first, second = sink.create_global_committer(), sink.create_global_committer()
    assert not first.is_committed(ep_a)
    assert not second.is_committed(ep_b)
    first.commit([first.combine(ep_a, files_a)])
    with pytest.raises(ConcurrentWriterError, match="two writers"):
        second.commit([second.combine(ep_b, files_b)])
    second.clean_up(ep_b)
    assert ids(sink.table_uri) == list(range(10))
    assert DeltaTable(sink.table_uri).version() == 0


def test_restarted_driver_cleans_up_after_a_commit_it_did_not_see(tmp_path):
    """Committed, then the driver died before clean-up, with a failed attempt's files around:
    the next driver recognises the replay and deletes exactly the uncommitted files."""
    sink = make_sink(tmp_path)
    ep = epoch(0)
    stage(sink, ep, [day_batch(50, 60)], attempt=0)  # the failed attempt
    good = stage(sink, ep, [day_batch(0, 10)], attempt=1)
    crashed = sink.create_global_committer()
    crashed.commit([crashed.combine(ep, good)])  # ... and no clean_up: the driver died
    restarted = sink.create_global_committer()
    replay = epoch(0)  # same writer, new run
    assert restarted.is_committed(replay)
    restarted.clean_up(replay)
    assert committed_files(sink.table_uri) == {f.path for f in good}
    assert_no_orphans(sink.table_uri)


def test_expired_logs_are_cleaned_on_a_cadence_and_the_table_stays_exact(tmp_path):
    import time

    sink = DeltaSink(
        str(tmp_path / "t"),
        app_id="app",
        partition_by=["day"],
        table_configuration={
            "delta.logRetentionDuration": "interval 1 second",
            "delta.checkpointInterval": "2",
        },
    )
    sink.prepare(SCHEMA)
    from committers.delta import DeltaGlobalCommitter

    committer = DeltaGlobalCommitter(
        sink.location,
        plan=sink._plan,
        input_schema=SCHEMA,
        schema_mode="strict",
        table_configuration=sink.table_configuration,
        log_cleanup_every=4,
    )
    log_dir = tmp_path / "t" / "_delta_log"
    for e in range(8):
        if e == 4:
            time.sleep(1.2)  # the first versions are now past the log retention
        commit_epoch(sink, epoch(e), [day_batch(e * 10, e * 10 + 10)], committer)
    committer.close()  # lets the clean-up due since version 4 finish (it runs off the commit)
    assert not (log_dir / f"{1:020d}.json").exists()
    assert ids(sink.table_uri) == list(range(80))
    assert DeltaTable(sink.table_uri).transaction_version("app") == 7


def test_a_failing_background_write_surfaces_and_abort_leaves_nothing(tmp_path, monkeypatch):
    from framework.errors import StagingError
    from framework.sink import WriterContext

    sink = DeltaSink(str(tmp_path / "t"), app_id="app", row_group_rows=1000)
    schema = pa.schema([("id", pa.int64())])
    sink.prepare(schema)
    calls = {"n": 0}
    original = pq.ParquetWriter.write_table

    def failing_write(self, table, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full")
        return original(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", failing_write)
    writer = sink.create_writer(
        WriterContext(epoch=epoch(0), partition_id=0, attempt_number=0, task_attempt_id=0)
    )
    with pytest.raises(StagingError, match="disk full"):
        for start in range(0, 20_000, 1000):
            writer.write(pa.RecordBatch.from_pydict({"id": list(range(start, start + 1000))}))
        writer.prepare_commit(True)
    writer.abort()
    writer.close()
    assert data_files_on_disk(sink.table_uri) == set()
    assert staging_leftovers(sink.table_uri) == []


def test_rows_land_in_their_partitions_with_several_partition_columns(tmp_path):
    schema = pa.schema(
        [("id", pa.int64()), ("a", pa.string()), ("b", pa.int32()), ("c", pa.bool_())]
    )
    sink = DeltaSink(str(tmp_path / "t"), app_id="app", partition_by=["a", "b", "c"])
    sink.prepare(schema)
    n = 3000
    data = pa.RecordBatch.from_pydict(
        {
            "id": list(range(n)),
            "a": [f"a{i % 7}" if i % 11 else None for i in range(n)],
            "b": [i % 13 for i in range(n)],
            "c": [i % 2 == 0 for i in range(n)],
        },
        schema=schema,
    )
    committer = sink.create_global_committer()
    ep = epoch(0)
    files = stage(sink, ep, [data])
    committer.commit([committer.combine(ep, files)])
    for f in files:  # every file holds only rows of its own partition
        assert f.path.startswith(
            f"a={f.partition_values['a'] or '__HIVE_DEFAULT_PARTITION__'}/"
            f"b={f.partition_values['b']}/c={f.partition_values['c']}/"
        )
    rows = read_rows(sink.table_uri)
    expected = data.to_pylist()
    assert sorted(rows, key=lambda r: r["id"]) == expected


def test_txn_ids_outlive_a_short_transaction_retention(tmp_path):
    """delta.setTransactionRetentionDuration expires txn actions by their lastUpdated; the sink
    writes none, so its replay detection survives any stop, checkpoints included."""
    sink = make_sink(
        tmp_path, table_configuration={"delta.setTransactionRetentionDuration": "interval 1 second"}
    )
    commit_epoch(sink, epoch(0), [day_batch(0, 10)])
    commit_epoch(sink, epoch(1), [day_batch(10, 20)])
    time.sleep(2.5)  # past the retention
    table = DeltaTable(sink.table_uri)
    table.create_checkpoint()
    assert DeltaTable(sink.table_uri).transaction_version("app") == 1
    committer = sink.create_global_committer()
    assert committer.is_committed(epoch(1)) and not committer.is_committed(epoch(2))
    log_text = "".join(p.read_text() for p in (tmp_path / "t" / "_delta_log").glob("*.json"))
    assert '"txn"' in log_text and "lastUpdated" not in log_text


# -- one-off epochs (bounded writes without an app id): no txn, reconciled by run id --------


def one_off(epoch_id: int = 0) -> Epoch:
    return Epoch(
        app_id=f"bounded-{uuid.uuid4()}:write",
        epoch_id=epoch_id,
        writer_identity="write-once",
        run_id=str(uuid.uuid4()),
        bounded=True,
        one_off=True,
    )


def logged_actions(table_uri: str, kind: str) -> list[dict]:
    """Every ``kind`` action (``txn``, ``commitInfo``, ...) in the table's JSON commits."""
    commits = sorted((Path(table_uri) / "_delta_log").glob("*.json"))
    actions = [json.loads(line) for path in commits for line in path.read_text().splitlines()]
    return [a[kind] for a in actions if kind in a]


def commit_one_off(sink: DeltaSink, ep: Epoch, batches) -> DeltaGlobalCommitter:
    """As the engine runs an epoch: replay check, staging, commit, clean-up."""
    committer = sink.create_global_committer()
    assert not committer.is_committed(ep)
    files = stage(sink, ep, batches)
    committer.commit([committer.combine(ep, files)])
    committer.clean_up(ep)
    return committer


def test_one_off_epochs_commit_without_txn_with_their_run_id(tmp_path):
    sink = make_sink(tmp_path)
    runs = [one_off(), one_off(), one_off()]
    for n, ep in enumerate(runs):
        committer = commit_one_off(sink, ep, [day_batch(n * 10, n * 10 + 10)])
        assert committer.committed_version(ep) == n
    assert ids(sink.table_uri) == list(range(30))
    assert logged_actions(sink.table_uri, "txn") == []
    infos = logged_actions(sink.table_uri, "commitInfo")
    assert [info["sink.runId"] for info in infos] == [ep.run_id for ep in runs]
    assert not [key for info in infos for key in info if key in ("sink.appId", "sink.epochId")]
    assert all("epochId" not in info.get("operationParameters", {}) for info in infos)
    assert_no_orphans(sink.table_uri)


def test_a_one_off_commit_whose_response_is_lost_is_found_by_run_id(tmp_path, monkeypatch):
    """The commit lands, then the connection drops (an unknown outcome): the committer finds
    the commit by its run id and does not commit again. The first commit creates the table,
    the second appends: both paths."""
    sink = make_sink(tmp_path)
    landed: list[str] = []
    real_create = epoch_write_module.create_table_with_add_actions
    real_append = DeltaTable.create_write_transaction

    def create_then_drop(*args, **kwargs):
        real_create(*args, **kwargs)
        landed.append("create")
        raise OSError("connection reset by peer")

    def append_then_drop(self, *args, **kwargs):
        real_append(self, *args, **kwargs)
        landed.append("append")
        raise OSError("connection reset by peer")

    monkeypatch.setattr(epoch_write_module, "create_table_with_add_actions", create_then_drop)
    monkeypatch.setattr(DeltaTable, "create_write_transaction", append_then_drop)
    first, second = one_off(), one_off()
    assert commit_one_off(sink, first, [day_batch(0, 10)]).committed_version(first) == 0
    assert commit_one_off(sink, second, [day_batch(10, 20)]).committed_version(second) == 1
    assert landed == ["create", "append"]  # each commit was made once, never repeated
    assert DeltaTable(sink.table_uri).version() == 1
    assert ids(sink.table_uri) == list(range(20))
    assert logged_actions(sink.table_uri, "txn") == []
    assert_no_orphans(sink.table_uri)


def test_a_one_off_commit_that_lands_late_is_not_committed_again(tmp_path, monkeypatch):
    """The first attempt fails with an unknown outcome and is found not landed; its request
    lands while the second attempt commits. delta-rs must not rebase the second attempt past
    it (nothing in the late commit tells delta-rs it is the same write): the second attempt
    fails, and the reconciliation finds the late commit."""
    sink = make_sink(tmp_path)
    commit_one_off(sink, one_off(), [day_batch(0, 10)])
    real_append = DeltaTable.create_write_transaction
    calls: list[tuple] = []

    def lost_then_late(self, *args, **kwargs):
        calls.append((args, kwargs))
        if len(calls) == 1:
            raise OSError("timed out")  # the request is still on its way
        if len(calls) == 2:  # ... and lands now, before this attempt's commit
            real_append(DeltaTable(sink.table_uri), *calls[0][0], **calls[0][1])
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", lost_then_late)
    late = one_off()
    committer = commit_one_off(sink, late, [day_batch(10, 20)])
    assert len(calls) == 2 and committer.committed_version(late) == 1
    assert DeltaTable(sink.table_uri).version() == 1
    assert_no_duplicates(ids(sink.table_uri))
    assert ids(sink.table_uri) == list(range(20))
    assert_no_orphans(sink.table_uri)


def test_a_one_off_commit_not_landed_is_retried_on_a_fresh_snapshot(tmp_path, monkeypatch):
    """An unknown outcome that did not land, while another writer appended: the retry lands
    once, after the other writer's commit."""
    sink = make_sink(tmp_path)
    commit_one_off(sink, one_off(), [day_batch(0, 10)])
    real_append = DeltaTable.create_write_transaction
    calls = {"n": 0}

    def lost_while_another_commits(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 1:
            commit_one_off(sink, one_off(), [day_batch(100, 110)])  # the other writer
            raise OSError("timed out")  # ... and this request never reached the store
        return real_append(self, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", lost_while_another_commits)
    retried = one_off()
    assert commit_one_off(sink, retried, [day_batch(10, 20)]).committed_version(retried) == 2
    assert ids(sink.table_uri) == [*range(20), *range(100, 110)]
    assert logged_actions(sink.table_uri, "txn") == []
    assert_no_orphans(sink.table_uri)
