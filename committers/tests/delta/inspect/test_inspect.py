"""``python -m committers.delta inspect`` and ``remove-orphans`` on real tables: written by the
sink (driven without Spark, and once through Spark), by delta-rs alone, with column mapping,
with a crashed run's leftovers, and on the S3 server with settings from the environment."""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from committers.delta import DeltaSink
from committers.delta.inspect._inspect import gather
from committers.delta.inspect._inspect_cli import main
from committers.delta.inspect._inspect_render import render_text
from committers.delta.spark._spark_staging import RUN_DIR_PREFIX, spark_manifest_path
from committers.delta.storage._staging import STAGING_DIR, write_manifest
from committers.delta.storage._storage import TableLocation
from committers.delta.table._snapshot import SnapshotSpec, open_snapshot
from committers.tests._delta_helpers import batch, epoch, ids, stage
from integration_tests._s3server import S3Server

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False)])
REPO = Path(__file__).resolve().parents[4]
DAY = 86400


# -- building tables --------------------------------------------------------------------------


def commit(table_uri: str, app_id: str, writer: str, epoch_id: int, rows: range, **options):
    """One batch committed by the sink's own writer and global committer."""
    sink = DeltaSink(table_uri, app_id=app_id, **options)
    sink.prepare(SCHEMA)
    committer = sink.create_global_committer()
    ep = epoch(epoch_id, app_id=app_id, writer=writer)
    committer.commit([committer.combine(ep, stage(sink, ep, [batch(list(rows))]))])
    committer.clean_up(ep)


def two_app_table(root: Path) -> str:
    """A sink table written by two app ids: orders-ingest batches 0-2, backfill batch 7."""
    uri = str(root / "orders")
    for epoch_id in range(3):
        commit(uri, "orders-ingest", "query-1", epoch_id, range(epoch_id * 10, epoch_id * 10 + 10))
    commit(uri, "backfill", "job-7", 7, range(100, 105))
    return uri


def crash_before_commit(table_uri: str, app_id: str, writer: str, epoch_id: int) -> list[str]:
    """Stage a batch the way a run that dies before its commit leaves it: a manifest and the
    files it names, no commit. Returns the staged paths (relative)."""
    sink = DeltaSink(table_uri, app_id=app_id)
    sink.prepare(SCHEMA)
    return [f.path for f in stage(sink, epoch(epoch_id, app_id, writer), [batch([900, 901])])]


def age(path: Path, at: float) -> None:
    os.utime(path, (at, at))


