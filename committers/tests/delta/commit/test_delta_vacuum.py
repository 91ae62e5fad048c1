"""VACUUM (``DeltaSink.vacuum``, ``python -m committers.delta vacuum``): files the table
removed longer ago than the retention and files no version references are deleted; live files,
files a version within the retention reads and files a running writer may still commit stay.

Rows are read back with deltalake and DuckDB's delta extension before and after."""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import AddAction, RemoveAction

from committers.delta import DeltaSink
from committers.delta.commit._vacuum import interval_seconds, vacuum_table
from committers.delta.inspect._inspect_cli import main
from committers.delta.storage._staging import STAGING_DIR, write_manifest
from committers.delta.storage._storage import TableLocation
from committers.tests._delta_helpers import committed_files, data_files_on_disk
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import ConfigurationError, DestinationError, NotATableError
from integration_tests._s3server import S3Server

DAY = 86400
ZERO = datetime.timedelta(0)


def _rows(uri: str, version: int | None = None) -> list[dict]:
    table = DeltaTable(uri, version=version).to_pyarrow_table()
    return sorted(table.to_pylist(), key=lambda r: json.dumps(r, sort_keys=True))


def _duckdb(uri: str) -> list[dict]:
    return sorted(duckdb_rows(uri), key=lambda r: json.dumps(r, sort_keys=True))


def _everything_on_disk(uri: str) -> set[str]:
    """Every file under the table root but the log's."""
    root = Path(uri)
    found = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    return {path for path in found if not path.startswith("_delta_log/")}


def _age(path: Path, seconds: float) -> None:
    old = time.time() - seconds
    os.utime(path, (old, old))


# -- after a compaction, through Spark ------------------------------------------------------


@pytest.mark.smoke  # make check: the end-to-end test of its feature
@pytest.mark.spark
@pytest.mark.parametrize(
    ("staging", "column"),
    # Spark's run directories batch-<n>-<run>/day=…; the Python writers' Hive directory _x=…
    [("spark", "day"), ("arrow", "_x")],
)
def test_compaction_then_vacuum_deletes_exactly_the_compacted_away_files(
    spark, tmp_path, staging, column
):
    uri = str(tmp_path / "t")
    sink = DeltaSink(uri, partition_by=[column], staging=staging)
    for start in (0, 10, 20):
        frame = spark.range(start, start + 10, numPartitions=2)
        TwoPhaseSink(sink).write(frame.selectExpr("id", f"cast(id % 2 as string) as `{column}`"))
    before = committed_files(uri)
    rows = _rows(uri)
    assert len(rows) == 30 and len(before) >= 4
    compaction = sink.compact(spark)
    compacted_away = before - committed_files(uri)
    assert len(compacted_away) == compaction.files_removed == len(before)
    on_disk = data_files_on_disk(uri)
    assert compacted_away <= on_disk

    with pytest.raises(ConfigurationError, match=r"shorter than the table's delta\.deletedFile"):
        sink.vacuum(retention=ZERO, dry_run=False)
    assert sink.vacuum() == []  # nothing was removed a week ago
    listed = sink.vacuum(retention=ZERO, unsafe_allow_short_retention=True)  # a dry run
    assert set(listed) == compacted_away
    assert data_files_on_disk(uri) == on_disk

    deleted = sink.vacuum(retention=ZERO, unsafe_allow_short_retention=True, dry_run=False)
    assert set(deleted) == compacted_away
    assert data_files_on_disk(uri) == on_disk - compacted_away == committed_files(uri)
    assert _rows(uri) == rows and _duckdb(uri) == rows
    assert _rows(uri, compaction.version) == rows  # the compacted version still time-travels
    start, end = DeltaTable(uri).history(2)[::-1]
    assert (start["operation"], end["operation"]) == ("VACUUM START", "VACUUM END")
    assert start["operationMetrics"]["numFilesToDelete"] == len(compacted_away)
    assert end["operationMetrics"]["numDeletedFiles"] == len(compacted_away)
    assert start["sink.operation"] == "vacuum" and start["sink.runId"] == end["sink.runId"]
    assert sink.vacuum(retention=ZERO, unsafe_allow_short_retention=True, dry_run=False) == []


# -- retention and what it protects, on a table made by delta-rs ----------------------------


