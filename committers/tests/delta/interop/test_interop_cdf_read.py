"""The change data feed read through the ``"deltalake"`` format equals delta-spark's.

Tables are written by delta-spark with the change data feed on (partitioned and not; INSERT,
UPDATE, DELETE, MERGE, overwrite, OPTIMIZE; deletion vectors off), then read with
``spark.read.format("deltalake").option("readChangeFeed", "true")`` and with delta-spark's
``spark.read.format("delta").option("readChangeFeed", "true")`` in the same session: the rows,
with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``, must be equal. Streams of
the feed through the format must deliver the batch read's rows, across a restart too. Tables
with the same history are made once and copied (:func:`kept_tables`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from committers.delta import register
from committers.tests._delta_spark import comparable
from committers.tests._spark_helpers import drain_available_now

pytestmark = pytest.mark.spark

CDF_ON = "'delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'false'"
CDF_AND_DV_ON = "'delta.enableChangeDataFeed' = 'true', 'delta.enableDeletionVectors' = 'true'"
ICT = ", 'delta.enableInCommitTimestamps' = 'true'"
MAPPED = (
    ", 'delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', "
    "'delta.minWriterVersion' = '5'"
)


def _table(
    spark, tmp_path: Path, statements, *, partitioned: bool = False, properties: str = CDF_ON
) -> str:
    """A table delta-spark creates (id, v, p) with ``properties``, then changes with
    ``statements`` (see :func:`_history`); its URI."""
    uri = str(tmp_path / "t")
    partitioning = "PARTITIONED BY (p)" if partitioned else ""
    spark.sql(
        f"CREATE TABLE delta.`{uri}` (id INT, v STRING, p INT) USING delta {partitioning} "
        f"TBLPROPERTIES ({properties})"
    )
    _history(spark, uri, *statements)
    return uri


def _changes(spark, fmt: str, uri: str, **options) -> list[dict]:
    """The change data feed as ``fmt`` (``delta`` or ``deltalake``) reads it, comparable."""
    reader = spark.read.format(fmt).option("readChangeFeed", "true")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return comparable(reader.load(uri).toArrow().to_pylist())


def _assert_same(spark, uri: str, **options) -> list[dict]:
    theirs = _changes(spark, "delta", uri, **options)
    ours = _changes(spark, "deltalake", uri, **options)
    assert ours == theirs
    return ours


def _operations(spark, uri: str) -> dict[int, str]:
    """Each version's operation, as DESCRIBE HISTORY lists it."""
    history = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    return {row["version"]: row["operation"] for row in history}


def _history(spark, uri: str, *statements: str) -> None:
    for statement in statements:
        spark.sql(statement.format(t=f"delta.`{uri}`"))


# INSERT, UPDATE (cdc files), a partial DELETE (cdc files), MERGE with all three clauses (cdc
# files), a DELETE of whole partitions (removes only, on a partitioned table), an overwrite
# (removes and adds), OPTIMIZE (dataChange false), and a MERGE that changes nothing.
STATEMENTS = (
    "INSERT INTO {t} VALUES (1, 'a', 1), (2, 'b', 1), (3, 'c', 2), (4, 'd', 3)",
    "INSERT INTO {t} VALUES (5, 'e', 2), (6, null, null)",
    "UPDATE {t} SET v = concat(v, '!') WHERE id IN (1, 3)",
    "DELETE FROM {t} WHERE id = 2",
    "DELETE FROM {t} WHERE id = 4",
    "MERGE INTO {t} t USING (SELECT * FROM VALUES (1, 'x', 1), (7, 'g', 3), (5, 'z', 2) "
    "AS s(id, v, p)) s ON t.id = s.id WHEN MATCHED AND s.id = 5 THEN DELETE "
    "WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *",
    "DELETE FROM {t} WHERE p = 3",
    "INSERT INTO {t} VALUES (8, 'h', 1)",
    "INSERT INTO {t} VALUES (9, 'i', 2)",
    "OPTIMIZE {t}",
    "MERGE INTO {t} t USING (SELECT 100 AS id) s ON t.id = s.id WHEN MATCHED THEN DELETE",
    "INSERT OVERWRITE {t} VALUES (10, 'j', 1), (11, 'k', 4)",
    "RESTORE TABLE {t} TO VERSION AS OF 4",
)


