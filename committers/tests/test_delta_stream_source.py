"""Streaming reads of Delta tables: ``spark.readStream.format("deltalake")``.

Tables are made and changed by delta-rs (appends, deletes, overwrites, compaction, schema
evolution). The offsets' discovery is unit-tested without Spark; the Spark tests compare what
the stream delivered, batch by batch, with what delta-rs reads of the same versions.
"""

from __future__ import annotations

import datetime as dt
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from committers.delta import register
from committers.delta._format import parse_stream_options
from committers.delta._snapshot import SnapshotSpec, open_snapshot
from committers.delta._storage import TableLocation
from committers.delta._stream import DeltaLogTail, SourceTableChangedError, StreamStart
from framework.errors import ConfigurationError
from framework.source import FileSourceConfig
from framework.spark._stream_source import AdmissionLimit

UTC = dt.timezone.utc
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("p", pa.string()),
        ("f", pa.float64()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)


def _rows(ids, p=None) -> pa.Table:
    ids = list(ids)
    parts = p if p is not None else [None if i % 5 == 0 else f"p{i % 3}" for i in ids]
    return pa.table(
        [
            ids,
            parts,
            [math.nan if i % 7 == 0 else i / 2 for i in ids],
            [dt.datetime(9999, 12, 31, tzinfo=UTC) - dt.timedelta(seconds=i) for i in ids],
        ],
        schema=SCHEMA,
    )


def _table(tmp_path: Path, *appends: range, partition_by=("p",), **create) -> str:
    uri = str(tmp_path / "source")
    for index, ids in enumerate(appends):
        write_deltalake(
            uri,
            _rows(ids),
            partition_by=list(partition_by) or None,
            mode="append" if index else "error",
            **create,
        )
    return uri


def _tail(uri: str, start: StreamStart | None = None, *, skip: bool = False) -> DeltaLogTail:
    table, snapshot = open_snapshot(TableLocation.of(uri), SnapshotSpec())
    return DeltaLogTail(
        snapshot,
        str(table.metadata().id),
        start or StreamStart(),
        skip_change_commits=skip,
        config=FileSourceConfig(),
    )


def _read_all(tail: DeltaLogTail, limit: AdmissionLimit) -> list[list[str]]:
    """Micro-batches of file paths, from the initial offset until nothing is new."""
    batches, start = [], tail.initial_offset()
    while True:
        end = tail.discover(start, limit, up_to=None)
        if end == start:
            return batches
        batches.append([f.path for f in tail.files_between(start, end)])
        start = end


def _all_files(uri: str) -> set[str]:
    return set(DeltaTable(uri).file_uris())


# -- offsets, without Spark -------------------------------------------------------------------


def test_the_snapshot_then_each_commit_is_read_once_within_the_admission_limits(tmp_path):
    uri = _table(tmp_path, range(0, 10), range(10, 20))
    tail = _tail(uri)
    write_deltalake(uri, _rows(range(20, 30)), partition_by=["p"], mode="append")
    one_by_one = _read_all(tail, AdmissionLimit(max_files=1))
    assert all(len(batch) == 1 for batch in one_by_one)
    everything = _read_all(_tail(uri), AdmissionLimit())
    assert sorted(p for b in one_by_one for p in b) == sorted(p for b in everything for p in b)
    # Without a limit: one batch of the whole snapshot.
    assert len(everything) == 1
    assert {str(Path(uri, p)) for p in everything[0]} == _all_files(uri)
    # A byte limit below one file still moves forward, one file at a time.
    assert len(_read_all(_tail(uri), AdmissionLimit(max_bytes=1))) == len(_all_files(uri))


def test_starting_version_reads_the_commits_from_there_and_latest_only_new_ones(tmp_path):
    uri = _table(tmp_path, range(0, 4), range(4, 8), range(8, 12))
    from_one = _read_all(_tail(uri, StreamStart.of("1")), AdmissionLimit())
    added = {a.path for v in (1, 2) for a in _adds(uri, v)}
    assert set(from_one[0]) == added
    latest = _tail(uri, StreamStart.of("latest"))
    assert _read_all(latest, AdmissionLimit()) == []
    write_deltalake(uri, _rows(range(12, 13)), partition_by=["p"], mode="append")
    assert [len(b) for b in _read_all(latest, AdmissionLimit())] == [1]
    with pytest.raises(
        ConfigurationError, match=r"startingVersion=9 does not exist.*latest version is 3"
    ):
        _tail(uri, StreamStart.of(9)).initial_offset()
    with pytest.raises(ConfigurationError, match="startingVersion must be a version number"):
        StreamStart.of("-1")


def _adds(uri: str, version: int):
    import json
    from urllib.parse import unquote

    from framework.source import FileSplit

    lines = Path(uri, "_delta_log", f"{version:020d}.json").read_text().splitlines()
    return [
        FileSplit(path=unquote(a["add"]["path"]), size_bytes=a["add"]["size"])
        for a in map(json.loads, lines)
        if "add" in a
    ]


