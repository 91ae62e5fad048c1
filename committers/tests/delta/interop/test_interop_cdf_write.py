"""The change data feed of the sink's commits, judged by delta-spark.

delta-spark creates a table with ``delta.enableChangeDataFeed=true`` (partitioned by ``day`` or
not), copied into two identical tables for each test: the sink writes into one (upsert,
overwrite, ``replace_where``, complete mode, append, compaction), delta-spark makes the same
change to the other with its own MERGE / replaceWhere / overwrite. delta-spark's
``readChangeFeed`` of both must be the same rows with the same ``_change_type`` and
``_commit_version``, and equal the exact set written out here; both tables must read back the
same rows; delta-spark then keeps writing to both (its own MERGE) and the feeds stay equal. A
killed and replayed stream writes each change once.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import staging_leftovers
from committers.tests._delta_spark import assert_all_read
from committers.tests._spark_helpers import file_stream, write_source_file
from committers.tests._upsert_driver import APP_ID, run_cdc_stream, run_then_kill_a_replay
from framework import TwoPhaseSink

pytestmark = pytest.mark.spark

COLUMNS = "id BIGINT, name STRING, day STRING, ts BIGINT"
CHANGES = "id BIGINT, name STRING, day STRING, ts BIGINT, op STRING"
INITIAL = [(i, f"n{i}", f"d{i % 2}", 1) for i in range(1, 9)]


@pytest.fixture(scope="module")
def initial_table(delta_spark, tmp_path_factory) -> Callable[[bool], Path]:
    """The table delta-spark creates with the change data feed on (partitioned by ``day`` or
    not) holding ``INITIAL`` (version 1), made once per layout for the module: tests write to
    copies of it, which cost milliseconds where making one costs two Spark commits (a local
    table's log names its files relative to its root, so a copy is the same table)."""
    made: dict[bool, Path] = {}

    def table(partitioned: bool) -> Path:
        if partitioned not in made:
            uri = str(tmp_path_factory.mktemp("initial") / "t")
            clause = "PARTITIONED BY (day)" if partitioned else ""
            delta_spark.sql(
                f"CREATE TABLE delta.`{uri}` ({COLUMNS}) USING delta {clause} "
                "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
            )
            initial = delta_spark.createDataFrame(INITIAL, COLUMNS).repartition(2)
            initial.write.format("delta").mode("append").save(uri)
            made[partitioned] = Path(uri)
        return made[partitioned]

    return table


@pytest.fixture
def create_twins(initial_table, tmp_path) -> Callable[[bool], tuple[str, str]]:
    """Two identical tables holding ``INITIAL`` (copies of :func:`initial_table`): the sink
    writes the first, delta-spark the second."""

    def twins(partitioned: bool) -> tuple[str, str]:
        for name in ("ours", "theirs"):
            shutil.copytree(initial_table(partitioned), tmp_path / name)
        return str(tmp_path / "ours"), str(tmp_path / "theirs")

    return twins


def _feed(spark, uri: str, start: int = 1) -> list[tuple]:
    """delta-spark's change feed from ``start``: ``(_commit_version, _change_type, id, name,
    day, ts)`` sorted."""
    df = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", start)
        .load(uri)
    )
    rows = df.select("_commit_version", "_change_type", "id", "name", "day", "ts").collect()
    return sorted((tuple(r) for r in rows), key=repr)


def _since(feed: list[tuple], version: int) -> list[tuple]:
    """The part of a :func:`_feed` from ``version`` on: one read of the feed serves both."""
    return [change for change in feed if change[0] >= version]


def _rows(spark, uri: str) -> list[dict]:
    """The table's rows as delta-spark reads them; deltalake and DuckDB read the same."""
    return assert_all_read(spark, uri)


def _delta_rs_feed(uri: str, start: int) -> list[tuple]:
    """deltalake's change feed from ``start``, as :func:`_feed` gives delta-spark's."""
    changes = DeltaTable(uri).load_cdf(starting_version=start).read_all()
    table = pa.table(changes).to_pylist()
    return sorted(
        (
            (r["_commit_version"], r["_change_type"], r["id"], r["name"], r["day"], r["ts"])
            for r in table
        ),
        key=repr,
    )


