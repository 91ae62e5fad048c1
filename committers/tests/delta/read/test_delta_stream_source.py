"""Streaming reads of Delta tables: ``spark.readStream.format("deltalake")``.

Tables are made and changed by delta-rs (appends, deletes, overwrites, compaction, schema
evolution). The offsets' discovery is unit-tested without Spark; the Spark tests compare what
the stream delivered, batch by batch, with what delta-rs reads of the same versions.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field, QueryBuilder, write_deltalake

from committers.delta import DeltaSink, register
from committers.delta.format._format import parse_options, parse_stream_options
from committers.delta.read._stream import DeltaLogTail, SourceTableChangedError, StreamStart
from committers.delta.storage._storage import TableLocation
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._snapshot import SnapshotSpec, open_snapshot
from committers.tests._delta_helpers import commit_refused_reader_feature
from committers.tests._spark_helpers import drain_available_now
from framework import TwoPhaseSink
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
    """The stream's source as defined now (``load()``); it starts at its first offset."""
    _table, snapshot = open_snapshot(TableLocation.of(uri), SnapshotSpec())
    return DeltaLogTail(
        snapshot, start or StreamStart(), skip_change_commits=skip, config=FileSourceConfig()
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
    for started in (tail, skipping):
        started.initial_offset()  # the queries start before the delete
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


def test_a_replayed_first_batch_reads_the_files_its_logged_offsets_name(tmp_path):
    """Spark does not log a query's initial offset: after a crash it asks for it again and
    replays the first batch from there to the logged end. The end records where the batch
    began, so the restarted source reads the same files, however far the table moved on."""
    for start in (StreamStart(), StreamStart.of("latest"), StreamStart.of(1)):
        uri = _table(tmp_path / repr(start), range(0, 4), range(4, 8))
        first = _tail(uri, start)
        initial = first.initial_offset()
        if start.latest:  # something to read after the start
            write_deltalake(uri, _rows(range(8, 12)), partition_by=["p"], mode="append")
        end = first.discover(initial, AdmissionLimit(max_files=2), up_to=None)
        files = first.files_between(initial, end)
        assert len(files) == 2
        write_deltalake(uri, _rows(range(20, 30)), partition_by=["p"], mode="append")
        DeltaTable(uri).optimize.compact()
        restarted = _tail(uri, start)
        if start.version is None:  # the snapshot or 'latest': a later start now
            assert restarted.initial_offset() != initial
        assert restarted.files_between(restarted.initial_offset(), end) == files


def test_stream_options_are_validated():
    options = parse_stream_options({"maxFilesPerTrigger": "2", "skipChangeCommits": "true"})
    assert options.limit.max_files == 2 and options.skip_change_commits
    assert parse_stream_options({}).limit.max_files == 1000
    for bad, message in [
        ({"maxFilesPerTrigger": "0"}, "maxFilesPerTrigger must be a positive integer"),
        ({"skipChangeCommits": "maybe"}, "skipChangeCommits must be true or false"),
        ({"versionAsOf": "1"}, "versionAsOf is for batch reads"),
        ({"startingVersion": "first"}, "startingVersion must be"),
        ({"startingTimestamp": "yesterday"}, "startingTimestamp must be an ISO timestamp"),
        (
            {"startingVersion": "1", "startingTimestamp": "2026-11-21"},
            "give startingVersion or startingTimestamp, not both",
        ),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            parse_stream_options(bad)


def test_max_bytes_per_trigger_takes_spark_size_strings():
    """As delta-spark parses it (Spark's byteStringAsBytes): powers of 1024, bytes without a
    unit; with maxBytesPerTrigger alone there is no file limit."""
    for text, size in [
        ("1b", 1),
        ("100", 100),
        ("512k", 512 * 1024),
        ("512KB", 512 * 1024),
        ("10m", 10 * 1024**2),
        ("1g", 1024**3),
        (" 2t ", 2 * 1024**4),
    ]:
        limit = parse_stream_options({"maxBytesPerTrigger": text}).limit
        assert (limit.max_bytes, limit.max_files) == (size, None), text
    both = parse_stream_options({"maxBytesPerTrigger": "1m", "maxFilesPerTrigger": "3"}).limit
    assert (both.max_bytes, both.max_files) == (1024**2, 3)
    for bad in ("0", "-1", "1.5g", "10x", "ten", ""):
        with pytest.raises(ConfigurationError, match="maxBytesPerTrigger must be a positive size"):
            parse_stream_options({"maxBytesPerTrigger": bad})


def test_max_bytes_per_trigger_is_a_soft_limit_as_in_delta(tmp_path):
    """delta-spark takes files while the limit is not reached, so the file that crosses it is
    taken too: six equal files under a limit of 2.5 files make batches of 3 and 3."""
    same = _rows(range(0, 10), p=["x"] * 10)
    uri = str(tmp_path / "source")
    for _ in range(6):
        write_deltalake(uri, same, mode="append")
    sizes = {a.size_bytes for v in range(6) for a in _adds(uri, v)}
    assert len(sizes) == 1
    (size,) = sizes
    batches = _read_all(_tail(uri), AdmissionLimit(max_bytes=2 * size + size // 2))
    assert [len(b) for b in batches] == [3, 3]
    # A file larger than the limit is taken alone, never stuck.
    assert [len(b) for b in _read_all(_tail(uri), AdmissionLimit(max_bytes=1))] == [1] * 6


def test_the_starting_snapshot_is_read_in_deltas_order_not_path_order(tmp_path):
    """delta-spark orders a starting snapshot by modificationTime, then path: with one file
    per trigger, the batches follow the commits even where the paths sort the other way."""
    uri = str(tmp_path / "source")
    for index, part in enumerate(("c", "b", "a")):
        write_deltalake(
            uri, _rows(range(index, index + 1), p=[part]), partition_by=["p"], mode="append"
        )
        time.sleep(0.002)  # distinct modification times (milliseconds)
    batches = _read_all(_tail(uri), AdmissionLimit(max_files=1))
    assert [b[0].split("/")[0] for b in batches] == ["p=c", "p=b", "p=a"]


def test_starting_version_latest_is_fixed_when_the_stream_starts(tmp_path):
    """As in delta-spark, 'latest' is the table's version when the query starts, not when the
    stream was defined: a commit in between is not read, a commit after the start is."""
    uri = _table(tmp_path, range(0, 4))
    defined = _tail(uri, StreamStart.of("latest"))
    write_deltalake(uri, _rows(range(4, 6)), partition_by=["p"], mode="append")  # in between
    assert _read_all(defined, AdmissionLimit()) == []  # the query starts here
    write_deltalake(uri, _rows(range(6, 7)), partition_by=["p"], mode="append")
    assert _read_all(defined, AdmissionLimit()) == [[a.path for a in _adds(uri, 2)]]


def test_an_add_column_before_the_start_is_read_across_and_one_after_it_stops_the_stream(
    tmp_path,
):
    """delta-spark's rule: files written before a column was added are read with the
    stream's (newer) schema, so startingVersion=0 crosses an ADD COLUMN made before the query
    started; an ADD COLUMN after the start stops the stream for a restart."""
    uri = _table(tmp_path, range(0, 4), range(4, 8))
    DeltaTable(uri).alter.add_columns([Field("extra", "string", nullable=True)])
    wider = _rows(range(8, 10)).append_column("extra", pa.array(["x", "y"]))
    write_deltalake(uri, wider, partition_by=["p"], mode="append")
    tail = _tail(uri, StreamStart.of(0))
    files = [p for b in _read_all(tail, AdmissionLimit()) for p in b]
    assert sorted(files) == sorted(a.path for v in (0, 1, 3) for a in _adds(uri, v))
    DeltaTable(uri).alter.add_columns([Field("later", "long", nullable=True)])
    with pytest.raises(
        SourceTableChangedError,
        match=r"version 4 .* changes the table's schema after this query started: .*'later'"
        r".* Restart the query",
    ):
        _read_all(tail, AdmissionLimit())


def test_files_written_with_a_schema_the_streams_cannot_read_stop_it(tmp_path):
    """A column retyped before the query started (an overwrite of the schema): the stream's
    schema, the latest, cannot read the older files, so startingVersion=0 stops at once."""
    uri = _table(tmp_path, range(0, 4))
    retyped = _rows(range(4, 6)).set_column(2, "f", pa.array(["a", "b"]))
    write_deltalake(uri, retyped, partition_by=["p"], mode="overwrite", schema_mode="overwrite")
    with pytest.raises(
        SourceTableChangedError,
        match=r"version 0 of .* holds files written with a schema that the stream's .* cannot "
        r"read: another type or nullability for 'f' .* with a startingVersion after 0",
    ):
        _read_all(_tail(uri, StreamStart.of(0)), AdmissionLimit())


def test_the_schema_must_not_change_between_load_and_start(tmp_path):
    """The stream's schema is the one Spark planned with at load(); a table whose schema
    changed before the query started is refused then, with the fix."""
    uri = _table(tmp_path, range(0, 4))
    defined = _tail(uri)
    DeltaTable(uri).alter.add_columns([Field("extra", "string", nullable=True)])
    with pytest.raises(
        SourceTableChangedError,
        match=r"changed between the stream's definition \(load\(\), version 0\) and its start "
        r"\(version 1\): column\(s\) 'extra' not in the stream's schema\. Define the stream "
        r"again \(call load\(\) again\)",
    ):
        defined.initial_offset()


def test_a_commit_raising_the_reader_protocol_stops_the_stream_before_it(tmp_path):
    """delta-spark checks the protocol of every version a stream crosses: a commit that
    makes the table need a reader feature this reader does not honour (shredded variants, a
    reader version above 3) stops the stream before anything of it or after it is read."""
    uri = _table(tmp_path, range(0, 4))
    tail = _tail(uri)
    started = tail.initial_offset()
    commit_refused_reader_feature(uri, 1)
    with pytest.raises(
        UnsupportedTableFeatureError,
        match=r"version 1 of .* changes the table's protocol, and the stream stops before it: "
        r".*variantShredding-preview",
    ):
        tail.discover(started, AdmissionLimit(), up_to=None)

    other = _table(tmp_path / "other", range(0, 4))
    tail = _tail(other)
    started = tail.initial_offset()
    protocol = {"protocol": {"minReaderVersion": 4, "minWriterVersion": 7}}
    Path(other, "_delta_log", f"{1:020d}.json").write_text(json.dumps(protocol) + "\n")
    with pytest.raises(UnsupportedTableFeatureError, match="requires reader version 4"):
        tail.discover(started, AdmissionLimit(), up_to=None)


def _commit_at(uri: str, version: int, when: dt.datetime) -> None:
    """Set the commit time of ``version`` (its commit file's modification time)."""
    stamp = when.timestamp()
    os.utime(Path(uri, "_delta_log", f"{version:020d}.json"), (stamp, stamp))


def test_starting_timestamp_starts_at_the_first_commit_at_or_after_it(tmp_path):
    """delta-spark's startingTimestamp: the first version committed at or after it (the
    earliest one when it is before them all); after the latest commit it is an error."""
    uri = _table(tmp_path, range(0, 2), range(2, 4), range(4, 6), range(6, 8))
    base = dt.datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    for version in range(4):
        _commit_at(uri, version, base + dt.timedelta(minutes=version))

    def first_version(when) -> int:
        tail = _tail(uri, StreamStart.of(timestamp=when))
        return int(tail.initial_offset()["version"])

    assert first_version("2026-11-21T10:01:00Z") == 1  # exactly a commit's time
    assert first_version("2026-11-21 10:01:00.001") == 2  # just after it
    assert first_version(base - dt.timedelta(days=1)) == 0  # before every commit
    assert first_version("2026-11-21T11:02:30+01:00") == 3
    files = _read_all(
        _tail(uri, StreamStart.of(timestamp="2026-11-21T10:02:00Z")), AdmissionLimit()
    )
    assert sorted(p for b in files for p in b) == sorted(
        a.path for v in (2, 3) for a in _adds(uri, v)
    )
    with pytest.raises(
        ConfigurationError,
        match=r"startingTimestamp=2026-11-21T10:03:01\+00:00 is after the latest version \(3\)",
    ):
        first_version("2026-11-21T10:03:01Z")


def test_delta_spark_options_that_are_not_supported_are_refused_by_name(tmp_path):
    """Spark resolves the options at load(), batch or stream alike: delta-spark's streaming
    options are named with what to use instead, and an unknown name lists the options of
    both kinds of read (with the closest one)."""
    uri = _table(tmp_path, range(0, 2))
    for name, instead in [
        ("ignoreChanges", "use skipChangeCommits=true"),
        ("ignoreDeletes", "use skipChangeCommits=true"),
        ("excludeRegex", "every appended file is read"),
        ("failOnDataLoss", "always stops the stream"),
    ]:
        with pytest.raises(
            ConfigurationError,
            match=rf"option {name} is a delta-spark streaming read option that the deltalake "
            rf"format does not support: .*{instead}.* Streaming reads of the deltalake format "
            r"take the options startingVersion, startingTimestamp, maxFilesPerTrigger, "
            r"maxBytesPerTrigger, skipChangeCommits and maxSplitBytes",
        ):
            parse_options({"path": uri, name: "true"})
    with pytest.raises(
        ConfigurationError,
        match=r"Did you mean 'maxFilesPerTrigger' \(not 'maxFilesPerTriger'\)\? Streaming reads "
        r".* take the options startingVersion, .*; batch reads take versionAsOf, timestampAsOf, "
        r"filterPushdown and maxSplitBytes",
    ):
        parse_options({"path": uri, "maxFilesPerTriger": "2"})
    # The stream options themselves pass load() (they are checked when the stream starts).
    assert parse_options(
        {"path": uri, "startingTimestamp": "2026-11-21", "maxBytesPerTrigger": "1g"}
    )


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


def _stream(spark, uri: str, **options):
    """``spark.readStream.format("deltalake")`` of ``uri`` with ``options`` (defined, not
    started)."""
    reader = spark.readStream.format("deltalake")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load(uri)


def _drain(stream, checkpoint: Path, columns=SCHEMA.names) -> dict[int, list[tuple]]:
    """Run ``stream`` with ``availableNow``; rows delivered per batch id."""
    batches: dict[int, list[tuple]] = {}

    def collect(df, batch_id):
        batches[batch_id] = [tuple(r) for r in df.select(*columns).collect()]

    drain_available_now(stream, checkpoint, collect)
    return batches


def _run(spark, uri: str, checkpoint: Path, **options) -> dict[int, list[tuple]]:
    """Run the stream with ``availableNow``; rows delivered per batch id."""
    return _drain(_stream(spark, uri, **options), checkpoint)


def _delivered(*runs: dict[int, list[tuple]]) -> list[tuple]:
    return _sorted(r for batches in runs for rows in batches.values() for r in rows)


@pytest.mark.spark
def test_a_replayed_first_batch_delivers_the_rows_it_delivered_before(spark, tmp_path):
    """The checkpoint keeps only offsets/0, as after a crash right after Spark wrote it: the
    restarted query replays batch 0 from a fresh initial offset, and must still read the
    files batch 0 named, although the table got an append and a compaction since."""
    register(spark)
    uri = _table(tmp_path, range(0, 10), range(10, 20))
    checkpoint = tmp_path / "checkpoint"
    first = _run(spark, uri, checkpoint, maxFilesPerTrigger=2)
    assert len(first) > 1 and first[0]
    for entry in [*(checkpoint / "commits").iterdir(), *(checkpoint / "offsets").iterdir()]:
        if entry.name not in ("0", ".0.crc") or entry.parent.name == "commits":
            entry.unlink()
    write_deltalake(uri, _rows(range(20, 30)), partition_by=["p"], mode="append")
    DeltaTable(uri).optimize.compact()
    second = _run(spark, uri, checkpoint, maxFilesPerTrigger=2)
    assert _sorted(second[0]) == _sorted(first[0])
    assert _delivered(second) == _delta_rs_rows(uri)  # every row once


@pytest.mark.spark
def test_where_a_stream_starts_is_fixed_when_the_query_starts(spark, tmp_path):
    """As in delta-spark: startingVersion='latest' is the latest version when the query
    starts, not when it was defined; startingTimestamp starts at the first commit at or after
    it; maxBytesPerTrigger takes a size string (here one file per batch)."""
    register(spark)
    uri = _table(tmp_path, range(0, 4))
    delivered: list[tuple] = []
    latest = _stream(spark, uri, startingVersion="latest")
    write_deltalake(uri, _rows(range(4, 6)), partition_by=["p"], mode="append")  # in between
    query = (
        latest.writeStream.foreachBatch(
            lambda df, _id: delivered.extend(tuple(r) for r in df.select(*SCHEMA.names).collect())
        )
        .option("checkpointLocation", str(tmp_path / "latest"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()  # started: nothing to read
        write_deltalake(uri, _rows(range(6, 8)), partition_by=["p"], mode="append")
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    assert _sorted(delivered) == _sorted(tuple(r.values()) for r in _rows(range(6, 8)).to_pylist())

    base = dt.datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
    for version in range(3):
        _commit_at(uri, version, base + dt.timedelta(minutes=version))
    from_timestamp = _run(
        spark,
        uri,
        tmp_path / "timestamp",
        startingTimestamp="2026-11-21 10:00:30",
        maxBytesPerTrigger="1b",
    )
    assert _delivered(from_timestamp) == _sorted(
        tuple(r.values()) for r in _rows(range(4, 8)).to_pylist()
    )
    assert len(from_timestamp) == len(_adds(uri, 1)) + len(_adds(uri, 2))


@pytest.mark.spark
def test_a_stream_from_version_0_reads_rows_from_before_an_add_column_with_it_null(spark, tmp_path):
    register(spark)
    uri = _table(tmp_path, range(0, 4), range(4, 8))
    DeltaTable(uri).alter.add_columns([Field("extra", "string", nullable=True)])
    wider = _rows(range(8, 10)).append_column("extra", pa.array(["x", "y"]))
    write_deltalake(uri, wider, partition_by=["p"], mode="append")
    columns = [*SCHEMA.names, "extra"]
    delivered = _drain(_stream(spark, uri, startingVersion=0), tmp_path / "cp", columns)
    expected = pa.table(DeltaTable(uri).to_pyarrow_table()).select(columns).to_pylist()
    assert _delivered(delivered) == _sorted(tuple(r.values()) for r in expected)
    assert sum(1 for r in _delivered(delivered) if r[-1] is None) == 8


@pytest.mark.spark
def test_a_source_error_comes_back_from_failure_as_its_own_class(spark, tmp_path):
    """TwoPhaseSink.failure(query) finds errors raised in the "deltalake" source (in Spark's
    Python streaming-source worker), not only those of the sink's own batches."""
    register(spark)
    uri = _table(tmp_path, range(0, 10))
    sink = TwoPhaseSink(DeltaSink(str(tmp_path / "target"), app_id="copy"))
    checkpoint = str(tmp_path / "checkpoint")

    def start():
        return sink.write_stream(
            _stream(spark, uri), checkpoint_location=checkpoint, trigger={"availableNow": True}
        )

    start().awaitTermination()
    DeltaTable(uri).delete("id < 5")
    query = start()
    with pytest.raises(Exception, match="SourceTableChangedError"):
        query.awaitTermination()
    error = sink.failure(query)
    assert isinstance(error, SourceTableChangedError), repr(query.exception())
    assert "(DELETE) removes" in str(error) and "skipChangeCommits=true" in str(error)
    assert str(error).endswith(f"(raised in streaming query {query.id})")


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
