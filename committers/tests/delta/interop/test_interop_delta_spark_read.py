"""delta-spark reads what the sink writes: the tables the sink makes (both stagings, partition
values with special characters and nulls, every type at its extremes, empty batches, upserts,
overwrites, compactions, complete mode), read with ``spark.read.format("delta")`` in the same
JVM, give exactly the rows deltalake and DuckDB give; time travel, DESCRIBE HISTORY / DETAIL,
VACUUM, delta-spark's checkpoint and log clean-up and ``readStream.format("delta")`` work over
the sink's log."""

from __future__ import annotations

import datetime
import decimal
import json
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, Field, QueryBuilder, Schema, write_deltalake
from deltalake.schema import StructType

from committers.delta import DeltaSink
from committers.delta.commit._log_store import LogStore
from committers.tests._delta_spark import (
    assert_all_read,
    comparable,
    data_files,
    delta_rs_rows,
    live_files,
    spark_rows,
)
from committers.tests._spark_helpers import file_stream, make_source, write_source_file
from framework import TwoPhaseSink

pytestmark = pytest.mark.spark

UTC = datetime.timezone.utc

# Partition values a path must escape, a null, and a value looking like Hive's null marker.
ODD_VALUES = ["a b", "x/y", "k=v", "100%", "ü€𠮷", "#?&", None]


def _sink(uri: str, **kwargs) -> TwoPhaseSink:
    return TwoPhaseSink(DeltaSink(uri, app_id="interop", **kwargs))


@pytest.mark.usefixtures("each_staging")
def test_partition_values_with_special_characters_and_nulls(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    rows = [(i, ODD_VALUES[i % len(ODD_VALUES)], None if i % 4 == 0 else i % 3) for i in range(21)]
    df = spark.createDataFrame(rows, "id BIGINT, p STRING, n INT")
    _sink(uri, partition_by=["p", "n"]).write(df.where("id < 10"))
    _sink(uri).write(df.where("id >= 10"))

    read = assert_all_read(spark, uri)
    assert sorted(r["id"] for r in read) == list(range(21))
    assert comparable([{"id": i, "p": p, "n": n} for i, p, n in rows]) == read
    for value in ODD_VALUES:  # partition pruning finds each value's rows, nothing else
        where = "p IS NULL" if value is None else f"p = '{value}'"
        expected = sorted(i for i, p, _ in rows if p == value)
        assert sorted(r["id"] for r in spark_rows(spark, uri, where)) == expected
    assert sorted(r["id"] for r in spark_rows(spark, uri, "n IS NULL")) == list(range(0, 21, 4))
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0]
    assert detail["format"] == "delta"
    assert list(detail["partitionColumns"]) == ["p", "n"]
    assert detail["numFiles"] == len(DeltaTable(uri).file_uris())


VALUES_DDL = (
    "id INT, b TINYINT, sh SMALLINT, i INT, l BIGINT, f FLOAT, d DOUBLE, dec DECIMAL(38,18),"
    " small DECIMAL(5,2), s STRING, bin BINARY, flag BOOLEAN, day DATE, ts TIMESTAMP,"
    " ntz TIMESTAMP_NTZ, arr ARRAY<INT>, m MAP<STRING,INT>, st STRUCT<a: INT, b: STRING>"
)


def _extreme_rows() -> list[tuple]:
    big = "99999999999999999999.999999999999999999"  # negated as text: -Decimal rounds
    return [
        (
            1, -128, -32768, -(2**31), -(2**63), float("-inf"), float("nan"),
            decimal.Decimal("-" + big),
            decimal.Decimal("-999.99"), "𠮷野家", b"\x00\xff", True, datetime.date(1, 1, 1),
            datetime.datetime(1, 1, 1, tzinfo=UTC), datetime.datetime(1, 1, 1),
            [None, 1], {"k": None}, (None, "x"),
        ),
        (
            2, 127, 32767, 2**31 - 1, 2**63 - 1, float("inf"), -0.0, decimal.Decimal(big),
            decimal.Decimal("999.99"), "🇩🇪" * 40, b"", False, datetime.date(9999, 12, 31),
            datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
            datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
            [], {}, (2**31 - 1, ""),
        ),
        (3, *[None] * 17),
    ]  # fmt: skip