def _table_with_history(tmp_path: Path, retention: str = "interval 1 day") -> dict[str, str]:
    """Versions 0-4: A added; B added; A removed 3 days ago; C added; B removed an hour ago;
    then a checkpoint, which drops A's tombstone (older than the table's retention). Every data
    file was written 3 days ago. Returns the file names by letter."""
    uri = str(tmp_path / "t")
    now_ms = int(time.time() * 1000)
    write_deltalake(
        uri,
        pa.table({"id": [0, 1]}),
        configuration={"delta.deletedFileRetentionDuration": retention},
    )
    write_deltalake(uri, pa.table({"id": [2]}), mode="append")
    a, b = sorted(committed_files(uri), key=lambda p: (tmp_path / "t" / p).stat().st_mtime_ns)
    for path, removed_ms in ((a, now_ms - 3 * DAY * 1000), (b, now_ms - 3600 * 1000)):
        table = DeltaTable(uri)
        size = (tmp_path / "t" / path).stat().st_size
        table.create_write_transaction(
            [RemoveAction(path, True, removed_ms, size)], mode="append", schema=table.schema()
        )
        if path == a:
            write_deltalake(uri, pa.table({"id": [3]}), mode="append")
    (c,) = committed_files(uri)
    DeltaTable(uri).create_checkpoint()
    for name in (a, b, c):
        _age(tmp_path / "t" / name, 3 * DAY)
    return {"uri": uri, "A": a, "B": b, "C": c}


def test_retention_keeps_what_versions_within_it_read_and_deletes_what_delta_rs_misses(tmp_path):
    """A was removed 3 days ago, B an hour ago, the table keeps removed files a day: A goes (a
    checkpoint already dropped its tombstone, so delta-rs's own vacuum no longer finds it), B
    stays (version 3 reads it). An old unreferenced file and an old staging manifest go; a
    young unreferenced file, and an old file a young manifest names, stay."""
    files = _table_with_history(tmp_path)
    uri, root = files["uri"], tmp_path / "t"
    (root / "crashed.parquet").write_bytes(b"left by a crashed writer")
    _age(root / "crashed.parquet", 3 * DAY)
    (root / "young.parquet").write_bytes(b"being written")
    (root / "claimed.parquet").write_bytes(b"staged, not committed yet")
    _age(root / "claimed.parquet", 3 * DAY)
    location = TableLocation.of(uri)
    write_manifest(location, f"{STAGING_DIR}/app/w/0/live-00000-0.json", ["claimed.parquet"])
    old_manifest = f"{STAGING_DIR}/app/w/0/dead-00000-0.json"
    write_manifest(location, old_manifest, [])
    _age(root / old_manifest, 3 * DAY)
    assert DeltaTable(uri).vacuum(retention_hours=24, dry_run=True) == []
    rows = {version: _rows(uri, version) for version in (3, 4)}
    before = _everything_on_disk(uri)

    dry = vacuum_table(location)  # the table's retention: a day
    assert (dry.dry_run, dry.retention_seconds, dry.table_retention_seconds) == (True, DAY, DAY)
    expected = {files["A"]: "removed", "crashed.parquet": "unreferenced", old_manifest: "staging"}
    assert {f.path: f.kind for f in dry.files} == expected
    assert _everything_on_disk(uri) == before

    done = vacuum_table(location, dry_run=False)
    assert {f.path for f in done.files} == set(expected)
    assert _everything_on_disk(uri) == before - set(expected)
    assert done.log_versions == []  # no file left that delta-rs's vacuum could record
    assert {version: _rows(uri, version) for version in (3, 4)} == rows
    assert _duckdb(uri) == rows[4] == [{"id": 3}]