@pytest.fixture(scope="module")
def kept_tables(delta_spark, tmp_path_factory) -> Callable[..., Path]:
    """``kept_tables(count, partitioned=..., properties=...)``: the directory of the table
    :func:`_table` makes of ``STATEMENTS[:count]``, never changed (tests use :func:`_copy`).
    Each layout's whole history is run once for the module, the table kept after each
    statement: running the same statements again for each test was most of their time. A
    local table's log names its files relative to its root, so a copy (with the files' times,
    which are the commits' timestamps) is the same table."""
    kept: dict[tuple[bool, str], Path] = {}

    def table(count: int, *, partitioned: bool = False, properties: str = CDF_ON) -> Path:
        key = (partitioned, properties)
        if key not in kept:
            root = tmp_path_factory.mktemp("history")
            uri = _table(delta_spark, root, (), partitioned=partitioned, properties=properties)
            for n, statement in enumerate(STATEMENTS, 1):
                _history(delta_spark, uri, statement)
                shutil.copytree(uri, root / f"after-{n}")
            kept[key] = root
        return kept[key] / f"after-{count}"

    return table


def _copy(kept: Path, tmp_path: Path) -> str:
    """The URI of a copy of a kept table, the test's own to read and change."""
    uri = tmp_path / "t"
    shutil.copytree(kept, uri)
    return str(uri)


@pytest.mark.parametrize(
    ("partitioned", "vectors"),
    [(False, False), (True, True)],
    ids=["unpartitioned-no-dv", "partitioned-dv"],
)
def test_change_feed_equals_delta_spark(delta_spark, kept_tables, tmp_path, partitioned, vectors):
    """With deletion vectors, DELETE marks rows in the files' vectors (the same file removed
    and added again with another vector: the rows the vectors disagree on are the changes),
    a second DELETE in a file that has a vector already, and RESTORE re-adds rows a vector
    had marked."""
    spark = delta_spark
    register(spark)
    properties = CDF_AND_DV_ON if vectors else CDF_ON
    kept = kept_tables(len(STATEMENTS), partitioned=partitioned, properties=properties)
    uri = _copy(kept, tmp_path)
    operations = _operations(spark, uri)
    latest = max(operations)
    # A MERGE that matches nothing makes no commit; OPTIMIZE commits files without changes.
    assert sorted(operations.values()).count("MERGE") == 1
    optimized = next(v for v, op in operations.items() if op == "OPTIMIZE")

    everything = _assert_same(spark, uri, startingVersion=0)
    kinds = {r["_change_type"] for r in everything}
    assert kinds == {"insert", "delete", "update_preimage", "update_postimage"}
    deleted_partition = STATEMENTS.index("DELETE FROM {t} WHERE p = 3") + 1
    assert sorted(
        (r["id"], r["_change_type"])
        for r in everything
        if r["_commit_version"] == deleted_partition
    ) == [(7, "delete")]
    if vectors:  # the DELETE of id 2 is recorded in a deletion vector, not in cdc files
        text = (Path(uri) / "_delta_log" / f"{4:020d}.json").read_text()
        assert '"deletionVector":{' in text and '"cdc"' not in text
    assert {r["_commit_version"] for r in everything} == set(range(1, latest + 1)) - {optimized}
    for start, end in [(3, 3), (2, 5), (6, None), (latest - 1, None), (0, 100), (5, optimized)]:
        options = {"startingVersion": start}
        if end is not None:
            options["endingVersion"] = end
        changes = _assert_same(spark, uri, **options)
        last = latest if end is None else min(end, latest)
        assert changes == [r for r in everything if start <= r["_commit_version"] <= last]


def test_time_ranges_equal_delta_spark(delta_spark, kept_tables, tmp_path):
    spark = delta_spark
    register(spark)
    uri = _copy(kept_tables(5), tmp_path)
    times = {
        row["version"]: row["timestamp"].replace(tzinfo=dt.timezone.utc)
        for row in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    }
    ms = dt.timedelta(milliseconds=1)

    def iso(when: dt.datetime) -> str:
        return when.isoformat(timespec="milliseconds")

    everything = _assert_same(spark, uri, startingVersion=0)
    assert {r["_commit_timestamp"] for r in everything} == {times[v] for v in range(1, 6)}
    cases = [
        {"startingTimestamp": iso(times[2] - ms), "endingTimestamp": iso(times[4])},
        {"startingTimestamp": iso(times[2] + ms), "endingTimestamp": iso(times[4] + ms)},
        {"startingVersion": 1, "endingTimestamp": iso(times[3])},
        {"startingTimestamp": "2000-01-01T00:00:00Z", "endingVersion": 2},
    ]
    if times[3] - times[2] > 2 * ms:  # two timestamps between the same two commits
        cases.append(
            {"startingTimestamp": iso(times[2] + ms), "endingTimestamp": iso(times[3] - ms)}
        )
    for options in cases:
        _assert_same(spark, uri, **options)
    from_two = _assert_same(spark, uri, startingTimestamp=iso(times[2]))
    assert from_two == [r for r in everything if r["_commit_version"] >= 2]


