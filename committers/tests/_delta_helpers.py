"""Shared helpers for Delta sink tests: drive writers and committers without Spark, read back."""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.delta.storage._staging import STAGING_DIR
from framework.sink import Epoch, WriterContext


def epoch(epoch_id: int, app_id: str = "app", writer: str = "writer-a") -> Epoch:
    return Epoch(app_id=app_id, epoch_id=epoch_id, writer_identity=writer, run_id=str(uuid.uuid4()))


def stage(sink: DeltaSink, ep: Epoch, batches, partition_id: int = 0, attempt: int = 0):
    """Run one writer over ``batches`` as task ``partition_id`` and return its committables."""
    ctx = WriterContext(
        epoch=ep, partition_id=partition_id, attempt_number=attempt, task_attempt_id=attempt
    )
    writer = sink.create_writer(ctx)
    for batch in batches:
        writer.write(batch)
    files = writer.prepare_commit(True)
    writer.close()
    return files


def read_rows(table_uri: str, columns=None) -> list[dict]:
    """Every row of the table (read through delta-rs), sorted for exact comparison."""
    table = DeltaTable(str(table_uri)).to_pyarrow_dataset().to_table(columns=columns)
    rows = table.to_pylist()
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in sorted(r)))


def ids(table_uri: str) -> list[int]:
    return sorted(r["id"] for r in read_rows(table_uri, ["id"]))


def assert_no_duplicates(values) -> None:
    dupes = [v for v, n in Counter(values).items() if n > 1]
    assert not dupes, f"duplicated: {dupes[:10]}"


def data_files_on_disk(table_uri: str) -> set[str]:
    """Parquet files under the table root (relative), outside the log and staging."""
    root = Path(table_uri)
    found = set()
    for path in root.rglob("*.parquet"):
        relative = path.relative_to(root).as_posix()
        if not relative.startswith(("_delta_log/", STAGING_DIR + "/")):
            found.add(relative)
    return found


def committed_files(table_uri: str) -> set[str]:
    root = os.path.abspath(table_uri)
    return {os.path.relpath(u.replace("file://", ""), root) for u in DeltaTable(root).file_uris()}


def log_actions(table_uri: str, kind: str, first: int = 0) -> list[dict[str, Any]]:
    """Every ``kind`` action (``"add"``, ``"domainMetadata"``...) of a local table's commits
    from version ``first`` on, oldest first."""
    return [
        action[kind]
        for commit in sorted((Path(table_uri) / "_delta_log").glob("*.json"))
        if int(commit.name[:20]) >= first
        for action in map(json.loads, commit.read_text().splitlines())
        if kind in action
    ]


def files_ever_added(table_uri: str) -> set[str]:
    """Every path an add action of a local table's log has named (as the log spells it)."""
    return {add["path"] for add in log_actions(table_uri, "add")}


def staging_leftovers(table_uri: str) -> list[str]:
    staging = Path(table_uri) / STAGING_DIR
    return [p.as_posix() for p in staging.rglob("*") if p.is_file()] if staging.exists() else []


def assert_no_orphans(table_uri: str) -> None:
    """Every Parquet file on disk is referenced by the table and no manifest is left."""
    assert data_files_on_disk(table_uri) == committed_files(table_uri)
    assert staging_leftovers(table_uri) == []


def batch(ids_, **columns) -> pa.RecordBatch:
    data = {"id": pa.array(ids_, pa.int64()), **columns}
    return pa.RecordBatch.from_pydict(data)


def file_stats(table_uri: str) -> list[dict]:
    """The parsed ``stats`` of every add action in a local table's log, oldest commit first."""
    commits = sorted((Path(table_uri) / "_delta_log").glob("*.json"))
    actions = [json.loads(line) for path in commits for line in path.read_text().splitlines()]
    return [json.loads(a["add"]["stats"]) for a in actions if "add" in a]


def count_table_loads(monkeypatch) -> Counter[str]:
    """Counts, from now on, what loads a delta-rs snapshot: ``is_deltatable`` probes, handles
    opened (``open``) and refreshed (``update_incremental``), in this process."""
    counts: Counter[str] = Counter()
    is_deltatable, init, refresh = (
        DeltaTable.is_deltatable,
        DeltaTable.__init__,
        DeltaTable.update_incremental,
    )

    def probing(*args, **kwargs):  # type: ignore[no-untyped-def]
        counts["is_deltatable"] += 1
        return is_deltatable(*args, **kwargs)

    def opening(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        counts["open"] += 1
        init(self, *args, **kwargs)

    def refreshing(self):  # type: ignore[no-untyped-def]
        counts["update_incremental"] += 1
        return refresh(self)

    monkeypatch.setattr(DeltaTable, "is_deltatable", staticmethod(probing))
    monkeypatch.setattr(DeltaTable, "__init__", opening)
    monkeypatch.setattr(DeltaTable, "update_incremental", refreshing)
    return counts


def interfering(monkeypatch, interfere) -> list[int]:
    """Wrap delta-rs's commit call: ``interfere(n)`` runs before the n-th call (1, 2, ...),
    after the committer read the snapshot it commits on. Returns the calls made (their action
    counts)."""
    original = DeltaTable.create_write_transaction
    calls: list[int] = []

    def wrapped(self, actions, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(actions))
        interfere(len(calls))
        return original(self, actions, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", wrapped)
    return calls


def commit_refused_reader_feature(table_uri: str, version: int) -> None:
    """Commit ``version`` of a local table as a protocol change to reader feature
    ``variantShredding-preview``, which the readers refuse (written by hand: delta-rs cannot
    add it)."""
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["variantShredding-preview"],
        "writerFeatures": ["variantShredding-preview"],
    }
    path = Path(table_uri, "_delta_log", f"{version:020d}.json")
    path.write_text(json.dumps({"protocol": protocol}) + "\n")