def _merge(spark, uri: str, changes: list[tuple]) -> None:
    """delta-spark's MERGE of one change per key, with the sink's ``sequence_by="ts"`` rules: a
    newer change applies, an update of equal sequence too, a delete of equal sequence not."""
    spark.createDataFrame(changes, CHANGES).createOrReplaceTempView("cdf_changes")
    spark.sql(
        f"""MERGE INTO delta.`{uri}` t USING cdf_changes s ON t.id = s.id
        WHEN MATCHED AND s.op = 'D' AND s.ts > t.ts THEN DELETE
        WHEN MATCHED AND s.op <> 'D' AND s.ts >= t.ts
            THEN UPDATE SET id = s.id, name = s.name, day = s.day, ts = s.ts
        WHEN NOT MATCHED AND s.op <> 'D'
            THEN INSERT (id, name, day, ts) VALUES (s.id, s.name, s.day, s.ts)"""
    )


def _upsert_sink(uri: str, staging: str, app_id: str = "cdf") -> TwoPhaseSink:
    return TwoPhaseSink(
        DeltaSink(
            uri,
            app_id=app_id,
            mode="upsert",
            keys=["id"],
            sequence_by="ts",
            delete_when="op = 'D'",
            staging=staging,
        )
    )


def _log_actions(uri: str, version: int) -> list[dict]:
    path = Path(uri) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _assert_change_files_committed(uri: str, version: int, partitioned: bool) -> None:
    """The commit's cdc actions name change files under ``_change_data/`` (in partition
    directories, values in the action), with ``dataChange: false``; every change file on
    storage is one a commit names (no leftover of a failed attempt)."""
    cdc = [a["cdc"] for a in _log_actions(uri, version) if "cdc" in a]
    assert cdc
    for action in cdc:
        assert action["path"].startswith("_change_data/")
        assert action["dataChange"] is False
        assert set(action["partitionValues"]) == ({"day"} if partitioned else set())
        if partitioned:
            assert f"/day={action['partitionValues']['day']}/" in action["path"]
    named = {
        a["cdc"]["path"]
        for v in range(version + 1)
        for a in _log_actions(uri, v)
        if "cdc" in a and not a["cdc"]["path"].startswith("_change_data/day=")
    }
    on_disk = {str(p.relative_to(uri)) for p in (Path(uri) / "_change_data").rglob("*.parquet")}
    ours = {p for p in on_disk if "/batch-" in f"/{p}"}
    assert ours == named


# -- upserts -----------------------------------------------------------------------------------

UPSERT_BATCH = [
    (1, "n1-new", "d1", 2, "U"),  # an update
    (2, "n2", "d0", 2, "U"),  # an update that changes no value but ts
    (3, "n3", "d1", 1, "U"),  # matches, equal sequence, same values: an update all the same
    (4, None, None, 5, "D"),  # a key-only delete
    (5, "n5-moved", "d0", 2, "U"),  # moves to the other partition
    (6, "n6-stale", "d0", 0, "U"),  # older than the stored row: no change
    (7, None, None, 1, "D"),  # a delete of equal sequence: no change
    (20, "n20", "d0", 1, "I"),  # an insert
    (21, None, None, 3, "D"),  # a delete of an absent key: no change
]
UPSERT_FEED = [
    (2, "update_preimage", 1, "n1", "d1", 1),
    (2, "update_postimage", 1, "n1-new", "d1", 2),
    (2, "update_preimage", 2, "n2", "d0", 1),
    (2, "update_postimage", 2, "n2", "d0", 2),
    (2, "update_preimage", 3, "n3", "d1", 1),
    (2, "update_postimage", 3, "n3", "d1", 1),
    (2, "delete", 4, "n4", "d0", 1),
    (2, "update_preimage", 5, "n5", "d1", 1),
    (2, "update_postimage", 5, "n5-moved", "d0", 2),
    (2, "insert", 20, "n20", "d0", 1),
]