def test_in_commit_timestamps_are_the_commit_timestamps(delta_spark, tmp_path):
    spark = delta_spark
    register(spark)
    uri = _table(spark, tmp_path, STATEMENTS[:4], partitioned=True, properties=CDF_ON + ICT)
    recorded = set()
    for version in range(1, 5):
        lines = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
        info = next(json.loads(x)["commitInfo"] for x in lines if "commitInfo" in x)
        recorded.add(dt.datetime.fromtimestamp(info["inCommitTimestamp"] / 1000, dt.timezone.utc))
        os.utime(Path(uri) / "_delta_log" / f"{version:020d}.json", (0, 0))  # mtimes differ
    changes = _assert_same(spark, uri, startingVersion=1)
    assert {r["_commit_timestamp"] for r in changes} == recorded
    # time ranges resolve by them too (the commit files' times would put every version at 1970)
    ms = dt.timedelta(milliseconds=1)
    second, third = sorted(recorded)[1:3]
    ranged = _assert_same(
        spark,
        uri,
        startingTimestamp=(second - ms).isoformat(timespec="milliseconds"),
        endingTimestamp=third.isoformat(timespec="milliseconds"),
    )
    assert {r["_commit_timestamp"] for r in ranged} == {second, third}


def test_column_mapping(delta_spark, tmp_path):
    spark = delta_spark
    register(spark)
    uri = _table(spark, tmp_path, STATEMENTS[:7], partitioned=True, properties=CDF_ON + MAPPED)
    _assert_same(spark, uri, startingVersion=0)
    spark.sql(f"ALTER TABLE delta.`{uri}` ADD COLUMNS (extra STRING)")
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (20, 'u', 1, 'more')")
    spark.sql(f"UPDATE delta.`{uri}` SET extra = 'set' WHERE id = 1")
    changes = _assert_same(spark, uri, startingVersion=2)
    assert {"extra"} < set(changes[0])


# -- errors ----------------------------------------------------------------------------------


def _ours_fails(spark, uri: str, match: str, **options) -> None:
    with pytest.raises(Exception, match=match):
        _changes(spark, "deltalake", uri, **options)


def _theirs_fails(spark, uri: str, **options) -> None:
    with pytest.raises(Exception):  # noqa: B017 - delta-spark's own error classes
        _changes(spark, "delta", uri, **options)


def test_versions_without_the_change_data_feed_are_refused_by_name(delta_spark, tmp_path):
    spark = delta_spark
    register(spark)
    uri = _table(
        spark,
        tmp_path,
        STATEMENTS[:2],
        partitioned=False,
        properties="'delta.enableDeletionVectors' = 'false'",
    )
    spark.sql(
        f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')"
    )
    _history(spark, uri, *STATEMENTS[2:4])  # versions 4 and 5
    spark.sql(
        f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')"
    )
    _history(spark, uri, STATEMENTS[4])  # version 7
    _theirs_fails(spark, uri, startingVersion=0)
    _ours_fails(spark, uri, r"not recorded at version\(s\) 0-2, 6-7", startingVersion=0)
    _theirs_fails(spark, uri, startingVersion=4)
    _ours_fails(spark, uri, r"not recorded at version\(s\) 6-7", startingVersion=4)
    _assert_same(spark, uri, startingVersion=3, endingVersion=5)


def test_bad_ranges_are_refused(delta_spark, kept_tables, tmp_path):
    spark = delta_spark
    register(spark)
    uri = _copy(kept_tables(3), tmp_path)
    for options, match in [
        ({"startingVersion": 4}, r"startingVersion=4 is after the latest version .* \(3\)"),
        (
            {"startingVersion": 3, "endingVersion": 2},
            r"from startingVersion=3 to endingVersion=2 ends before it starts",
        ),
        (
            {"startingTimestamp": "2999-01-01"},
            r"startingTimestamp=2999-01-01T00:00:00\+00:00 is after the latest version \(3\)",
        ),
        ({"endingVersion": 2}, r"needs startingVersion or startingTimestamp"),
    ]:
        _theirs_fails(spark, uri, **options)
        _ours_fails(spark, uri, match, **options)
    _ours_fails(spark, uri, r"option versionAsOf is not taken", startingVersion=0, versionAsOf=1)
    _ours_fails(spark, uri, r"startingVersion must be a version number", startingVersion="x")
    with pytest.raises(Exception, match=r"set readChangeFeed=true"):
        spark.read.format("deltalake").option("endingVersion", 2).load(uri).collect()