def test_deletes_and_overwrites_fail_clearly_or_are_skipped_whole(tmp_path):
    uri = _table(tmp_path, range(0, 10))
    tail, skipping = _tail(uri), _tail(uri, skip=True)
    DeltaTable(uri).delete("id = 3")
    write_deltalake(uri, _rows(range(10, 12)), partition_by=["p"], mode="append")
    with pytest.raises(SourceTableChangedError, match=r"version 1 of .*\(DELETE\) removes 1 data"):
        _read_all(tail, AdmissionLimit())
    batches = _read_all(skipping, AdmissionLimit())
    files = [p for b in batches for p in b]
    assert len(files) == len(set(files))
    assert {a.path for a in _adds(uri, 2)} <= set(files)
    # The delete's rewritten file is not read: only the snapshot of version 0 and version 2.
    assert not {a.path for a in _adds(uri, 1)} & set(files)
    write_deltalake(uri, _rows(range(50, 52)), partition_by=["p"], mode="overwrite")
    with pytest.raises(SourceTableChangedError, match="skipChangeCommits=true"):
        _read_all(_tail(uri, StreamStart.of(3)), AdmissionLimit())


def test_compaction_is_passed_over_and_schema_changes_stop_the_stream(tmp_path):
    uri = _table(tmp_path, range(0, 10), range(10, 20))
    tail = _tail(uri, StreamStart.of(0))
    DeltaTable(uri).optimize.compact()
    files = [p for b in _read_all(tail, AdmissionLimit()) for p in b]
    assert sorted(files) == sorted(a.path for v in (0, 1) for a in _adds(uri, v))
    wider = _rows(range(20, 22)).append_column("extra", pa.array(["x", "y"]))
    write_deltalake(uri, wider, partition_by=["p"], mode="append", schema_mode="merge")
    with pytest.raises(SourceTableChangedError, match="changes the table's schema"):
        _read_all(tail, AdmissionLimit())
    # A restarted query reads with the new schema and goes on.
    restarted = _tail(uri, StreamStart.of(3))
    assert [len(b) for b in _read_all(restarted, AdmissionLimit())] == [len(_adds(uri, 3))]


def test_cleaned_up_commits_and_recreated_tables_are_errors(tmp_path):
    uri = _table(tmp_path, range(0, 4), range(4, 8), range(8, 12))
    tail = _tail(uri, StreamStart.of(0))
    start = tail.initial_offset()
    DeltaTable(uri).create_checkpoint()
    for version in (0, 1):
        Path(uri, "_delta_log", f"{version:020d}.json").unlink()
    with pytest.raises(SourceTableChangedError, match=r"version 0 .* no longer available"):
        tail.discover(start, AdmissionLimit(), up_to=None)
    with pytest.raises(ConfigurationError, match=r"startingVersion=1 .* no longer available"):
        _tail(uri, StreamStart.of(1)).initial_offset()
    shutil.rmtree(uri)
    _table(tmp_path, range(0, 2))
    with pytest.raises(SourceTableChangedError, match="deleted and created again"):
        _tail(uri).discover(start, AdmissionLimit(), up_to=None)