def iso_ms(milliseconds: int) -> str:
    moment = datetime.datetime.fromtimestamp(milliseconds / 1000, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def added_files(table_uri: str) -> dict[str, tuple[int, int]]:
    """Path -> (size, rows) of the files of the current version, read through delta-rs."""
    actions = pa.table(DeltaTable(table_uri).get_add_actions(flatten=True)).to_pylist()
    return {a["path"]: (a["size_bytes"], a["num_records"]) for a in actions}


def files_on_disk(root: str) -> set[str]:
    return {p.relative_to(root).as_posix() for p in Path(root).rglob("*") if p.is_file()}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "committers.delta", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


def cli_json(capsys, *args: str) -> dict:
    assert main([*args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# -- inspect ----------------------------------------------------------------------------------


def test_json_names_each_app_id_with_its_last_batch_writer_and_commit(tmp_path, capsys):
    uri = two_app_table(tmp_path)
    report = cli_json(capsys, "inspect", uri)
    history = {h["version"]: h for h in DeltaTable(uri).history()}

    assert report["report_version"] == 2
    assert report["table"]["uri"] == uri and report["table"]["version"] == 3
    apps = {a["app_id"]: a for a in report["apps"]["entries"]}
    assert list(apps) == ["backfill", "orders-ingest"]
    assert apps["orders-ingest"]["last_batch"] == 2
    assert apps["backfill"]["last_batch"] == 7
    ingest, backfill = apps["orders-ingest"]["last_commit"], apps["backfill"]["last_commit"]
    assert (ingest["version"], ingest["batch"], ingest["writer_identity"]) == (2, 2, "query-1")
    assert (backfill["version"], backfill["batch"], backfill["writer_identity"]) == (3, 7, "job-7")
    assert ingest["commit_info_time"] == iso_ms(history[2]["timestamp"])
    assert backfill["commit_info_time"] == iso_ms(history[3]["timestamp"])
    assert ingest["time"] == _commit_file_time(uri, 2)
    assert backfill["time"] == _commit_file_time(uri, 3)
    assert ingest["run_id"] == history[2]["sink.runId"]
    assert report["apps"]["history_searched"] == 4

    commits = report["commits"]
    assert [c["version"] for c in commits] == [3, 2, 1, 0]
    assert [(c["app_id"], c["batch"]) for c in commits] == [
        ("backfill", 7),
        ("orders-ingest", 2),
        ("orders-ingest", 1),
        ("orders-ingest", 0),
    ]
    assert [(c["files_added"], c["rows_added"]) for c in commits] == [(1, 5), (1, 10)] + [
        (1, 10)
    ] * 2
    files = added_files(uri)
    assert sum(c["bytes_added"] for c in commits) == sum(size for size, _ in files.values())
    assert report["files"] == {
        "count": 4,
        "bytes": sum(size for size, _ in files.values()),
        "rows": 35,
        "small_file_threshold_bytes": 32 * 1024 * 1024,
        "small_files": 4,
        "small_file_ratio": 1.0,
        "deletion_vectors": 0,
        "deleted_rows": 0,
    }
    assert report["staged_leftovers"] == {
        "count": 0,
        "bytes": 0,
        "oldest_age_seconds": None,
        "entries": [],
    }
    assert report["settings"]["checkpoint_interval"] == 10  # the sink's default for new tables


def test_text_from_a_subprocess_shows_app_ids_last_batches_and_commits(tmp_path):
    uri = two_app_table(tmp_path)
    result = run_cli("inspect", uri, "--commits", "2")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    text = result.stdout
    when = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}Z"
    assert re.search(rf"^  backfill +7 +job-7 +{when} +3$", text, re.M), text
    assert re.search(rf"^  orders-ingest +2 +query-1 +{when} +2$", text, re.M), text
    assert "Recent commits (2 of 4, newest first)" in text
    size_3, size_2 = (added_files(uri)[p][0] for p in _paths_added_by(uri, (3, 2)))
    assert re.search(rf"^ +3 +{when} +WRITE +backfill/7 +5 +1 +{size_3} B$", text, re.M), text
    assert re.search(rf"^ +2 +{when} +WRITE +orders-ingest/2 +10 +1 +{size_2} B$", text, re.M)
    assert "Staged leftovers: none" in text
    assert "Files: 4 files" in text and ", 35 rows" in text
    assert "small files (< 32.0 MiB): 4 (100.0%)" in text
    assert "  delta.checkpointInterval               10" in text


def _commit_file_time(uri: str, version: int) -> str:
    """The modification time of a commit's file, to the millisecond (as time travel reads it)."""
    seconds = Path(uri, "_delta_log", f"{version:020d}.json").stat().st_mtime
    return iso_ms(round(seconds * 1_000_000) // 1000)


def test_the_commit_times_shown_are_the_ones_time_travel_reads_back(tmp_path, capsys):
    """A commit's file is written after its commitInfo time (here: seconds later, at a
    sub-millisecond instant); the time shown, pasted into timestampAsOf, reads that version."""
    uri = two_app_table(tmp_path)
    base = int(time.time()) - 600
    for version in range(4):
        log = Path(uri, "_delta_log", f"{version:020d}.json")
        actions = [json.loads(line) for line in log.read_text().splitlines()]
        for action in actions:
            if "commitInfo" in action:
                action["commitInfo"]["timestamp"] = int((base + 10 * version) * 1000)
        log.write_text("".join(json.dumps(a) + "\n" for a in actions))
        written = base + 10 * version + 2.0008  # 0.8 ms past a whole millisecond
        os.utime(log, (written, written))

    def version_at(shown: str) -> int:
        return open_snapshot(TableLocation.of(uri), SnapshotSpec.of(None, shown))[1].version

    report = cli_json(capsys, "inspect", uri)
    assert [(c["version"], version_at(c["time"])) for c in report["commits"]] == [
        (v, v) for v in (3, 2, 1, 0)
    ]
    assert [c["commit_info_time"] for c in report["commits"]] == [
        iso_ms(int((base + 10 * v) * 1000)) for v in (3, 2, 1, 0)
    ]
    for app in report["apps"]["entries"]:
        assert version_at(app["last_commit"]["time"]) == app["last_commit"]["version"]
    text = render_text(gather(TableLocation.of(uri)))
    shown = re.findall(r"^ +(\d) +(\S+ \S+) +[A-Z]", text, re.M)
    assert [(int(v), version_at(t)) for v, t in shown] == [(v, v) for v in (3, 2, 1, 0)]


def _paths_added_by(uri: str, versions) -> list[str]:
    paths = []
    for version in versions:
        log = Path(uri) / "_delta_log" / f"{version:020d}.json"
        (add,) = [
            json.loads(line)["add"] for line in log.read_text().splitlines() if '"add"' in line
        ]
        paths.append(add["path"])
    return paths


def test_app_commits_are_searched_only_as_deep_as_asked(tmp_path):
    uri = two_app_table(tmp_path)
    report = gather(TableLocation.of(uri), recent_commits=1, app_history=1)
    apps = {a.app_id: a for a in report.apps.entries}
    assert report.apps.history_searched == 1
    assert apps["backfill"].last_commit is not None and apps["backfill"].last_commit.version == 3
    # older than the history searched: the txn still gives its last batch
    assert (apps["orders-ingest"].last_batch, apps["orders-ingest"].last_commit) == (2, None)
    assert [c.version for c in report.commits] == [3]


def test_leftovers_of_a_crashed_run_are_listed_with_their_age(tmp_path):
    uri = two_app_table(tmp_path)
    staged = crash_before_commit(uri, "orders-ingest", "query 1/b", 3)
    spark_run = epoch(4, app_id="orders-ingest", writer="query-1")
    run_directory = f"{RUN_DIR_PREFIX}4-{spark_run.run_id}"
    location = TableLocation.of(uri)
    write_manifest(location, spark_manifest_path(spark_run), [], directories=[run_directory])
    (Path(uri) / run_directory).mkdir()
    pq.write_table(pa.table({"id": [1]}), Path(uri) / run_directory / "part-0.parquet")
    (Path(uri) / run_directory / ".part-0.parquet.crc").write_bytes(b"crc")
    stray = Path(uri) / "copied-by-hand.parquet"
    pq.write_table(pa.table({"id": [1]}), stray)

    now = time.time()
    crashed_at = now - 2 * DAY - 3600
    for path in Path(uri).rglob("*"):
        if path.is_file() and "_delta_log" not in path.parts:
            age(path, crashed_at if "query%201%2Fb" in path.as_posix() else now - 60)
    for relative in staged:
        age(Path(uri) / relative, crashed_at)

    report = gather(location, now=now)
    (crashed_manifest,) = [
        p.relative_to(uri).as_posix()
        for p in (Path(uri) / STAGING_DIR).rglob("*.json")
        if "query%201%2Fb" in p.as_posix()
    ]
    crashed = ("orders-ingest", "query 1/b", 3)
    spark = ("orders-ingest", "query-1", 4)
    two_days = 2 * DAY + 3600.0
    assert [
        (e.age_seconds, e.kind, e.path, (e.app_id, e.writer_identity, e.batch))
        for e in report.staged_leftovers.entries
    ] == [  # oldest first, then by path
        (two_days, "manifest", crashed_manifest, crashed),
        *[(two_days, "staged", path, crashed) for path in sorted(staged)],
        (60.0, "manifest", spark_manifest_path(spark_run), spark),
        (60.0, "staged", f"{run_directory}/.part-0.parquet.crc", spark),
        (60.0, "staged", f"{run_directory}/part-0.parquet", spark),
        (60.0, "unreferenced", "copied-by-hand.parquet", (None, None, None)),
    ]
    sizes = {e.path: e.bytes for e in report.staged_leftovers.entries}
    assert sizes == {p: (Path(uri) / p).stat().st_size for p in sizes}
    assert report.staged_leftovers.count == len(staged) + 5
    assert report.staged_leftovers.bytes == sum(sizes.values())
    assert report.staged_leftovers.oldest_age_seconds == two_days

    text = render_text(report)
    assert f"Staged leftovers: {len(staged) + 5} files" in text
    assert "oldest 2d 1h old" in text
    manifest_line = (
        rf"^  2d 1h +\d+ B +manifest +orders-ingest/query 1/b/3 +{re.escape(crashed_manifest)}$"
    )
    assert re.search(manifest_line, text, re.M), text
    assert re.search(r"^  1m +\d+ B +unreferenced +- +copied-by-hand.parquet$", text, re.M)


def test_plain_delta_rs_table_without_sink_metadata(tmp_path, capsys):
    uri = str(tmp_path / "plain")
    data = pa.table({"id": [1, 2, 3]})
    write_deltalake(
        uri, data, commit_properties=CommitProperties(app_transactions=[Transaction("etl", 12)])
    )
    DeltaTable(uri).create_checkpoint()  # the txn of version 0 is then read from the checkpoint
    write_deltalake(uri, data, mode="append")
    write_deltalake(
        uri,
        data.slice(0, 2),
        mode="overwrite",
        commit_properties=CommitProperties(app_transactions=[Transaction("other-tool", 3)]),
    )
    report = cli_json(capsys, "inspect", uri)

    assert report["apps"]["entries"] == [
        {"app_id": "etl", "last_batch": 12, "txn_last_updated": None, "last_commit": None},
        {"app_id": "other-tool", "last_batch": 3, "txn_last_updated": None, "last_commit": None},
    ]
    assert [
        (c["version"], c["operation"], c["app_id"], c["files_added"], c["rows_added"])
        for c in report["commits"]
    ] == [(2, "WRITE", None, 1, 2), (1, "WRITE", None, 1, 3), (0, "WRITE", None, 1, 3)]
    assert {c["metrics_source"] for c in report["commits"]} == {"log"}  # delta-rs's own names
    (current,) = added_files(uri).values()
    assert report["commits"][0]["bytes_added"] == current[0]
    # the two files the overwrite removed are still referenced (tombstones): no leftovers
    assert len([p for p in files_on_disk(uri) if p.startswith("part-")]) == 3
    assert report["staged_leftovers"]["count"] == 0
    assert report["files"]["count"] == 1 and report["files"]["rows"] == 2
    assert report["protocol"] == {
        "min_reader_version": 1,
        "min_writer_version": 2,
        "reader_features": [],
        "writer_features": [],
        "effective_reader_features": [],
        "effective_writer_features": ["appendOnly", "invariants"],
        "unsupported_by_sink": [],
    }
    assert report["settings"] == {
        "column_mapping_mode": "none",
        "deletion_vectors": False,
        "checkpoint_interval": None,
        "set_transaction_retention_duration": None,
        "log_retention_duration": None,
        "deleted_file_retention_duration": None,
        "append_only": False,
        "change_data_feed": False,
    }
    assert report["configuration"] == {}


def test_delta_spark_style_metrics_are_read_from_commit_info(tmp_path, capsys):
    """A commit as delta-spark writes it (string metrics) is counted from its metrics."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [1, 2, 3]}))
    (path, (size, _)) = next(iter(added_files(uri).items()))
    shutil.copy(Path(uri) / path, Path(uri) / "copy.parquet")
    commit_info = {
        "timestamp": 1795000000000,
        "operation": "STREAMING UPDATE",
        "operationMetrics": {
            "numOutputRows": "3",
            "numOutputBytes": str(size),
            "numAddedFiles": "1",
        },
    }
    add = {
        "path": "copy.parquet",
        "partitionValues": {},
        "size": size,
        "dataChange": True,
        "modificationTime": 1795000000000,
    }  # no stats: the log alone could not count rows
    log = Path(uri) / "_delta_log" / f"{1:020d}.json"
    log.write_text(json.dumps({"commitInfo": commit_info}) + "\n" + json.dumps({"add": add}) + "\n")

    newest = cli_json(capsys, "inspect", uri)["commits"][0]
    assert newest == {
        "version": 1,
        "time": _commit_file_time(uri, 1),
        "commit_info_time": "2026-11-18T11:06:40.000Z",
        "operation": "STREAMING UPDATE",
        "app_id": None,
        "batch": None,
        "files_added": 1,
        "rows_added": 3,
        "bytes_added": size,
        "metrics_source": "operationMetrics",
    }
    files = cli_json(capsys, "inspect", uri)["files"]
    assert (files["count"], files["rows"]) == (2, None)  # one file has no record count


def test_column_mapped_and_deletion_vector_tables_show_their_features(tmp_path, capsys):
    mapped = str(tmp_path / "mapped")
    DeltaTable.create(
        mapped,
        pa.schema([("id", pa.int64()), ("name", pa.string())]),
        configuration={"delta.columnMapping.mode": "name"},
    )
    report = cli_json(capsys, "inspect", mapped)
    assert report["protocol"] == {
        "min_reader_version": 2,
        "min_writer_version": 5,
        "reader_features": [],
        "writer_features": [],
        "effective_reader_features": ["columnMapping"],
        "effective_writer_features": [
            "appendOnly",
            "changeDataFeed",
            "checkConstraints",
            "columnMapping",
            "generatedColumns",
            "invariants",
        ],
        "unsupported_by_sink": [],
    }
    assert report["settings"]["column_mapping_mode"] == "name"
    assert report["configuration"] == {
        "delta.columnMapping.maxColumnId": "2",
        "delta.columnMapping.mode": "name",
    }
    assert main(["inspect", mapped]) == 0
    text = capsys.readouterr().out
    assert "Protocol: reader version 2, writer version 5" in text
    assert "  reader features: columnMapping (implied by the legacy version)" in text
    assert "  delta.columnMapping.mode               name" in text
    assert "  delta.columnMapping.maxColumnId        2" in text
    assert "the sink can append: yes" in text

    vectors = str(tmp_path / "vectors")
    DeltaTable.create(
        vectors,
        pa.schema([("id", pa.int64())]),
        configuration={"delta.enableDeletionVectors": "true"},
    )
    protocol = cli_json(capsys, "inspect", vectors)["protocol"]
    assert (protocol["min_reader_version"], protocol["min_writer_version"]) == (3, 7)
    assert "deletionVectors" in protocol["reader_features"]
    assert protocol["effective_writer_features"] == protocol["writer_features"]
    assert "deletionVectors" in protocol["writer_features"]


def test_small_file_ratio_follows_the_threshold(tmp_path, capsys):
    uri = str(tmp_path / "t")
    commit(uri, "a", "w", 0, range(10))
    commit(uri, "a", "w", 1, range(10, 20_010))
    sizes = sorted(size for size, _ in added_files(uri).values())
    threshold = sizes[0] + 1
    files = cli_json(capsys, "inspect", uri, "--small-file-size", f"{threshold}")["files"]
    assert (files["small_file_threshold_bytes"], files["small_files"]) == (threshold, 1)
    assert files["small_file_ratio"] == 0.5
    files = cli_json(capsys, "inspect", uri, "--small-file-size", "1KiB")["files"]
    assert files["small_file_threshold_bytes"] == 1024
    assert files["small_files"] == sum(1 for s in sizes if s < 1024)


# -- errors -----------------------------------------------------------------------------------


def test_not_a_table_exits_1_with_one_line(tmp_path):
    (tmp_path / "data.csv").write_text("id\n1\n")
    result = run_cli("inspect", str(tmp_path))
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == (
        f"python -m committers.delta: error: {tmp_path} is not a Delta table: "
        "no _delta_log found there\n"
    )
    missing = tmp_path / "missing"
    result = run_cli("remove-orphans", str(missing))
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        f"python -m committers.delta: error: {missing} is not a Delta table: "
        "nothing exists at this path\n"
    )


def test_unreachable_storage_from_the_environment_exits_1(monkeypatch, capsys):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: refused
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "inspect-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "inspect-test-secret")
    assert main(["inspect", "s3://no-bucket/t"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(
        "python -m committers.delta: error: cannot read s3://no-bucket/t:"
    )
    assert captured.err.count("\n") == 1 and "inspect-test-secret" not in captured.err


@pytest.mark.parametrize(
    "args",
    [
        ["inspect"],
        ["inspect", "t", "--commits", "-1"],
        ["inspect", "t", "--small-file-size", "32 parsecs"],
        ["remove-orphans", "t", "--retention", "soon"],
        ["compact", "t"],
    ],
)
def test_usage_errors_exit_2(args, capsys):
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    assert "usage: python -m committers.delta" in capsys.readouterr().err


def test_a_retention_below_an_hour_is_refused_with_the_flag_to_allow_it(tmp_path, capsys):
    uri = two_app_table(tmp_path)
    assert main(["remove-orphans", uri, "--retention", "30m"]) == 2
    err = capsys.readouterr().err
    assert "retention of 1800s is shorter than 3600s" in err
    assert err.endswith("(on the command line: --unsafe-allow-short-retention)\n")


# -- remove-orphans ---------------------------------------------------------------------------


def test_remove_orphans_is_a_dry_run_until_yes_then_deletes_exactly_those(tmp_path, capsys):
    uri = two_app_table(tmp_path)
    old_files = crash_before_commit(uri, "orders-ingest", "crashed", 3)
    young_files = crash_before_commit(uri, "orders-ingest", "running", 4)
    three_days_ago = time.time() - 3 * DAY
    for path in Path(uri).rglob("*"):
        if path.is_file() and ("crashed" in path.as_posix() or path.name in old_files):
            age(path, three_days_ago)
    before = files_on_disk(uri)
    (old_manifest,) = [p for p in before if "/crashed/" in p]
    expected = sorted([old_manifest, *old_files])
    expected_bytes = sum((Path(uri) / p).stat().st_size for p in expected)

    dry = cli_json(capsys, "remove-orphans", uri, "--retention", "2d")
    assert dry == {
        "table": uri,
        "dry_run": True,
        "retention_seconds": 2 * DAY,
        "count": len(expected),
        "bytes": expected_bytes,
        "files": [{"path": p, "bytes": (Path(uri) / p).stat().st_size} for p in expected],
    }
    assert files_on_disk(uri) == before
    assert main(["remove-orphans", uri, "--retention", "2d"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"DRY RUN, nothing deleted. Would delete {len(expected)} files (")
    assert text.endswith("Run again with --yes to delete them.\n")
    assert files_on_disk(uri) == before

    assert main(["remove-orphans", uri, "--retention", "2d", "--yes"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == (
        f"Deleted {len(expected)} files ({expected_bytes} B) from {uri}."
    )
    assert files_on_disk(uri) == before - set(expected)
    assert set(young_files) <= files_on_disk(uri)  # its writer may still commit them
    assert ids(uri) == list(range(30)) + list(range(100, 105))
    again = cli_json(capsys, "remove-orphans", uri, "--retention", "2d", "--no-dry-run")
    assert (again["count"], again["files"]) == (0, [])


# -- through Spark, and on S3 -----------------------------------------------------------------


@pytest.mark.spark
def test_tables_written_through_spark_show_the_bounded_app_ids(spark, tmp_path, capsys):
    """Writes with an app id are listed under it; writes without one (TwoPhaseSink or the
    format) record no txn and no app id: they appear as commits only."""
    from committers.delta import register
    from framework import TwoPhaseSink

    register(spark)
    uri = str(tmp_path / "t")
    df = spark.range(4).selectExpr("id")
    TwoPhaseSink(DeltaSink(uri, app_id="nightly")).write(df, epoch_id=4)
    TwoPhaseSink(DeltaSink(uri, app_id="hourly")).write(df)
    TwoPhaseSink(DeltaSink(uri)).write(df)
    df.write.format("deltalake").mode("append").save(uri)
    report = cli_json(capsys, "inspect", uri)
    history = {h["version"]: h for h in DeltaTable(uri).history()}
    entries = [
        (
            a["app_id"],
            a["last_batch"],
            a["last_commit"]["version"],
            a["last_commit"]["writer_identity"],
        )
        for a in report["apps"]["entries"]
    ]
    assert entries == [  # a bounded write's app id is the sink's with a ":write" suffix
        ("hourly:write", 0, 1, history[1]["sink.writerIdentity"]),
        ("nightly:write", 4, 0, history[0]["sink.writerIdentity"]),
    ]
    assert [
        (c["version"], c["app_id"], c["batch"], c["rows_added"]) for c in report["commits"]
    ] == [
        (3, None, None, 4),
        (2, None, None, 4),
        (1, "hourly:write", 0, 4),
        (0, "nightly:write", 4, 4),
    ]
    assert report["staged_leftovers"]["count"] == 0
    assert main(["inspect", uri]) == 0
    text = capsys.readouterr().out
    assert "App ids (2;" in text
    assert re.search(r"\n +3 +\S+ \S+Z +WRITE +- +4 +2 ", text), text


def test_s3_table_is_reached_with_settings_from_the_environment(s3: S3Server, bucket: str):
    uri = f"s3://{bucket}/inspect-{time.time_ns()}"
    options = s3.storage_options()
    commit(uri, "s3-app", "s3-writer", 5, range(3), storage_options=options)
    sink = DeltaSink(uri, app_id="s3-app", storage_options=options)
    sink.prepare(SCHEMA)
    (staged,) = [f.path for f in stage(sink, epoch(6, "s3-app", "s3-writer"), [batch([7])])]

    result = run_cli("inspect", uri, "--json", env=options)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    (app,) = report["apps"]["entries"]
    assert (app["app_id"], app["last_batch"], app["last_commit"]["writer_identity"]) == (
        "s3-app",
        5,
        "s3-writer",
    )
    leftovers = {(e["kind"], e["batch"]) for e in report["staged_leftovers"]["entries"]}
    assert leftovers == {("manifest", 6), ("staged", 6)}
    assert staged in {e["path"] for e in report["staged_leftovers"]["entries"]}
    assert report["files"]["rows"] == 3
