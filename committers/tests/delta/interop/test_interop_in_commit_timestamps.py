"""In-commit timestamps (the ``inCommitTimestamp`` writer feature) on tables delta-spark made:
every commit the sink writes to such a table (appends, a one-off write, an upsert, a
replace_where overwrite, a compaction) carries ``commitInfo`` first with an
``inCommitTimestamp`` after the previous commit's, even when another writer's clock was ahead;
time travel by timestamp (``read_table``, ``timestampAsOf``, ``startingTimestamp``) and the
inspect report resolve versions by them, and by the commit files' times before the version
that enabled them. delta-spark is the judge (its history, its time travel, its stream start);
the commit files' modification times are set far off, so a reader timing versions by them
would read other versions."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink, read_table, register
from committers.delta.inspect._inspect import gather
from committers.delta.storage._storage import TableLocation
from committers.tests._delta_helpers import (
    committed_files,
    data_files_on_disk,
    staging_leftovers,
)
from committers.tests._delta_spark import assert_all_read, comparable, spark_rows
from committers.tests.delta.interop.test_interop_delta_spark_write import _create
from framework import TwoPhaseSink

pytestmark = pytest.mark.spark

UTC = dt.timezone.utc
ICT_ON = (
    "TBLPROPERTIES ('delta.enableInCommitTimestamps' = 'true', "
    "'delta.enableDeletionVectors' = 'false', 'delta.checkpointInterval' = '2')"
)


def _log(uri: str, version: int) -> Path:
    return Path(uri) / "_delta_log" / f"{version:020d}.json"


def _commit_info_first(uri: str, version: int) -> dict:
    """The commitInfo of ``version``, checked to be its first action."""
    first = json.loads(_log(uri, version).read_text().splitlines()[0])
    assert "commitInfo" in first, f"version {version} does not start with its commitInfo"
    return first["commitInfo"]


def _in_commit_times(uri: str) -> dict[int, int]:
    """Each version's inCommitTimestamp (ms), checked to increase strictly."""
    stamps = {
        v: _commit_info_first(uri, v)["inCommitTimestamp"]
        for v in range(DeltaTable(uri).version() + 1)
    }
    ordered = [stamps[v] for v in sorted(stamps)]
    assert ordered == sorted(set(ordered)), f"not strictly increasing: {stamps}"
    return stamps


def _set_mtime(uri: str, version: int, when: dt.datetime) -> None:
    stamp = when.timestamp()
    os.utime(_log(uri, version), (stamp, stamp))


def _iso(millis: int) -> str:
    return dt.datetime.fromtimestamp(millis / 1000, UTC).isoformat(timespec="milliseconds")


def _history_times(spark, uri: str) -> dict[int, int]:  # type: ignore[no-untyped-def]
    """Each version's time as delta-spark's DESCRIBE HISTORY gives it (ms)."""
    return {
        row["version"]: int(row["timestamp"].replace(tzinfo=UTC).timestamp() * 1000)
        for row in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    }


def test_every_commit_the_sink_writes_carries_an_increasing_in_commit_timestamp(
    delta_spark, tmp_path
):
    spark = delta_spark
    uri = str(tmp_path / "t")
    rows = "id BIGINT, v INT"
    _create(spark, uri, rows, "INSERT INTO {t} VALUES (1, 10), (2, 20)", clauses=ICT_ON)
    stream = TwoPhaseSink(DeltaSink(uri, app_id="a"))
    stream.write(spark.createDataFrame([(3, 30), (4, 40)], rows), epoch_id=0)
    replay = stream.write(spark.createDataFrame([(3, 30), (4, 40)], rows), epoch_id=0)
    assert replay.status == "skipped"
    TwoPhaseSink(DeltaSink(uri)).write(spark.createDataFrame([(5, 50)], rows))
    changes = spark.createDataFrame(
        [(1, 11, "U"), (2, None, "D"), (6, 60, "U")], "id BIGINT, v INT, op STRING"
    )
    upsert = DeltaSink(uri, app_id="u", mode="upsert", keys=["id"], delete_when="op = 'D'")
    TwoPhaseSink(upsert).write(changes)
    replace = DeltaSink(uri, app_id="o", mode="overwrite", replace_where="id >= 5")
    TwoPhaseSink(replace).write(spark.createDataFrame([(5, 55)], rows))
    assert DeltaSink(uri).compact(spark).version is not None
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (7, 70)")  # delta-spark after us

    stamps = _in_commit_times(uri)
    assert len(stamps) == 8
    assert _history_times(spark, uri) == stamps  # delta-spark's history is timed by them
    expected = [(1, 11), (3, 30), (4, 40), (5, 55), (7, 70)]
    assert assert_all_read(spark, uri) == comparable([{"id": i, "v": v} for i, v in expected])
    assert list((Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))

    for version in stamps:  # nothing but the in-commit timestamps times the versions now
        _set_mtime(uri, version, dt.datetime(2001, 1, 1, tzinfo=UTC))
    for version in (0, 3, 5, 7):  # (one of each writer's commits: the reads cost seconds)
        stamp = stamps[version]
        at = spark_rows(spark, uri, versionAsOf=version)
        assert spark_rows(spark, uri, timestampAsOf=_iso(stamp)) == at
        assert comparable(read_table(spark, uri, timestamp=_iso(stamp)).toArrow().to_pylist()) == at
    report = gather(TableLocation.of(uri), recent_commits=8)
    assert {c.version: c.time for c in report.commits} == {
        v: _iso(s).replace("+00:00", "Z") for v, s in stamps.items()
    }

    # delta-rs's vacuum refuses such tables: the sink deletes the files and commits nothing
    removed = DeltaSink(uri).vacuum(
        retention=dt.timedelta(0), dry_run=False, unsafe_allow_short_retention=True
    )
    assert removed
    assert DeltaTable(uri).version() == 7
    assert staging_leftovers(uri) == []
    assert data_files_on_disk(uri) == committed_files(uri)
    assert assert_all_read(spark, uri) == comparable([{"id": i, "v": v} for i, v in expected])