@pytest.mark.parametrize(
    ("staging", "partitioned"),
    [("auto", True), ("spark", False)],
    ids=["auto-by_day", "spark-flat"],
)
def test_an_upsert_writes_the_feed_delta_spark_merge_writes(
    delta_spark, create_twins, partitioned, staging
) -> None:
    """Updates (one changing nothing but its sequence, one changing nothing at all), a key-only
    delete, a move between partitions, an insert; a stale update, a delete of equal sequence
    and a delete of an absent key change nothing. Then delta-spark MERGEs into both tables."""
    spark = delta_spark
    ours, theirs = create_twins(partitioned)
    result = _upsert_sink(ours, staging).write(spark.createDataFrame(UPSERT_BATCH, CHANGES))
    assert result.version == 2
    _merge(spark, theirs, UPSERT_BATCH)
    initial = [(1, "insert", *row) for row in INITIAL]
    feed = _feed(spark, ours)
    assert feed == sorted(initial + UPSERT_FEED, key=repr)
    assert feed == _feed(spark, theirs)
    assert _delta_rs_feed(ours, 2) == sorted(UPSERT_FEED, key=repr)
    assert _rows(spark, ours) == _rows(spark, theirs)
    _assert_change_files_committed(ours, 2, partitioned)

    later = [(1, "n1-later", "d0", 7, "U"), (8, None, None, 7, "D"), (30, "n30", "d1", 7, "I")]
    for uri in (ours, theirs):
        _merge(spark, uri, later)
    feed = _feed(spark, ours)
    assert _since(feed, 3) == [
        (3, "delete", 8, "n8", "d0", 1),
        (3, "insert", 30, "n30", "d1", 7),
        (3, "update_postimage", 1, "n1-later", "d0", 7),
        (3, "update_preimage", 1, "n1-new", "d1", 2),
    ]
    assert feed == _feed(spark, theirs)
    assert _rows(spark, ours) == _rows(spark, theirs)


@pytest.mark.parametrize("staging", ["auto", "spark"])
def test_an_insert_only_upsert_writes_no_change_files(delta_spark, create_twins, staging) -> None:
    """No row replaced: the adds are the change data (as delta-spark's insert-only MERGE)."""
    spark = delta_spark
    ours, _ = create_twins(partitioned=True)
    batch = [(40, "n40", "d0", 1, "I"), (41, None, None, 1, "D")]
    _upsert_sink(ours, staging).write(spark.createDataFrame(batch, CHANGES))
    assert not [a for a in _log_actions(ours, 2) if "cdc" in a]
    assert _feed(spark, ours, 2) == [(2, "insert", 40, "n40", "d0", 1)]


# -- overwrites --------------------------------------------------------------------------------


def _overwrite(uri: str, df, staging: str, replace_where: str | None = None) -> None:
    sink = DeltaSink(
        uri, app_id="ow", mode="overwrite", replace_where=replace_where, staging=staging
    )
    TwoPhaseSink(sink).write(df)


REPLACEMENT = [(100, "n100", "d0", 9), (101, "n101", "d1", 9)]


#: replace_where predicates, each with the same test on a row ``(id, name, day, ts)``.
PREDICATES = {
    "data": ("ts >= 1 AND id > 5", lambda r: r[3] >= 1 and r[0] > 5),
    "partition_or_data": ("day = 'd0' OR id > 6", lambda r: r[2] == "d0" or r[0] > 6),
    "data_low": ("id <= 3", lambda r: r[0] <= 3),
}
LATER = [(1, "n1-later", "d0", 7, "U"), (8, None, None, 7, "D"), (300, "n300", "d1", 7, "I")]


# Every pair of (predicate, staging, layout) values once: the twelve combinations cost 15
# minutes of the suite, these six cover each value with each other one.
@pytest.mark.parametrize(
    ("predicate", "staging", "partitioned"),
    [
        ("data_low", "arrow", True),
        ("data_low", "spark", False),
        ("data", "arrow", False),
        ("data", "spark", True),
        ("partition_or_data", "arrow", True),
        ("partition_or_data", "spark", False),
    ],
)
def test_replace_where_on_data_columns_writes_deletes_and_inserts(
    delta_spark, create_twins, partitioned, staging, predicate
) -> None:
    """The rows replaced are ``delete`` rows, the rows written ``insert`` rows, in change
    files, as delta-spark's replaceWhere writes them; rows merely copied are no change."""
    spark = delta_spark
    replace_where, matches = PREDICATES[predicate]
    ours, theirs = create_twins(partitioned)
    rows = [r for r in REPLACEMENT if matches(r)]
    df = spark.createDataFrame(rows, COLUMNS)
    _overwrite(ours, df, staging, replace_where)
    df.write.format("delta").mode("overwrite").option("replaceWhere", replace_where).save(theirs)
    replaced = [r for r in INITIAL if matches(r)]
    expected = [(2, "delete", *r) for r in replaced] + [(2, "insert", *r) for r in rows]
    feed = _feed(spark, ours)
    assert _since(feed, 2) == sorted(expected, key=repr)
    assert feed == _feed(spark, theirs)
    assert _delta_rs_feed(ours, 2) == sorted(expected, key=repr)
    assert _rows(spark, ours) == _rows(spark, theirs)
    _assert_change_files_committed(ours, 2, partitioned)
    for uri in (ours, theirs):
        _merge(spark, uri, LATER)
    assert _feed(spark, ours) == _feed(spark, theirs)
    assert _rows(spark, ours) == _rows(spark, theirs)


