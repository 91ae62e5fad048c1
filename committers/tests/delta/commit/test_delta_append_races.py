"""The committer's blind appends straight into the log: no snapshot on the warm path, and
every kind of concurrent commit landing exactly between its probe and its write."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field, write_deltalake

from committers.delta import DeltaSink
from committers.tests._delta_helpers import batch, epoch, ids, stage
from committers.tests._log_races import race_before_write
from committers.tests._readers import duckdb_rows
from framework.errors import ConcurrentWriterError, StaleStagingError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.string())])


def make_sink(tmp_path) -> DeltaSink:
    sink = DeltaSink(str(tmp_path / "t"), app_id="app", partition_by=["day"])
    sink.prepare(SCHEMA)
    return sink


def rows(start: int, stop: int) -> pa.RecordBatch:
    values = list(range(start, stop))
    return batch(values, day=pa.array([f"d{i % 2}" for i in values]))


def commit(sink, committer, ep, batches) -> None:
    files = stage(sink, ep, batches)
    if not committer.is_committed(ep):
        committer.commit([committer.combine(ep, files)])
    committer.clean_up(ep)


def started(tmp_path):
    """A table with batch 0 of the sink, and a committer that has appended once since."""
    sink = make_sink(tmp_path)
    committer = sink.create_global_committer()
    commit(sink, committer, epoch(0), [rows(0, 10)])
    commit(sink, committer, epoch(1), [rows(10, 20)])
    return sink, committer


def delta_rs_rows(uri: str, start: int, stop: int, mode: str = "append") -> None:
    values = list(range(start, stop))
    table = pa.table({"id": values, "day": [f"d{i % 2}" for i in values]}, schema=SCHEMA)
    write_deltalake(uri, table, mode=mode)


def test_warm_append_needs_no_snapshot(tmp_path, monkeypatch):
    sink, committer = started(tmp_path)
    calls: list[str] = []
    for name in ("__init__", "update_incremental", "create_write_transaction", "is_deltatable"):
        original = getattr(DeltaTable, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(DeltaTable, name, spy if name != "is_deltatable" else staticmethod(spy))
    commit(sink, committer, epoch(2), [rows(20, 30)])
    assert calls == []
    monkeypatch.undo()
    table = DeltaTable(sink.table_uri)
    assert table.version() == 2 and table.transaction_version("app") == 2
    assert ids(sink.table_uri) == list(range(30))
    assert sorted(r["id"] for r in duckdb_rows(sink.table_uri)) == list(range(30))
    assert committer.committed_version(epoch(2)) == 2
    restarted = sink.create_global_committer()  # the replay check of a restart, from the log
    assert restarted.is_committed(epoch(2)) and not restarted.is_committed(epoch(3))


def test_a_delta_rs_append_in_the_window_lands_and_so_do_we(tmp_path, monkeypatch):
    sink, committer = started(tmp_path)
    race_before_write(monkeypatch, lambda: delta_rs_rows(sink.table_uri, 100, 105))
    commit(sink, committer, epoch(2), [rows(20, 30)])
    table = DeltaTable(sink.table_uri)
    assert table.version() == 3 and table.transaction_version("app") == 2
    assert ids(sink.table_uri) == [*range(30), *range(100, 105)]
    assert committer.committed_version(epoch(2)) == 3  # the next version after the winner


def test_a_delta_rs_overwrite_in_the_window_is_not_a_conflict_for_an_append(tmp_path, monkeypatch):
    sink, committer = started(tmp_path)
    race_before_write(monkeypatch, lambda: delta_rs_rows(sink.table_uri, 100, 105, "overwrite"))
    commit(sink, committer, epoch(2), [rows(20, 30)])
    assert ids(sink.table_uri) == [*range(20, 30), *range(100, 105)]
    assert DeltaTable(sink.table_uri).transaction_version("app") == 2


def test_a_schema_change_in_the_window_stops_the_commit_as_stale(tmp_path, monkeypatch):
    sink, committer = started(tmp_path)
    uri = sink.table_uri
    race_before_write(
        monkeypatch, lambda: DeltaTable(uri).alter.add_columns([Field("extra", "string")])
    )
    with pytest.raises(StaleStagingError, match="changed while batch 2"):
        commit(sink, committer, epoch(2), [rows(20, 30)])
    assert ids(uri) == list(range(20))
    assert DeltaTable(uri).transaction_version("app") == 1


def test_a_protocol_upgrade_in_the_window_is_decided_through_delta_rs(tmp_path, monkeypatch):
    """Change data feed raises the writer version: a conflict for the blind append, which
    then commits through delta-rs on the new snapshot (the sink honours that feature)."""
    sink, committer = started(tmp_path)
    uri = sink.table_uri
    upgrade = {"delta.enableChangeDataFeed": "true"}
    race_before_write(monkeypatch, lambda: DeltaTable(uri).alter.set_table_properties(upgrade))
    delta_rs_commits = []
    original = DeltaTable.create_write_transaction
    monkeypatch.setattr(
        DeltaTable,
        "create_write_transaction",
        lambda self, *a, **k: delta_rs_commits.append(1) or original(self, *a, **k),
    )
    commit(sink, committer, epoch(2), [rows(20, 30)])
    assert delta_rs_commits == [1]
    table = DeltaTable(uri)
    assert table.protocol().min_writer_version == 4
    assert table.version() == 3 and table.transaction_version("app") == 2
    assert ids(uri) == list(range(30))


def test_a_second_instance_of_our_app_id_in_the_window_is_a_concurrent_writer(
    tmp_path, monkeypatch
):
    sink, committer = started(tmp_path)
    other_sink = make_sink(tmp_path)
    other = other_sink.create_global_committer()
    theirs = epoch(2, writer="writer-b")
    race_before_write(monkeypatch, lambda: commit(other_sink, other, theirs, [rows(200, 205)]))
    with pytest.raises(ConcurrentWriterError, match="used by two writers"):
        commit(sink, committer, epoch(2), [rows(20, 30)])
    assert ids(sink.table_uri) == [*range(20), *range(200, 205)]
    assert DeltaTable(sink.table_uri).transaction_version("app") == 2