def test_a_commit_after_one_from_a_clock_ahead_is_one_millisecond_later(delta_spark, tmp_path):
    """Another writer's clock an hour ahead: the sink's commit still comes after it, as
    PROTOCOL.md requires, and delta-spark's time travel agrees."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, "id BIGINT", "INSERT INTO {t} VALUES (1)", clauses=ICT_ON)
    ahead = int((dt.datetime.now(UTC) + dt.timedelta(hours=1)).timestamp() * 1000)
    actions = [json.loads(line) for line in _log(uri, 1).read_text().splitlines()]
    actions[0]["commitInfo"]["inCommitTimestamp"] = actions[0]["commitInfo"]["timestamp"] = ahead
    _log(uri, 1).write_text("".join(json.dumps(a) + "\n" for a in actions))
    for checksum in (Path(uri) / "_delta_log").glob("*.crc"):  # (they repeat the timestamp)
        checksum.unlink()

    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(spark.createDataFrame([(2,)], "id BIGINT"))
    stamps = _in_commit_times(uri)
    assert stamps[2] == ahead + 1
    assert _history_times(spark, uri)[2] == ahead + 1
    assert spark_rows(spark, uri, timestampAsOf=_iso(ahead)) == [{"id": 1}]
    assert comparable(read_table(spark, uri, timestamp=_iso(ahead)).toArrow().to_pylist()) == [
        {"id": 1}
    ]


def test_time_travel_and_stream_starts_across_the_version_that_enabled_them(delta_spark, tmp_path):
    """Versions before the enablement are timed by their commit files, the ones from it on by
    their in-commit timestamps (whatever their files' times say); both sides agree with
    delta-spark, and so does a stream's startingTimestamp."""
    spark = delta_spark
    register(spark)
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        "id BIGINT",
        "INSERT INTO {t} VALUES (1)",
        "INSERT INTO {t} VALUES (2)",
        clauses="TBLPROPERTIES ('delta.enableDeletionVectors' = 'false')",
    )
    # (within delta-spark's time travel limit, delta.deletedFileRetentionDuration)
    base = dt.datetime.now(UTC).replace(microsecond=0) - dt.timedelta(hours=2)
    for version in range(3):
        _set_mtime(uri, version, base + dt.timedelta(minutes=version))
    spark.sql(
        f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES ('delta.enableInCommitTimestamps' = 'true')"
    )
    configuration = DeltaTable(uri).metadata().configuration
    assert configuration["delta.inCommitTimestampEnablementVersion"] == "3"
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(spark.createDataFrame([(3,)], "id BIGINT"))
    TwoPhaseSink(DeltaSink(uri)).write(spark.createDataFrame([(4,)], "id BIGINT"))
    stamps = {v: _commit_info_first(uri, v)["inCommitTimestamp"] for v in (3, 4, 5)}
    assert stamps[3] < stamps[4] < stamps[5]
    for version in (3, 4, 5):  # the files' times would put these versions before version 0
        _set_mtime(uri, version, base - dt.timedelta(hours=1))

    times = {v: int((base + dt.timedelta(minutes=v)).timestamp() * 1000) for v in range(3)}
    times |= stamps
    for version in (1, 2, 3, 5):  # both sides of the enablement, and the latest version
        stamp = times[version]
        at = spark_rows(spark, uri, versionAsOf=version)
        for when in (_iso(stamp), _iso(stamp + 1))[: 1 if version == 5 else 2]:
            assert spark_rows(spark, uri, timestampAsOf=when) == at, (version, when)
            ours = read_table(spark, uri, timestamp=when).toArrow().to_pylist()
            assert comparable(ours) == at, (version, when)

    def started_at(fmt: str, when: str) -> list[int]:
        name = f"start_{fmt}"
        query = (
            spark.readStream.format(fmt)
            .option("startingTimestamp", when)
            .load(uri)
            .writeStream.format("memory")
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / name))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        ids = sorted(r["id"] for r in spark.table(name).collect())
        spark.sql(f"DROP VIEW IF EXISTS {name}")
        return ids

    assert (
        started_at("deltalake", _iso(stamps[4]))
        == started_at("delta", _iso(stamps[4]))
        == [
            3,
            4,
        ]
    )