# -- whole-file operations: removes and adds are the change data --------------------------------


@pytest.mark.parametrize(
    ("partitioned", "replace_where", "staging"),
    [
        (True, None, "spark"),
        (False, None, "arrow"),
        (True, "day = 'd0'", "spark"),
        (True, "day = 'd0'", "arrow"),
    ],
    ids=[
        "full-by_day-spark",
        "full-flat-arrow",
        "partition-by_day-spark",
        "partition-by_day-arrow",
    ],
)
def test_overwrites_of_whole_files_need_no_change_files(
    delta_spark, create_twins, partitioned, staging, replace_where
) -> None:
    """A full overwrite and a replace_where on the partition column remove whole files: the
    feed's deletes come from the removes, its inserts from the adds, as for delta-spark's own
    overwrite (which writes no change files either)."""
    spark = delta_spark
    ours, theirs = create_twins(partitioned)
    rows = [r for r in REPLACEMENT if replace_where is None or r[2] == "d0"]
    df = spark.createDataFrame(rows, COLUMNS)
    _overwrite(ours, df, staging, replace_where)
    writer = df.write.format("delta").mode("overwrite")
    if replace_where is not None:
        writer = writer.option("replaceWhere", replace_where)
    writer.save(theirs)
    assert not [a for a in _log_actions(ours, 2) if "cdc" in a]
    assert not [a for a in _log_actions(theirs, 2) if "cdc" in a]
    replaced = [r for r in INITIAL if replace_where is None or r[2] == "d0"]
    expected = [(2, "delete", *r) for r in replaced] + [(2, "insert", *r) for r in rows]
    feed = _feed(spark, ours)
    assert _since(feed, 2) == sorted(expected, key=repr)
    assert feed == _feed(spark, theirs)
    assert _rows(spark, ours) == _rows(spark, theirs)


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_complete_mode_replaces_the_rows_in_the_feed(delta_spark, tmp_path) -> None:
    """Each batch of a complete-mode stream removes the table's files and adds the new result:
    the feed shows the old result deleted and the new one inserted, batch by batch."""
    spark = delta_spark
    uri, source = str(tmp_path / "counts"), tmp_path / "src"
    spark.sql(
        f"CREATE TABLE delta.`{uri}` (day STRING, n BIGINT) USING delta PARTITIONED BY (day) "
        "TBLPROPERTIES (delta.enableChangeDataFeed = true)"
    )
    write_source_file(source, "part-000", range(0, 3))  # d0, d1, d2: one each
    write_source_file(source, "part-001", range(3, 5))  # d0, d1: two each then
    first = (source / "part-000.json").stat().st_mtime
    os.utime(source / "part-001.json", (first + 1, first + 1))  # Spark takes files by age
    counts = file_stream(spark, source).groupBy("day").count().withColumnRenamed("count", "n")
    sink = TwoPhaseSink(DeltaSink(uri, app_id="counts"))
    query = sink.write_stream(
        counts,
        checkpoint_location=str(tmp_path / "chk"),
        output_mode="complete",
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    df = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", 1)
        .load(uri)
    )
    feed = sorted(
        tuple(r) for r in df.select("_commit_version", "_change_type", "day", "n").collect()
    )
    assert feed == [
        (1, "insert", "d0", 1),
        (1, "insert", "d1", 1),
        (1, "insert", "d2", 1),
        (2, "delete", "d0", 1),
        (2, "delete", "d1", 1),
        (2, "delete", "d2", 1),
        (2, "insert", "d0", 2),
        (2, "insert", "d1", 2),
        (2, "insert", "d2", 1),
    ]


@pytest.mark.parametrize("staging", ["spark", "arrow"])
def test_appends_show_as_inserts_and_compaction_shows_nothing(
    delta_spark, create_twins, staging
) -> None:
    spark = delta_spark
    ours, _ = create_twins(partitioned=True)
    for i, rows in enumerate(([(50, "n50", "d0", 1)], [(51, "n51", "d0", 1)])):
        sink = TwoPhaseSink(DeltaSink(ours, app_id="app", staging=staging))
        assert sink.write(spark.createDataFrame(rows, COLUMNS)).version == 2 + i
    compacted = DeltaSink(ours, staging=staging).compact(spark)
    assert compacted.version == 4
    assert not [a for a in _log_actions(ours, 4) if "cdc" in a]
    assert _feed(spark, ours, 2) == [
        (2, "insert", 50, "n50", "d0", 1),
        (3, "insert", 51, "n51", "d0", 1),
    ]