# Filters delta-spark answers with the file statistics the sink wrote (data skipping): the
# files it keeps for each must include every file holding a matching row.
SKIPPING_FILTERS = [
    "l = 9223372036854775807",
    "b = -128",
    "s = '𠮷野家'",
    "s > '🇩🇪'",  # the row's value is longer than the 32 characters stats keep
    "dec = 99999999999999999999.999999999999999999",
    "day = DATE'9999-12-31'",
    "ts = TIMESTAMP'9999-12-31 23:59:59.999999'",
    "ts < TIMESTAMP'0002-01-01 00:00:00'",
    "ntz = TIMESTAMP_NTZ'9999-12-31 23:59:59.999999'",
    "f = double('-inf')",
    "d IS NULL",
]


@pytest.mark.usefixtures("each_staging")
def test_every_type_at_its_extremes(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    df = spark.createDataFrame(_extreme_rows(), VALUES_DDL)
    _sink(uri, partition_by=["id"]).write(df)  # one file per row: its stats are its values

    read = assert_all_read(spark, uri, duckdb=False)
    assert repr(read) == repr(comparable(df.toArrow().to_pylist()))
    # Which file holds each row, and which rows match each filter: one scan, no filter pushed.
    predicates = [f"({where}) AS m{n}" for n, where in enumerate(SKIPPING_FILTERS)]
    scan = spark.read.format("delta").load(uri).selectExpr("_metadata.file_path", *predicates)
    matches = scan.collect()
    for n, where in enumerate(SKIPPING_FILTERS):
        needed = {os.path.basename(row["file_path"]) for row in matches if row[f"m{n}"]}
        assert needed, where  # every filter matches a row
        kept = spark.read.format("delta").load(uri).where(where).inputFiles()
        assert needed <= {os.path.basename(path) for path in kept}, where


@pytest.mark.usefixtures("each_staging")
def test_timestamp_and_timestamp_ntz_partitions(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    df = spark.sql(
        "SELECT id, TIMESTAMP'2026-11-21 10:00:00.123456' + make_interval(0,0,0,0,0,0,id) AS ts,"
        " TIMESTAMP_NTZ'2026-11-21 10:00:00' + make_interval(0,0,0,0,0,0,id) AS ntz"
        " FROM range(4) UNION ALL SELECT 9, NULL, NULL"
    )
    _sink(uri, partition_by=["ts", "ntz"]).write(df)
    read = assert_all_read(spark, uri)
    assert read == comparable(df.toArrow().to_pylist())
    found = spark_rows(spark, uri, "ntz = TIMESTAMP_NTZ'2026-11-21 10:00:02'")
    assert [r["id"] for r in found] == [2]


@pytest.mark.usefixtures("each_staging")
def test_timestamp_partition_values_read_the_same_in_any_session_time_zone(delta_spark, tmp_path):
    """A timestamp partition value is logged as its instant in UTC with the zone spelled out,
    as delta-spark writes it: a session in another time zone reads the same instant and its
    partition filters find it (a spelling without a zone would shift every value by the
    session's offset)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    df = spark.sql(
        "SELECT 1L AS id, TIMESTAMP'2026-11-21 10:00:00.123456' AS ts UNION ALL "
        "SELECT 2L, TIMESTAMP'9999-12-31 23:59:59.999999' UNION ALL "
        "SELECT 3L, TIMESTAMP'0001-01-01 00:00:00' UNION ALL SELECT 4L, NULL"
    )
    _sink(uri, partition_by=["ts"]).write(df)
    commit = Path(uri, "_delta_log", f"{0:020d}.json").read_text().splitlines()
    adds = [json.loads(line)["add"] for line in commit if '"add"' in line]
    logged = {add["partitionValues"]["ts"] for add in adds}
    assert logged == {
        "2026-11-21T10:00:00.123456Z",
        "9999-12-31T23:59:59.999999Z",
        "0001-01-01T00:00:00.000000Z",
        None,
    }
    micros = {1: 1795255200123456, 2: 253402300799999999, 3: -62135596800000000, 4: None}
    spark.conf.set("spark.sql.session.timeZone", "America/Los_Angeles")
    try:
        read = spark.read.format("delta").load(uri).selectExpr("id", "unix_micros(ts)")
        assert sorted(tuple(row) for row in read.collect()) == sorted(micros.items())
        at_ten_utc = "ts = TIMESTAMP'2026-11-21 02:00:00.123456'"  # in Los Angeles
        found = spark.read.format("delta").load(uri).where(at_ten_utc).collect()
        assert [r["id"] for r in found] == [1]
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    read = assert_all_read(spark, uri)
    assert sorted(r["id"] for r in read) == [1, 2, 3, 4]


def _logged_timestamps(uri: str) -> set[str | None]:
    """Every ``ts`` partition value in the table's commit files, as spelled there."""
    spelled = set()
    for commit in sorted(Path(uri, "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            if '"add"' in line:
                spelled.add(json.loads(line)["add"]["partitionValues"]["ts"])
    return spelled


def test_timestamp_partitions_logged_without_a_zone_take_appends_upserts_compaction_overwrite(
    delta_spark, tmp_path
):
    """delta-rs (and this sink before it logged the zone) spell a timestamp partition value as
    UTC wall-clock time without one. The sink's appends, upsert, compaction and overwrite over
    such a table match those values by their instant: every row once, in its partition."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("ts", pa.timestamp("us", tz="UTC"))])
    at = [datetime.datetime(2026, 11, 21, h, 0, 0, 123456, tzinfo=UTC) for h in (10, 11, 12)]
    write_deltalake(uri, pa.table({"id": [1, 2, 3], "ts": at}, schema=schema), partition_by=["ts"])
    assert _logged_timestamps(uri) == {  # the premise: no zone in the log
        "2026-11-21 10:00:00.123456",
        "2026-11-21 11:00:00.123456",
        "2026-11-21 12:00:00.123456",
    }

    def at_hours(*rows: tuple[int, int]):
        values = ", ".join(f"({i}L, {h})" for i, h in rows)
        return spark.sql(
            "SELECT id, TIMESTAMP'2026-11-21 00:00:00.123456' + make_interval(0,0,0,0,h,0,0) AS ts"
            f" FROM VALUES {values} AS v(id, h)"
        )

    def hours() -> dict[int, int]:
        rows = assert_all_read(spark, uri)
        assert {(r["ts"].minute, r["ts"].microsecond) for r in rows} == {(0, 123456)}
        return {r["id"]: r["ts"].hour for r in rows}

    _sink(uri).write(at_hours((4, 10), (5, 13)))
    _sink(uri, mode="upsert", keys=["id"]).write(at_hours((1, 10), (7, 12)))
    DeltaSink(uri, app_id="interop").compact(spark)
    assert hours() == {1: 10, 2: 11, 3: 12, 4: 10, 5: 13, 7: 12}
    live = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    assert len({a["partition.ts"] for a in live}) == len(live) == 4  # one file per partition
    _sink(uri, mode="overwrite").write(at_hours((8, 11), (9, 14)))
    assert hours() == {8: 11, 9: 14}


def test_an_empty_first_batch_makes_a_table_delta_spark_reads(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _sink(uri).write(spark.createDataFrame([], "id BIGINT, name STRING, ts TIMESTAMP_NTZ"))
    df = spark.read.format("delta").load(uri)
    assert df.schema.simpleString() == "struct<id:bigint,name:string,ts:timestamp_ntz>"
    assert df.count() == 0
    _sink(uri).write(spark.sql("SELECT 1L AS id, 'a' AS name, TIMESTAMP_NTZ'2026-01-01' AS ts"))
    assert [r["id"] for r in assert_all_read(spark, uri)] == [1]


def test_a_table_created_by_our_first_commit_takes_delta_spark_writes(delta_spark, tmp_path):
    """The protocol, metadata and properties the sink's first commit records are ones
    delta-spark writes to, and the sink appends again after it."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _sink(uri, partition_by=["day"]).write(spark.sql("SELECT 1L AS id, 'd1' AS day"))
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (2, 'd2'), (3, NULL)")
    _sink(uri).write(spark.sql("SELECT 4L AS id, 'd1' AS day"))
    read = assert_all_read(spark, uri)
    assert [(r["id"], r["day"]) for r in sorted(read, key=lambda r: r["id"])] == [
        (1, "d1"),
        (2, "d2"),
        (3, None),
        (4, "d1"),
    ]


@pytest.mark.parametrize("mode", ["name", "id"])
def test_a_column_mapped_table_with_rules(delta_spark, tmp_path, mode):
    """A table delta-rs made with column mapping, NOT NULL, a generated column and a CHECK
    constraint: delta-spark reads the sink's rows by their physical names and still enforces
    the rules on its own writes."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    doubled = Field("doubled", "double", metadata={"delta.generationExpression": "amount * 2"})
    nested = StructType([Field("x", "long"), Field("y y", "string")])
    DeltaTable.create(
        uri,
        schema=Schema(
            [
                Field("id", "long", nullable=False),
                Field("amount", "double"),
                doubled,
                Field("s", nested),
                Field("day", "string"),
            ]
        ),
        partition_by=["day"],
        configuration={"delta.columnMapping.mode": mode},
    )
    DeltaTable(uri).alter.add_constraint({"positive": "amount > 0"})
    ddl = "id BIGINT, amount DOUBLE, s STRUCT<x: BIGINT, `y y`: STRING>, day STRING"
    rows = spark.createDataFrame([(1, 1.5, (10, "ten"), "d1"), (2, 2.0, None, None)], ddl)
    _sink(uri).write(rows)

    expected = [
        {"id": 1, "amount": 1.5, "doubled": 3.0, "s": {"x": 10, "y y": "ten"}, "day": "d1"},
        {"id": 2, "amount": 2.0, "doubled": 4.0, "s": None, "day": None},
    ]
    assert spark_rows(spark, uri) == comparable(expected)
    by_sql = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT * FROM t")
    assert comparable(pa.table(by_sql.read_all()).to_pylist()) == comparable(expected)
    with pytest.raises(Exception, match="positive"):
        spark.sql(f"INSERT INTO delta.`{uri}` (id, amount, s, day) VALUES (3, -1.0, NULL, 'd1')")
    spark.sql(f"INSERT INTO delta.`{uri}` (id, amount, s, day) VALUES (3, 3.0, NULL, 'd1')")
    assert [r["doubled"] for r in spark_rows(spark, uri, "id = 3")] == [6.0]


def _history(spark, uri: str) -> dict[int, dict]:
    rows = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    return {row["version"]: row.asDict() for row in rows}


def test_upsert_overwrite_compaction_history_and_time_travel(delta_spark, tmp_path):
    """Every version the sink made reads the same in delta-spark (versionAsOf) as in
    deltalake, and DESCRIBE HISTORY shows each commit's operation metrics and user
    metadata."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    rows = spark.sql("SELECT id, CAST(id % 3 AS STRING) AS day, id * 10 AS v FROM range(12)")
    appender = _sink(uri, partition_by=["day"], user_metadata="first load")
    appender.write(rows.where("id < 6"))  # v0
    appender.write(rows.where("id >= 6"), user_metadata="second load")  # v1
    changes = spark.sql(
        "SELECT * FROM VALUES (1L, '1', 111L, 'U'), (4L, '1', 0L, 'D'), (20L, '2', 200L, 'I')"
        " AS c(id, day, v, op)"
    )
    upsert = DeltaSink(uri, app_id="upsert", mode="upsert", keys=["id"], delete_when="op = 'D'")
    TwoPhaseSink(upsert).write(changes, user_metadata="cdc")  # v2
    day0 = spark.sql("SELECT id, '0' AS day, -id AS v FROM range(100, 103)")
    overwrite = DeltaSink(uri, app_id="daily", mode="overwrite", replace_where="day = '0'")
    TwoPhaseSink(overwrite).write(day0, user_metadata="day 0 again")  # v3
    for batch in range(3):  # small files to compact
        appender.write(spark.sql(f"SELECT {30 + batch}L AS id, '2' AS day, 0L AS v"))  # v4-6
    result = DeltaSink(uri).compact(spark)  # v7
    assert result.version == 7 and result.files_removed > 1

    for version in range(8):
        assert repr(spark_rows(spark, uri, versionAsOf=version)) == repr(
            delta_rs_rows(uri, version)
        ), version
    assert_all_read(spark, uri)

    history = _history(spark, uri)
    ours = {entry["version"]: entry for entry in DeltaTable(uri).history()}
    assert sorted(history) == list(range(8))
    for version, entry in history.items():
        expected = {k: str(v) for k, v in ours[version].get("operationMetrics", {}).items()}
        assert entry["operationMetrics"] == expected, version
        assert entry["userMetadata"] == ours[version].get("userMetadata"), version
    assert [history[v]["userMetadata"] for v in range(4)] == [
        "first load",
        "second load",
        "cdc",
        "day 0 again",
    ]
    assert history[2]["operationMetrics"]["numTargetRowsDeleted"] == "1"
    assert history[7]["operationMetrics"]["numRemovedFiles"] == str(result.files_removed)


def test_complete_mode_result(delta_spark, tmp_path):
    spark = delta_spark
    src, uri = make_source(tmp_path, 2), str(tmp_path / "t")
    counts = file_stream(spark, src).groupBy("day").count()
    query = _sink(uri).write_stream(
        counts,
        checkpoint_location=str(tmp_path / "chk"),
        output_mode="complete",
        trigger={"availableNow": True},
    )
    query.awaitTermination()
    read = assert_all_read(spark, uri)
    assert {r["day"]: r["count"] for r in read} == {"d0": 7, "d1": 7, "d2": 6}


def _age_log(uri: str, days: int) -> None:
    """Moves every log file's modification time ``days`` into the past."""
    past = time.time() - days * 86400
    for path in (Path(uri) / "_delta_log").iterdir():
        os.utime(path, (past, past))


def test_vacuum_removes_only_files_no_longer_referenced(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    rows = spark.sql("SELECT id, CAST(id % 2 AS STRING) AS day FROM range(10)")
    sink = _sink(uri, partition_by=["day"])
    for start in range(0, 10, 2):
        sink.write(rows.where(f"id >= {start} AND id < {start + 2}"))
    upsert = DeltaSink(uri, app_id="upsert", mode="upsert", keys=["id"])
    TwoPhaseSink(upsert).write(spark.sql("SELECT 3L AS id, '1' AS day"))
    DeltaSink(uri).compact(spark)
    before = assert_all_read(spark, uri)
    live = live_files(uri)
    assert data_files(uri) > live  # the upsert's and the compaction's removed files are there

    # VACUUM lists the table in as many tasks as Spark's partition discovery may use (10,000).
    settings = {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
    }
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS")
    finally:
        for key in settings:
            spark.conf.unset(key)
    assert data_files(uri) == live
    assert assert_all_read(spark, uri) == before


def test_delta_spark_checkpoint_and_log_clean_up_over_our_log(delta_spark, tmp_path):
    """delta-spark checkpoints the sink's log and cleans up its expired commits; every reader,
    and the sink's replay check (the txn now only in the checkpoint), still see it all."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    sink = _sink(uri, partition_by=["day"])
    for epoch in range(1, 5):
        df = spark.sql(f"SELECT {epoch}L AS id, 'd{epoch % 2}' AS day")
        assert sink.write(df, epoch_id=epoch).status == "committed"
    _age_log(uri, days=40)  # older than delta.logRetentionDuration (30 days)
    # A checkpoint of the latest version, then the clean-up delta-spark runs after each one.
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri).checkpoint()

    log = sorted(p.name for p in (Path(uri) / "_delta_log").iterdir() if not p.name.startswith("."))
    assert "00000000000000000003.checkpoint.parquet" in log
    assert "00000000000000000000.json" not in log  # cleaned up
    assert sorted(r["id"] for r in assert_all_read(spark, uri)) == [1, 2, 3, 4]
    again = sink.write(spark.sql("SELECT 4L AS id, 'd0' AS day"), epoch_id=4)
    assert again.status == "skipped"
    sink.write(spark.sql("SELECT 5L AS id, 'd1' AS day"), epoch_id=5)
    assert sorted(r["id"] for r in assert_all_read(spark, uri)) == [1, 2, 3, 4, 5]


def test_read_stream_over_our_streaming_appends_skips_compactions(delta_spark, tmp_path):
    """delta-spark's streaming source over the sink's streaming appends: each row once, and a
    compaction (dataChange=false) brings no row again."""
    spark = delta_spark
    src, uri = make_source(tmp_path, 3), str(tmp_path / "t")
    sink = _sink(uri, partition_by=["day"])

    def run_sink() -> None:
        sink.write_stream(
            file_stream(spark, src),
            checkpoint_location=str(tmp_path / "chk"),
            trigger={"availableNow": True},
        ).awaitTermination()

    seen: list[int] = []

    def run_reader() -> None:
        def collect(batch, _batch_id) -> None:
            seen.extend(row["id"] for row in batch.select("id").collect())

        (
            spark.readStream.format("delta")
            .load(uri)
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "reader"))
            .trigger(availableNow=True)
            .start()
            .awaitTermination()
        )

    run_sink()
    run_reader()
    assert sorted(seen) == list(range(30))
    assert DeltaSink(uri).compact(spark).files_removed > 1
    write_source_file(src, "part-003", range(30, 40))
    run_sink()
    run_reader()
    assert sorted(seen) == list(range(40))


def _ids(rows: list[dict]) -> list[int]:
    return sorted(row["id"] for row in rows)


def test_delta_spark_reads_our_log_appends_then_appends_and_checkpoints_after_us(
    delta_spark, tmp_path, monkeypatch
):
    """The sink's blind appends written straight into the log (not through delta-rs) read in
    delta-spark like any commit (latest version, time travel, history); delta-spark appends and
    checkpoints after them; the sink then continues from delta-spark's checkpoint (its replay
    check finds the txn there) with the same path."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    landed: list[str] = []
    put_if_absent = LogStore.put_if_absent

    def recording(self, name, data):
        won = put_if_absent(self, name, data)
        landed.extend([name] if won else [])
        return won

    monkeypatch.setattr(LogStore, "put_if_absent", recording)

    def ids_from(start: int, stop: int):
        return spark.sql(f"SELECT id, CONCAT('d', id % 2) AS day FROM range({start}, {stop})")

    sink = _sink(uri, partition_by=["day"])
    for epoch in (1, 2):  # version 0 creates the table; version 1 goes through the log view
        assert sink.write(ids_from(10 * epoch - 10, 10 * epoch), epoch_id=epoch).status == (
            "committed"
        )
    assert landed == [f"{1:020d}.json"]
    assert _ids(spark_rows(spark, uri, versionAsOf=1)) == list(range(20))
    entry = _history(spark, uri)[1]
    assert entry["operation"] == "WRITE"
    before, after = (len(DeltaTable(uri, version=v).file_uris()) for v in (0, 1))
    assert entry["operationMetrics"]["numFiles"] == str(after - before)

    ids_from(20, 30).write.format("delta").mode("append").save(uri)  # version 2
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, uri).checkpoint()
    assert (Path(uri) / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()

    again = _sink(uri)  # a cold start: its log view begins at delta-spark's checkpoint
    assert again.write(ids_from(10, 20), epoch_id=2).status == "skipped"
    assert again.write(ids_from(30, 40), epoch_id=3).status == "committed"
    assert landed[-1] == f"{3:020d}.json"
    assert _ids(assert_all_read(spark, uri)) == list(range(40))
    assert DeltaTable(uri).transaction_version("interop:write") == 3