def test_partition_directories_named_with_an_underscore_are_cleaned_too(tmp_path, capsys):
    """``_x=a/`` is the table's partition directory for a column ``_x``, not a hidden one: an
    orphan there is found by inspect and deleted by remove_orphan_files; other ``_``
    directories stay untouched."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [1], "_x": ["a"]}), partition_by=["_x"])
    root = Path(uri)
    for orphan in ("_x=a/crashed.parquet", "_other/kept.parquet"):
        (root / orphan).parent.mkdir(exist_ok=True)
        (root / orphan).write_bytes(b"left by a crashed writer")
        _age(root / orphan, 3 * DAY)
    assert main(["inspect", uri, "--json"]) == 0
    leftovers = json.loads(capsys.readouterr().out)["staged_leftovers"]["entries"]
    assert [(e["path"], e["kind"]) for e in leftovers] == [("_x=a/crashed.parquet", "unreferenced")]
    sink = DeltaSink(uri)
    assert sink.remove_orphan_files(retention=datetime.timedelta(days=1)) == [
        "_x=a/crashed.parquet"
    ]
    assert (root / "_other/kept.parquet").exists()
    assert _rows(uri) == _duckdb(uri) == [{"id": 1, "_x": "a"}]


def test_short_retentions_are_refused_unless_forced(tmp_path):
    files = _table_with_history(tmp_path)
    location = TableLocation.of(files["uri"])
    before = _everything_on_disk(files["uri"])
    with pytest.raises(ConfigurationError, match=r"retention of 12 hours is shorter than the tab"):
        vacuum_table(location, retention_seconds=12 * 3600, dry_run=False)
    with pytest.raises(ConfigurationError, match="must be a duration >= 0"):
        vacuum_table(location, retention_seconds=-1, unsafe_allow_short_retention=True)
    assert _everything_on_disk(files["uri"]) == before
    forced = vacuum_table(location, retention_seconds=0, unsafe_allow_short_retention=True)
    assert {f.path for f in forced.files} == {files["A"], files["B"]}

    quick = _table_with_history(tmp_path / "quick", retention="interval 10 minutes")
    with pytest.raises(ConfigurationError, match="shorter than one hour: files a running writer"):
        vacuum_table(TableLocation.of(quick["uri"]), dry_run=False)


def test_tables_vacuum_cannot_clean_are_refused(tmp_path):
    with pytest.raises(NotATableError, match="is not a Delta table: nothing exists"):
        DeltaSink(str(tmp_path / "missing")).vacuum()
    uri = str(tmp_path / "odd")
    write_deltalake(
        uri, pa.table({"id": [1]}), configuration={"delta.deletedFileRetentionDuration": "ever"}
    )
    with pytest.raises(DestinationError, match="'ever', which is not an interval"):
        DeltaSink(uri).vacuum()
    v2 = tmp_path / "v2"
    write_deltalake(str(v2), pa.table({"id": [1]}))
    features = ["v2Checkpoint"]
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7}
    protocol |= {"readerFeatures": features, "writerFeatures": features}
    (v2 / "_delta_log" / f"{1:020d}.json").write_text(json.dumps({"protocol": protocol}) + "\n")
    with pytest.raises(DestinationError, match="uses v2Checkpoint; vacuum does not read"):
        DeltaSink(str(v2)).vacuum(dry_run=False)
    assert len(committed_files(str(v2))) == 1


def test_delta_intervals_are_read_as_delta_spells_them():
    assert interval_seconds("interval 7 days") == 7 * DAY
    assert interval_seconds("interval 1 week") == 7 * DAY
    assert interval_seconds("INTERVAL 1 hour 30 minutes") == 5400
    assert interval_seconds("2 seconds") == 2
    for bad in ("", "interval", "interval 7", "interval 7 fortnights", "forever"):
        with pytest.raises(ValueError, match="not an interval"):
            interval_seconds(bad)


# -- the command line -----------------------------------------------------------------------


def test_the_vacuum_command_is_a_dry_run_unless_told_and_differs_from_remove_orphans(
    tmp_path, capsys
):
    files = _table_with_history(tmp_path)
    uri = files["uri"]
    before = _everything_on_disk(uri)

    assert main(["remove-orphans", uri, "--retention", "1h", "--yes"]) == 0
    assert "Deleted 0 files" in capsys.readouterr().out  # the log still names A and B

    assert main(["vacuum", uri, "--retention", "0s"]) == 2
    error = capsys.readouterr().err
    assert "shorter than the table's delta.deletedFileRetentionDuration (1 day)" in error
    assert error.rstrip().endswith("(on the command line: --unsafe-allow-short-retention)")

    assert main(["vacuum", uri]) == 0
    text = capsys.readouterr().out
    assert text.startswith("DRY RUN, nothing deleted. Would delete 1 file (")
    assert f"removed       {files['A']}" in text
    assert text.endswith("Run again with --yes to delete them.\n")
    assert _everything_on_disk(uri) == before

    assert main(["vacuum", uri, "--retention", "0", "--unsafe-allow-short-retention"]) == 0
    assert "Would delete 2 files" in capsys.readouterr().out
    args = ["vacuum", uri, "--retention", "0s", "--unsafe-allow-short-retention", "--yes"]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["dry_run"], report["retention_seconds"], report["count"]) == (False, 0, 2)
    assert {f["path"]: f["kind"] for f in report["files"]} == {
        files["A"]: "removed",
        files["B"]: "removed",
    }
    assert len(report["log_versions"]) == 2  # B's tombstone: delta-rs deleted it and logged it
    assert _everything_on_disk(uri) == before - {files["A"], files["B"]}
    assert _rows(uri) == _duckdb(uri) == [{"id": 3}]


# -- on S3 ----------------------------------------------------------------------------------


def _two_appends(uri: str, options: dict[str, str]) -> None:
    for ids in ([0, 1], [2]):
        write_deltalake(uri, pa.table({"id": ids}), mode="append", storage_options=options)


def _remove_the_first_file(uri: str, options: dict[str, str]) -> dict:
    """Commit a remove (now) of the file with ids 0 and 1; returns its add action."""
    table = DeltaTable(uri, storage_options=options)
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    first = next(action for action in actions if action["num_records"] == 2)
    table.create_write_transaction(
        [RemoveAction(first["path"], True, int(time.time() * 1000), first["size_bytes"])],
        mode="append",
        schema=table.schema(),
    )
    return first


def test_vacuum_on_s3_deletes_the_removed_file_and_records_it(s3: S3Server, bucket: str):
    uri = f"s3://{bucket}/vacuum-{time.time_ns()}"
    options = s3.storage_options()
    _two_appends(uri, options)
    first = _remove_the_first_file(uri, options)
    sink = DeltaSink(uri, storage_options=options)
    assert sink.vacuum() == []  # removed just now: the table keeps it a week
    forced = {"retention": ZERO, "unsafe_allow_short_retention": True}
    assert sink.vacuum(**forced) == [first["path"]]
    assert sink.vacuum(**forced, dry_run=False) == [first["path"]]
    assert sink.vacuum(**forced, dry_run=False) == []  # the file is gone
    location = TableLocation.of(uri, options)
    fs = location.filesystem()
    fs.invalidate_cache()
    assert not fs.exists(location.path(first["path"]))
    history = DeltaTable(uri, storage_options=options).history(2)
    assert [h["operation"] for h in history] == ["VACUUM END", "VACUUM START"]
    assert DeltaTable(uri, storage_options=options).to_pyarrow_table().to_pylist() == [{"id": 2}]


def test_a_removal_made_after_an_earlier_vacuum_in_the_process_is_seen(s3: S3Server, bucket: str):
    """s3fs keeps directory listings per process: the log must be listed afresh, or a file
    removed after the first listing would look unreferenced and be deleted within the
    retention."""
    uri = f"s3://{bucket}/vacuum-cache-{time.time_ns()}"
    options = s3.storage_options()
    _two_appends(uri, options)
    sink = DeltaSink(uri, storage_options=options)
    time.sleep(3)  # the files are now older than a two-second retention
    short = {"retention": datetime.timedelta(seconds=2), "unsafe_allow_short_retention": True}
    assert sink.vacuum(**short) == []  # lists the log once
    _remove_the_first_file(uri, options)
    assert sink.vacuum(**short, dry_run=False) == []  # removed just now: within the retention
    assert DeltaTable(uri, storage_options=options, version=1).to_pyarrow_table().num_rows == 3


def test_remove_orphans_sees_a_commit_made_after_its_earlier_listing(s3: S3Server, bucket: str):
    """The same fresh listing of the log protects remove_orphan_files: a file committed after
    an earlier call in the process is referenced, not an orphan."""
    uri = f"s3://{bucket}/orphans-cache-{time.time_ns()}"
    options = s3.storage_options()
    write_deltalake(uri, pa.table({"id": [0]}), storage_options=options)
    location = TableLocation.of(uri, options)
    fs = location.filesystem()
    staged = "part-late.parquet"  # a file staged by a writer that commits it later
    with fs.open(location.path(staged), "wb") as out:
        pq.write_table(pa.table({"id": [1]}), out)
    time.sleep(3)
    sink = DeltaSink(uri, storage_options=options)
    short = {"retention": datetime.timedelta(seconds=2), "unsafe_allow_short_retention": True}
    assert sink.remove_orphan_files(**short, dry_run=True) == [staged]  # lists the log once
    table = DeltaTable(uri, storage_options=options)
    size = fs.size(location.path(staged))
    table.create_write_transaction(
        [AddAction(staged, size, {}, int(time.time() * 1000), True, '{"numRecords": 1}')],
        mode="append",
        schema=table.schema(),
    )
    assert sink.remove_orphan_files(**short) == []
    ids = DeltaTable(uri, storage_options=options).to_pyarrow_table()["id"].to_pylist()
    assert sorted(ids) == [0, 1]
