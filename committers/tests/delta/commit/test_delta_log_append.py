"""The blind-append commit writer (``_log_append``): its view of the log, its commit file
(against the one delta-rs writes for the same commit), put-if-absent on the local file system
and on S3, and Delta's conflict rules when a race is lost."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import AddAction

from committers.delta.commit import _log_append
from committers.delta.commit._log_append import (
    AppendConflict,
    AppendIdentity,
    LogView,
    LogViewUnavailable,
    append,
    commit_lines,
    shape_of,
)
from committers.delta.commit._log_store import LogStore
from committers.delta.storage._storage import TableLocation
from committers.delta.table._rules import TableShape
from committers.tests._log_races import race_before_write
from committers.tests._readers import duckdb_rows

SCHEMA = pa.schema([("id", pa.int64()), ("day", pa.string())])


def me(app_id: str = "app", epoch_id: int = 1, run_id: str = "run-1") -> AppendIdentity:
    return AppendIdentity(
        app_id=app_id,
        epoch_id=epoch_id,
        run_id=run_id,
        writer_identity="writer-a",
        app_key="sink.appId",
        epoch_key="sink.epochId",
        run_key="sink.runId",
    )


def metadata_for(who: AppendIdentity) -> dict:
    return {
        "sink.appId": who.app_id,
        "sink.epochId": str(who.epoch_id),
        "sink.writerIdentity": who.writer_identity,
        "sink.runId": who.run_id,
        "isBlindAppend": True,
        "operationParameters": {"outputMode": "Append", "epochId": str(who.epoch_id)},
        "operationMetrics": {"numFiles": "1", "numOutputRows": "2"},
        "userMetadata": "é user",
    }


def new_table(root: Path, partition_by=("day",)) -> str:
    uri = str(root)
    rows = pa.table({"id": [0], "day": ["d0"]}, schema=SCHEMA)
    write_deltalake(uri, rows, partition_by=list(partition_by) or None)
    return uri


def data_file(uri: str, relative: str, values: list[int], day: str | None) -> dict:
    """A real Parquet file under the table and its add action (as the sink stages one)."""
    path = Path(uri) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": values}), path)
    stats = {
        "numRecords": len(values),
        "minValues": {"id": min(values)},
        "maxValues": {"id": max(values)},
        "nullCount": {"id": 0},
    }
    return {
        "path": relative,
        "partitionValues": {"day": day},
        "size": path.stat().st_size,
        "modificationTime": 1_700_000_000_000,
        "dataChange": True,
        "stats": json.dumps(stats, separators=(",", ":")),
    }


def our_append(uri: str, adds: list[dict], who: AppendIdentity, view: LogView | None = None):
    store = LogStore(TableLocation.of(uri))
    view = view or LogView.load(store)
    return append(
        store,
        view,
        who,
        lambda now: commit_lines(
            adds,
            txn=(who.app_id, who.epoch_id),
            custom_metadata=metadata_for(who),
            partition_by=view.metadata["partitionColumns"],
            now_ms=now,
        ),
    )


def delta_rs_append(uri: str, adds: list[dict], who: AppendIdentity) -> None:
    table = DeltaTable(uri)
    table.create_write_transaction(
        [
            AddAction(
                a["path"],
                a["size"],
                a["partitionValues"],
                a["modificationTime"],
                a["dataChange"],
                a["stats"],
            )
            for a in adds
        ],
        mode="append",
        schema=table.schema(),
        partition_by=table.metadata().partition_columns or None,
        commit_properties=CommitProperties(
            app_transactions=[Transaction(who.app_id, who.epoch_id)],
            custom_metadata=metadata_for(who),
        ),
    )


def log_lines(uri: str, version: int) -> list[dict]:
    text = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def without_times(lines: list[dict]) -> list[dict]:
    for line in lines:
        line.get("commitInfo", {}).pop("timestamp", None)
    return lines


@pytest.mark.parametrize("partition_by", [("day",), ()])
def test_commit_file_is_what_delta_rs_writes_for_the_same_commit(tmp_path, partition_by):
    ours, theirs = (
        new_table(tmp_path / "ours", partition_by),
        new_table(tmp_path / "theirs", partition_by),
    )
    day = "d é/1%" if partition_by else None
    relative = "day=d é%2F1%25/part é 1.parquet" if partition_by else "part é 1.parquet"
    who = me()
    for uri, commit in ((ours, our_append), (theirs, delta_rs_append)):
        commit(
            uri, [data_file(uri, relative, [5, 6], day), data_file(uri, "b.parquet", [7], day)], who
        )
    mine, reference = log_lines(ours, 1), log_lines(theirs, 1)
    assert [list(line) for line in mine] == [list(line) for line in reference]  # action order
    assert without_times(mine) == without_times(reference)
    for a, b in zip(mine[1:3], reference[1:3], strict=True):  # add keys in delta-rs's order
        assert list(a["add"]) == list(b["add"])
    raw = (Path(ours) / "_delta_log" / f"{1:020d}.json").read_bytes()
    assert "é".encode() in raw and b"\\u00e9" not in raw  # raw UTF-8, as serde_json writes
    table = DeltaTable(ours)
    assert table.version() == 1 and table.transaction_version("app") == 1
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [0, 5, 6, 7]


def test_view_from_a_checkpoint_then_probing_matches_delta_rs(tmp_path):
    uri = new_table(tmp_path / "t")
    for epoch_id in range(1, 5):
        delta_rs_append(
            uri, [data_file(uri, f"e{epoch_id}.parquet", [epoch_id], "d1")], me(epoch_id=epoch_id)
        )
    DeltaTable(uri).create_checkpoint()
    delta_rs_append(uri, [data_file(uri, "e9.parquet", [9], "d1")], me("other", 9))
    store = LogStore(TableLocation.of(uri))
    read: list[str] = []
    original = store.read
    store.read = lambda name: read.append(name) or original(name)  # type: ignore[method-assign]
    view = LogView.load(store)
    assert read == ["_last_checkpoint", f"{5:020d}.json", f"{6:020d}.json"]  # never listed
    table = DeltaTable(uri)
    assert view.version == table.version() == 5
    assert view.txns == {"app": 4, "other": 9}
    assert shape_of(view) == TableShape.of_table(table)
    read.clear()
    assert view.advance(store) == [] and read == [f"{6:020d}.json"]  # one probe when current


def test_a_cleaned_log_without_checkpoint_cannot_be_followed(tmp_path):
    uri = new_table(tmp_path / "t")
    (Path(uri) / "_delta_log" / f"{0:020d}.json").unlink()
    with pytest.raises(LogViewUnavailable):
        LogView.load(LogStore(TableLocation.of(uri)))


def test_local_put_if_absent_never_replaces_a_version(tmp_path):
    uri = new_table(tmp_path / "t")
    store = LogStore(TableLocation.of(uri))
    first = (Path(uri) / "_delta_log" / f"{0:020d}.json").read_bytes()
    assert store.put_if_absent(f"{0:020d}.json", b"{}\n") is False
    assert store.put_if_absent(f"{1:020d}.json", b"{}\n") is True
    assert (Path(uri) / "_delta_log" / f"{0:020d}.json").read_bytes() == first
    assert sorted(p.name for p in (Path(uri) / "_delta_log").iterdir()) == [
        f"{0:020d}.json",
        f"{1:020d}.json",
    ]  # no temporary file left


def test_another_writers_append_in_the_race_window_moves_ours_to_the_next_version(
    tmp_path, monkeypatch
):
    uri = new_table(tmp_path / "t")
    view = LogView.load(LogStore(TableLocation.of(uri)))
    theirs = data_file(uri, "theirs.parquet", [1], "d1")
    race_before_write(monkeypatch, lambda: delta_rs_append(uri, [theirs], me("other", 7)))
    outcome = our_append(uri, [data_file(uri, "ours.parquet", [2], "d2")], me(), view)
    assert (outcome.version, outcome.races_lost, view.version) == (2, 1, 2)
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [0, 1, 2]
    assert table.transaction_version("app") == 1 and table.transaction_version("other") == 7


@pytest.mark.parametrize(
    "change, reason",
    [
        (
            lambda uri: DeltaTable(uri).alter.add_columns(
                [__import__("deltalake").Field("extra", "string")]
            ),
            "metadata",
        ),
        (
            lambda uri: DeltaTable(uri).alter.set_table_properties(
                {"delta.enableChangeDataFeed": "true"}
            ),
            "protocol",
        ),
        (lambda uri: delta_rs_append(uri, [], me("app", 5, run_id="run-other")), "txn of app id"),
    ],
    ids=["schema change", "protocol upgrade", "our app id"],
)
def test_conflicting_commit_in_the_race_window_writes_nothing(
    tmp_path, monkeypatch, change, reason
):
    uri = new_table(tmp_path / "t")
    view = LogView.load(LogStore(TableLocation.of(uri)))
    race_before_write(monkeypatch, lambda: change(uri))
    with pytest.raises(AppendConflict, match=reason):
        our_append(uri, [data_file(uri, "ours.parquet", [2], "d2")], me(), view)
    table = DeltaTable(uri)
    assert table.version() == 1
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == [0]


def test_our_own_landed_commit_found_after_a_lost_answer(tmp_path, monkeypatch):
    """A PUT that landed but whose answer was lost is retried and answered "exists": the
    winner is our own commit, and the append reports its version."""
    uri = new_table(tmp_path / "t")
    original = LogStore.put_if_absent

    def put_twice(self, name, data):
        original(self, name, data)
        return original(self, name, data)

    monkeypatch.setattr(LogStore, "put_if_absent", put_twice)
    outcome = our_append(uri, [data_file(uri, "ours.parquet", [2], "d2")], me())
    assert (outcome.version, outcome.races_lost) == (1, 1)
    assert DeltaTable(uri).version() == 1


def test_tables_we_append_to_read_alike_and_delta_rs_continues_after_us(tmp_path):
    uri = new_table(tmp_path / "t")
    view = LogView.load(LogStore(TableLocation.of(uri)))
    for epoch_id in range(1, 4):
        adds = [
            data_file(
                uri,
                f"day=d{epoch_id}/e{epoch_id}.parquet",
                [epoch_id * 10, epoch_id * 10 + 1],
                f"d{epoch_id}",
            )
        ]
        our_append(uri, adds, me(epoch_id=epoch_id), view)
    expected = [0, 10, 11, 20, 21, 30, 31]
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table()["id"].to_pylist()) == expected
    filtered = table.to_pyarrow_dataset().to_table(filter=pa.compute.field("id") >= 20)
    assert sorted(filtered["id"].to_pylist()) == [20, 21, 30, 31]
    from deltalake import QueryBuilder

    rows = (
        QueryBuilder().register("t", table).execute("select id from t where day = 'd2'").read_all()
    )
    assert rows["id"].to_pylist() in ([20, 21], [21, 20])
    assert sorted(r["id"] for r in duckdb_rows(uri)) == expected
    write_deltalake(uri, pa.table({"id": [99], "day": ["d9"]}, schema=SCHEMA), mode="append")
    DeltaTable(uri).create_checkpoint()
    after = LogView.load(LogStore(TableLocation.of(uri)))
    assert after.version == 4 and after.txns == {"app": 3}
    assert sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist()) == [*expected, 99]


def test_s3_conditional_put_and_race(s3, bucket, monkeypatch):
    uri = f"s3://{bucket}/log-append/{uuid.uuid4().hex[:8]}"
    options = s3.storage_options()
    location = TableLocation.of(uri, options)
    write_deltalake(
        uri,
        pa.table({"id": [0], "day": ["d0"]}, schema=SCHEMA),
        storage_options=location.delta_storage_options(),
    )
    store = LogStore(location)
    assert store.put_if_absent(f"{0:020d}.json", b"{}\n") is False
    view = LogView.load(store)
    assert view.version == 0

    def other() -> None:  # another writer wins version 1 in our race window
        DeltaTable(uri, storage_options=location.delta_storage_options()).create_write_transaction(
            [],
            mode="append",
            schema=DeltaTable(uri, storage_options=location.delta_storage_options()).schema(),
            commit_properties=CommitProperties(app_transactions=[Transaction("other", 3)]),
        )

    race_before_write(monkeypatch, other)
    who = me()
    outcome = append(
        store,
        view,
        who,
        lambda now: commit_lines(
            [],
            txn=(who.app_id, who.epoch_id),
            custom_metadata=metadata_for(who),
            partition_by=[],
            now_ms=now,
        ),
    )
    assert outcome.version == 2 and outcome.races_lost == 1
    table = DeltaTable(uri, storage_options=location.delta_storage_options())
    assert table.version() == 2
    assert table.transaction_version("app") == 1 and table.transaction_version("other") == 3


def test_module_refuses_in_commit_timestamp_tables(tmp_path):
    uri = new_table(tmp_path / "t")
    view = LogView.load(LogStore(TableLocation.of(uri)))
    assert _log_append.unsupported_by_append(view) is None
    view.protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "writerFeatures": ["inCommitTimestamp"],
    }
    assert "inCommitTimestamp" in (_log_append.unsupported_by_append(view) or "")


def test_s3_view_catches_up_with_a_backlog_in_a_few_round_trips(s3, bucket, monkeypatch):
    """A view loaded over 30 commits (no checkpoint) reads them with a read-ahead of concurrent
    GETs: the same version and txns as delta-rs, in five round trips to S3 instead of 31."""
    uri = f"s3://{bucket}/log-backlog/{uuid.uuid4().hex[:8]}"
    location = TableLocation.of(uri, s3.storage_options())
    options = location.delta_storage_options()
    write_deltalake(
        uri, pa.table({"id": [0], "day": ["d0"]}, schema=SCHEMA), storage_options=options
    )
    table = DeltaTable(uri, storage_options=options)
    for version in range(1, 31):
        table.update_incremental()
        table.create_write_transaction(
            [],
            mode="append",
            schema=table.schema(),
            commit_properties=CommitProperties(app_transactions=[Transaction("other", version)]),
        )
    store = LogStore(location)
    round_trips: list[object] = []
    original = LogStore._translated

    def counted(call, what):
        round_trips.append(what)
        return original(call, what)

    monkeypatch.setattr(LogStore, "_translated", staticmethod(counted))
    view = LogView.load(store)
    # _last_checkpoint, version 0, then 1 (a window of one), 2-9 (eight), 10-73 (64 at once)
    assert len(round_trips) == 5, round_trips
    assert view.version == DeltaTable(uri, storage_options=options).version() == 30
    assert view.txns == {"other": 30}
    round_trips.clear()
    assert view.advance(store) == [] and len(round_trips) == 1  # one GET when current