def test_commits_removed_by_log_cleanup_are_named(delta_spark, kept_tables, tmp_path):
    spark = delta_spark
    register(spark)
    uri = _copy(kept_tables(4), tmp_path)
    spark.sql(f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    _history(spark, uri, *STATEMENTS[4:6])  # version 6 has a checkpoint
    log = Path(uri) / "_delta_log"
    assert (log / f"{6:020d}.checkpoint.parquet").exists()
    for version in range(0, 4):
        (log / f"{version:020d}.json").unlink()
    _ours_fails(
        spark,
        uri,
        r"log cleanup removed the commit\(s\) of version\(s\) 2-3 .* earliest commit still "
        r"there is 4",
        startingVersion=2,
    )
    _theirs_fails(spark, uri, startingVersion=4)  # no checkpoint at or before version 4
    _ours_fails(
        spark,
        uri,
        r"table as of version 4 cannot be rebuilt .* earliest version it can start from is 6",
        startingVersion=4,
    )
    _assert_same(spark, uri, startingVersion=6)


# -- streams -----------------------------------------------------------------------------------


def _stream(spark, fmt: str, uri: str, checkpoint: Path, **options) -> dict[int, list[dict]]:
    """Run a ``readChangeFeed`` stream of ``fmt`` with ``availableNow``; rows per batch id."""
    reader = spark.readStream.format(fmt).option("readChangeFeed", "true")
    for key, value in options.items():
        reader = reader.option(key, str(value))
    batches: dict[int, list[dict]] = {}

    def collect(df, batch_id):
        batches[batch_id] = df.toArrow().to_pylist()

    drain_available_now(reader.load(uri), checkpoint, collect)
    return batches


def _rows(*runs: dict[int, list[dict]]) -> list[dict]:
    return comparable([r for batches in runs for rows in batches.values() for r in rows])


@pytest.mark.parametrize(
    ("partitioned", "vectors"), [(False, False), (True, True)], ids=["unpartitioned", "dv"]
)
def test_streams_deliver_the_batch_changes_across_a_restart(
    delta_spark, kept_tables, tmp_path, partitioned, vectors
):
    """delta-spark's batch read and stream are the judges, with deletion vectors too."""
    spark = delta_spark
    register(spark)
    layout = {"partitioned": partitioned, "properties": CDF_AND_DV_ON if vectors else CDF_ON}
    uri = _copy(kept_tables(6, **layout), tmp_path)

    # From a version: what the batch read gives, delta-spark's stream alike; one file per batch
    # except that a commit recorded in cdc files stays whole.
    first = _stream(
        spark, "deltalake", uri, tmp_path / "c1", startingVersion=1, maxFilesPerTrigger=1
    )
    assert _rows(first) == _assert_same(spark, uri, startingVersion=1)
    theirs = _stream(spark, "delta", uri, tmp_path / "c2", startingVersion=1, maxFilesPerTrigger=1)
    assert _rows(theirs) == _rows(first)
    for rows in first.values():
        for version in {r["_commit_version"] for r in rows}:
            kinds = {r["_change_type"] for r in rows if r["_commit_version"] == version}
            assert ("update_preimage" in kinds) == ("update_postimage" in kinds)

    # Without a start: the snapshot as inserts, then every commit; equal to delta-spark's.
    snapshot = _stream(spark, "deltalake", uri, tmp_path / "c3")
    assert _rows(snapshot) == _rows(_stream(spark, "delta", uri, tmp_path / "c4"))

    # Restarted from the checkpoints after more commits: only the new changes. The commits are
    # STATEMENTS[6:]'s, as delta-spark made them in the kept history (whose first six
    # statements made this table): their log entries and files, copied in.
    shutil.copytree(kept_tables(len(STATEMENTS), **layout), uri, dirs_exist_ok=True)
    again = _stream(
        spark, "deltalake", uri, tmp_path / "c1", startingVersion=1, maxFilesPerTrigger=1
    )
    assert min(again) > max(first)
    assert _rows(first, again) == _assert_same(spark, uri, startingVersion=1)
    more = _stream(spark, "deltalake", uri, tmp_path / "c3")
    assert _rows(snapshot, more) == comparable(
        _rows(snapshot) + _assert_same(spark, uri, startingVersion=7)
    )


def test_a_stream_stops_where_the_feed_was_not_recorded(delta_spark, kept_tables, tmp_path):
    spark = delta_spark
    register(spark)
    uri = _copy(kept_tables(2), tmp_path)
    spark.sql(
        f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.enableChangeDataFeed' = 'false')"
    )
    _history(spark, uri, STATEMENTS[2])
    with pytest.raises(Exception, match=r"not recorded at version 3"):
        _stream(spark, "deltalake", uri, tmp_path / "c", startingVersion=0)
    with pytest.raises(Exception, match=r"endingVersion is not taken by a stream"):
        _stream(spark, "deltalake", uri, tmp_path / "c2", startingVersion=0, endingVersion=1)