def test_stream_options_are_validated():
    options = parse_stream_options({"maxFilesPerTrigger": "2", "skipChangeCommits": "true"})
    assert options.limit.max_files == 2 and options.skip_change_commits
    assert parse_stream_options({}).limit.max_files == 1000
    for bad, message in [
        ({"maxFilesPerTrigger": "0"}, "maxFilesPerTrigger must be a positive integer"),
        ({"maxBytesPerTrigger": "1g"}, "maxBytesPerTrigger must be a positive integer"),
        ({"skipChangeCommits": "maybe"}, "skipChangeCommits must be true or false"),
        ({"versionAsOf": "1"}, "versionAsOf is for batch reads"),
        ({"startingVersion": "first"}, "startingVersion must be"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            parse_stream_options(bad)


# -- through Spark ------------------------------------------------------------------------------


def _sorted(rows) -> list[tuple]:
    """Sorted rows, NaN made comparable, instants as naive UTC (as Spark collects them in a
    UTC session)."""

    def value(v):
        if isinstance(v, dt.datetime) and v.tzinfo is not None:
            return v.astimezone(UTC).replace(tzinfo=None)
        return "NaN" if isinstance(v, float) and math.isnan(v) else v

    return sorted((tuple(value(v) for v in row) for row in rows), key=repr)


def _delta_rs_rows(uri: str, version: int | None = None) -> list[tuple]:
    table = pa.table(DeltaTable(uri, version=version).to_pyarrow_table())
    return _sorted(tuple(r.values()) for r in table.select(SCHEMA.names).to_pylist())


def _run(spark, uri: str, checkpoint: Path, **options) -> dict[int, list[tuple]]:
    """Run the stream with ``availableNow``; rows delivered per batch id."""
    batches: dict[int, list[tuple]] = {}

    def collect(df, batch_id):
        batches[batch_id] = [tuple(r) for r in df.select(*SCHEMA.names).collect()]

    reader = spark.readStream.format("deltalake")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    query = (
        reader.load(uri)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    if query.exception() is not None:
        raise query.exception()
    return batches


@pytest.mark.spark
def test_a_stream_reads_every_row_once_across_restarts_and_limits(spark, tmp_path):
    register(spark)
    uri = _table(tmp_path, range(0, 30), range(30, 60))
    checkpoint = tmp_path / "checkpoint"
    first = _run(spark, uri, checkpoint, maxFilesPerTrigger=2)
    assert len(first) == math.ceil(len(_all_files(uri)) / 2)
    assert _sorted(r for rows in first.values() for r in rows) == _delta_rs_rows(uri)
    write_deltalake(uri, _rows(range(60, 75)), partition_by=["p"], mode="append")
    DeltaTable(uri).optimize.compact()  # no new data: nothing read twice
    write_deltalake(uri, _rows(range(75, 80)), partition_by=["p"], mode="append")
    second = _run(spark, uri, checkpoint)
    assert not set(second) & set(first)
    delivered = [r for rows in (*first.values(), *second.values()) for r in rows]
    assert _sorted(delivered) == _delta_rs_rows(uri)  # every row once, NaN and 9999 included


@pytest.mark.spark
def test_a_column_mapped_table_streams_by_physical_names(spark, tmp_path):
    register(spark)
    uri = str(tmp_path / "mapped")
    DeltaTable.create(
        uri, schema=SCHEMA, partition_by=["p"], configuration={"delta.columnMapping.mode": "name"}
    )
    write_deltalake(uri, _rows(range(0, 6)), mode="append")
    write_deltalake(uri, _rows(range(6, 9)), mode="append")
    delivered = _run(spark, uri, tmp_path / "cp", startingVersion=1)
    table = DeltaTable(uri)
    expected = QueryBuilder().register("t", table).execute("SELECT id, p, f, ts FROM t").read_all()
    assert _sorted(r for rows in delivered.values() for r in rows) == _sorted(
        tuple(r.values()) for r in pa.table(expected).to_pylist()
    )


@pytest.mark.spark
def test_a_change_commit_stops_the_stream_with_the_fix_in_the_message(spark, tmp_path):
    register(spark)
    uri = _table(tmp_path, range(0, 10))
    checkpoint = tmp_path / "checkpoint"
    _run(spark, uri, checkpoint)
    DeltaTable(uri).delete("id < 5")
    with pytest.raises(Exception, match=r"(?s)SourceTableChangedError.*skipChangeCommits=true"):
        _run(spark, uri, checkpoint)
    write_deltalake(uri, _rows(range(10, 13)), partition_by=["p"], mode="append")
    resumed = _run(spark, uri, checkpoint, skipChangeCommits="true")
    assert _sorted(r for rows in resumed.values() for r in rows) == _sorted(
        tuple(r.values()) for r in _rows(range(10, 13)).to_pylist()
    )
    with pytest.raises(Exception, match=r"(?s)ConfigurationError.*versionAsOf is for batch"):
        _run(spark, uri, tmp_path / "other", versionAsOf=0)


@pytest.mark.spark
def test_timestamp_partition_values_of_commits_are_read_as_delta_rs_reads_them(spark, tmp_path):
    register(spark)
    uri = _table(tmp_path, range(0, 3), range(3, 6), partition_by=("ts",))
    delivered = _run(spark, uri, tmp_path / "cp", startingVersion=0)  # commits, not a snapshot
    assert _sorted(r for rows in delivered.values() for r in rows) == _delta_rs_rows(uri)


@pytest.mark.spark
def test_a_table_on_s3_streams_into_a_table_on_s3_exactly_once(spark, s3, bucket, tmp_path):
    """Offsets, commit files and data files read through fsspec; the format writer stages and
    commits on S3; a replayed batch is skipped by the target."""
    from committers.tests._spark_helpers import forget_newest_commit

    register(spark)
    options = s3.storage_options()
    source, target = f"s3://{bucket}/stream/source", f"s3://{bucket}/stream/target"
    write_deltalake(source, _rows(range(0, 20)), partition_by=["p"], storage_options=options)
    checkpoint = tmp_path / "checkpoint"

    def run():
        reader = spark.readStream.format("deltalake").option("maxFilesPerTrigger", "2")
        writer = reader.options(**options).load(source).writeStream.format("deltalake")
        query = (
            writer.options(**options)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start(target)
        )
        query.awaitTermination(120)
        if query.exception() is not None:
            raise query.exception()

    run()
    write_deltalake(
        source, _rows(range(20, 30)), partition_by=["p"], mode="append", storage_options=options
    )
    forget_newest_commit(checkpoint)
    run()
    table = DeltaTable(target, storage_options=options).to_pyarrow_table().select(SCHEMA.names)
    assert _sorted(tuple(r.values()) for r in table.to_pylist()) == _sorted(
        tuple(r.values()) for r in _rows(range(0, 30)).to_pylist()
    )