# -- exactly once ----------------------------------------------------------------------------------

STREAM_BATCHES = [
    [(1, "v1b", "d1", 2, "U"), (3, None, None, 2, "D"), (9, "v9", "d0", 2, "I")],
    [(2, "v2b", "d0", 3, "U"), (4, "v4-stale", "d0", 0, "U"), (10, "v10", "d0", 3, "I")],
    [(1, None, None, 9, "D"), (5, "v5b", "d0", 4, "U"), (11, "v11", "d1", 4, "I")],
]


def test_a_killed_and_replayed_stream_writes_each_change_once(
    delta_spark, create_twins, tmp_path
) -> None:
    """Batches 0 and 1 run here; the checkpoint then forgets that batch 1 finished. The stream
    restarts as its own process: batch 1 is a replay (skipped: no second set of changes), and
    the process is SIGKILLed after staging batch 2 (change files included), before its commit.
    Restarted here, batch 2 is staged again and committed once: the feed holds each change
    once, as delta-spark's MERGE of the same batches gives it, and no change file of the
    killed attempt is left."""
    spark = delta_spark
    table, theirs = create_twins(partitioned=True)
    source, checkpoint = tmp_path / "changes", tmp_path / "chk"
    killed = run_then_kill_a_replay(spark, source, table, checkpoint, STREAM_BATCHES)
    assert killed.first_batches == [(0, "committed"), (1, "committed")]
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert f"batch=1 epoch=1 app_id={APP_ID} status=skipped" in killed.stderr
    assert DeltaTable(table).transaction_version(APP_ID) == 1
    assert staging_leftovers(table)
    assert list((Path(table) / "_change_data").glob("batch-2-*"))  # staged, not committed

    restarted = run_cdc_stream(spark, str(source), table, str(checkpoint))
    assert [(b.batch_id, b.status) for b in restarted.batches] == [(2, "committed")]
    for changes in STREAM_BATCHES:
        _merge(spark, theirs, changes)
    feed = _feed(spark, table)
    assert feed == _feed(spark, theirs)
    assert _rows(spark, table) == _rows(spark, theirs)
    assert _since(feed, 2) == [
        (2, "delete", 3, "n3", "d1", 1),
        (2, "insert", 9, "v9", "d0", 2),
        (2, "update_postimage", 1, "v1b", "d1", 2),
        (2, "update_preimage", 1, "n1", "d1", 1),
        (3, "insert", 10, "v10", "d0", 3),
        (3, "update_postimage", 2, "v2b", "d0", 3),
        (3, "update_preimage", 2, "n2", "d0", 1),
        (4, "delete", 1, "v1b", "d1", 2),
        (4, "insert", 11, "v11", "d1", 4),
        (4, "update_postimage", 5, "v5b", "d0", 4),
        (4, "update_preimage", 5, "n5", "d1", 1),
    ]
    assert staging_leftovers(table) == []
    _assert_change_files_committed(table, 4, partitioned=True)


# -- vacuum --------------------------------------------------------------------------------------


def test_vacuum_keeps_change_files_within_the_retention_and_deletes_expired_ones(
    delta_spark, create_twins
) -> None:
    """As delta-spark's VACUUM: change files are kept while younger than the retention (the
    feed of the versions within it stays readable) and deleted by their age after it."""
    spark = delta_spark
    ours, _ = create_twins(partitioned=True)
    _upsert_sink(ours, "auto").write(spark.createDataFrame(UPSERT_BATCH, CHANGES))
    changes = sorted((Path(ours) / "_change_data").rglob("*.parquet"))
    assert changes
    sink = DeltaSink(ours)
    kept = sink.vacuum(dry_run=False)
    assert not [p for p in kept if p.startswith("_change_data/")]
    assert sorted((Path(ours) / "_change_data").rglob("*.parquet")) == changes
    # committed change files are referenced by the log: never orphans
    orphans = sink.remove_orphan_files(
        retention=datetime.timedelta(0), unsafe_allow_short_retention=True, dry_run=True
    )
    assert not [p for p in orphans if p.startswith("_change_data/")]
    old = 1_000_000_000
    for path in changes:
        os.utime(path, (old, old))
    expired = sink.vacuum(dry_run=False)
    assert sorted(p for p in expired if p.startswith("_change_data/")) == sorted(
        str(p.relative_to(ours)) for p in changes
    )
    assert not list((Path(ours) / "_change_data").rglob("*.parquet"))
