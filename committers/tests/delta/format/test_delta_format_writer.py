"""Writing through the ``"deltalake"`` format: ``df.write.format`` and ``df.writeStream.format``.

Every outcome is checked as the exact rows in the table (delta-rs and DuckDB), the table's
version (nothing committed on a refusal) and the files on disk (nothing staged left behind).
"""

from __future__ import annotations

import datetime as dt
import math
import re

import pytest
from deltalake import DeltaTable, write_deltalake

from committers.delta import register
from committers.delta.format._format_writer import parse_write_options
from committers.tests._delta_helpers import (
    assert_no_duplicates,
    assert_no_orphans,
    data_files_on_disk,
    files_ever_added,
    ids,
    read_rows,
    staging_leftovers,
)
from committers.tests._readers import duckdb_rows
from committers.tests._spark_helpers import forget_newest_commit
from framework.errors import ConfigurationError

UTC = dt.timezone.utc


def _df(spark, lo: int, hi: int, *, day=None):
    return spark.sql(
        f"SELECT id, CAST(id % 3 AS INT) AS k, "
        f"CASE WHEN id % 4 = 0 THEN NULL ELSE concat('s', id, '🙂') END AS s, "
        f"{'CAST(id % 2 AS STRING)' if day is None else repr(day)} AS day "
        f"FROM range({lo}, {hi})"
    )


def _error_line(error: BaseException, name: str) -> str:
    """The message of the ``name`` error that Spark's error text quotes."""
    return str(error).split(f"{name}: ", 1)[1].splitlines()[0]


def _version(uri: str) -> int:
    return DeltaTable(uri).version()


@pytest.mark.spark
def test_batch_writes_append_partition_and_are_read_back_by_two_readers(spark, tmp_path):
    register(spark)
    uri = str(tmp_path / "t")
    _df(spark, 0, 50).write.format("deltalake").mode("append").option("partitionBy", "day").save(
        uri
    )
    _df(spark, 50, 60).write.format("deltalake").mode("append").save(uri)
    assert DeltaTable(uri).metadata().partition_columns == ["day"]
    assert ids(uri) == list(range(60))
    assert sorted(r["id"] for r in duckdb_rows(uri)) == list(range(60))
    row = next(r for r in read_rows(uri) if r["id"] == 7)
    assert row == {"id": 7, "k": 1, "s": "s7🙂", "day": "1"}
    assert_no_orphans(uri)


@pytest.mark.spark
def test_txn_app_id_and_version_make_a_rerun_a_no_op(spark, tmp_path):
    register(spark)
    uri = str(tmp_path / "t")

    def write(lo, hi, version, mode="append"):
        (
            _df(spark, lo, hi)
            .write.format("deltalake")
            .mode(mode)
            .option("txnAppId", "nightly")
            .option("txnVersion", str(version))
            .save(uri)
        )

    write(0, 10, 0)
    write(0, 10, 0)  # the re-run of version 0: skipped
    assert ids(uri) == list(range(10)) and _version(uri) == 0
    write(10, 20, 1)
    assert ids(uri) == list(range(20))
    assert DeltaTable(uri).transaction_version("nightly") == 1
    write(100, 105, 2, mode="overwrite")
    write(100, 105, 2, mode="overwrite")
    assert ids(uri) == list(range(100, 105))
    # With delta-spark's SQL extension in the session (the test session has it once `make jars`
    # ran), its analyzer checks txnAppId/txnVersion on every DataSource V2 write, this
    # format's too, and refuses first with its own message.
    delta_spark_first = "DeltaSparkSessionExtension" in spark.conf.get("spark.sql.extensions", "")
    refusal = (
        "DELTA_INVALID_IDEMPOTENT_WRITES_OPTIONS"
        if delta_spark_first
        else r"(?s)ConfigurationError.*txnAppId and txnVersion go"
    )
    with pytest.raises(Exception, match=refusal):
        _df(spark, 0, 1).write.format("deltalake").mode("append").option("txnVersion", "3").save(
            uri
        )
    with pytest.raises(Exception, match=r"(?s)ConfigurationError.*txnAppId and txnVersion go"):
        _df(spark, 0, 1).write.format("deltalake").mode("append").option("app_id", "j").save(uri)
    assert ids(uri) == list(range(100, 105))
    assert staging_leftovers(uri) == []  # (the overwritten files stay until a vacuum)


@pytest.mark.smoke  # make check: the end-to-end test of its feature
@pytest.mark.spark
def test_overwrite_with_replace_where_replaces_only_its_partitions(spark, tmp_path):
    register(spark)
    uri = str(tmp_path / "t")
    _df(spark, 0, 20).write.format("deltalake").mode("append").option("partitionBy", "day").save(
        uri
    )
    (
        _df(spark, 100, 103, day="1")
        .write.format("deltalake")
        .mode("overwrite")
        .option("replaceWhere", "day = '1'")
        .save(uri)
    )
    assert ids(uri) == [*range(0, 20, 2), 100, 101, 102]
    before = _version(uri)
    with pytest.raises(
        Exception, match=r"(?s)ConstraintViolationError.*replaceWhere \(day = '0'\)"
    ):
        (
            _df(spark, 200, 204)
            .write.format("deltalake")
            .mode("overwrite")
            .option("replaceWhere", "day = '0'")
            .save(uri)
        )
    assert _version(uri) == before
    assert staging_leftovers(uri) == []


@pytest.mark.spark
def test_replace_where_on_a_data_column_rewrites_the_files_holding_matching_rows(spark, tmp_path):
    """replaceWhere on a column that is not a partition column (DeltaSuite's "valid
    replaceWhere"): the rows with k = 1 are replaced, the others stay (the files holding
    k = 1 rows are rewritten in the commit's Python worker, which has no Spark); a row the
    predicate is not TRUE for, NULL included, fails the write with nothing committed."""
    register(spark)
    uri = str(tmp_path / "t")
    for lo in (0, 10):
        _df(spark, lo, lo + 10).write.format("deltalake").mode("append").save(uri)
    new = spark.sql("SELECT id, 1 AS k, 'new' AS s, 'x' AS day FROM range(100, 103)")
    new.write.format("deltalake").mode("overwrite").option("replaceWhere", "k = 1").save(uri)
    expected = [i for i in range(20) if i % 3 != 1] + [100, 101, 102]
    assert ids(uri) == expected
    assert sorted(r["id"] for r in duckdb_rows(uri)) == expected
    assert next(r for r in read_rows(uri) if r["id"] == 100) == {
        "id": 100,
        "k": 1,
        "s": "new",
        "day": "x",
    }
    history = DeltaTable(uri).history(1)[0]
    assert history["operationParameters"]["predicate"] == "k = 1"
    assert data_files_on_disk(uri) <= files_ever_added(uri)
    assert staging_leftovers(uri) == []
    before = _version(uri)
    for k, shown in (("2", "2"), ("NULL", "None")):
        bad = spark.sql(f"SELECT id, CAST({k} AS INT) AS k, 's' AS s, 'x' AS day FROM range(1)")
        message = rf"(?s)ConstraintViolationError.*replaceWhere \(k = 1\).*'k': {shown}"
        with pytest.raises(Exception, match=message):
            bad.write.format("deltalake").mode("overwrite").option("replaceWhere", "k = 1").save(
                uri
            )
    assert _version(uri) == before
    assert staging_leftovers(uri) == []


@pytest.mark.spark
def test_rows_the_table_refuses_commit_nothing_and_leave_nothing(spark, tmp_path):
    register(spark)
    import pyarrow as pa

    uri = str(tmp_path / "strict")
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), ("s", pa.string())])
    write_deltalake(uri, pa.table({"id": [1], "s": ["a"]}, schema=schema))
    with pytest.raises(Exception, match=r"(?s)NullConstraintError.*NOT NULL column 'id'"):
        spark.sql("SELECT CAST(NULL AS BIGINT) AS id, 'x' AS s").write.format("deltalake").mode(
            "append"
        ).save(uri)
    assert _version(uri) == 0 and ids(uri) == [1]
    assert_no_orphans(uri)

    checked = str(tmp_path / "checked")
    write_deltalake(checked, pa.table({"id": [1], "s": ["a"]}, schema=schema))
    DeltaTable(checked).alter.add_constraint({"positive": "id > 0"})
    with pytest.raises(
        Exception, match=r"(?s)ConfigurationError.*CHECK constraints positive.*TwoPhaseSink"
    ):
        spark.sql("SELECT 2L AS id, 'x' AS s").write.format("deltalake").mode("append").save(
            checked
        )
    assert ids(checked) == [1]

    parted = str(tmp_path / "parted")
    _df(spark, 0, 4).write.format("deltalake").mode("append").option("partitionBy", "day").save(
        parted
    )
    with pytest.raises(Exception, match=r"(?s)ConstraintViolationError.*must not hold an empty"):
        _df(spark, 4, 8, day="").write.format("deltalake").mode("append").save(parted)
    assert ids(parted) == [0, 1, 2, 3]
    assert_no_orphans(parted)


@pytest.mark.spark
def test_errors_name_the_formats_own_options_and_overwrite_schema_replaces_the_schema(
    spark, tmp_path
):
    """A format write's schema errors give the format's fix (``.option("mergeSchema",
    "true")``, ``partitionBy``), not DeltaSink's keyword arguments; ``overwriteSchema`` outside
    an overwrite of the whole table is refused by name. Nothing is committed or staged by a
    refused write; ``overwriteSchema`` with ``mode("overwrite")`` replaces the schema and the
    partitioning with the rows."""
    register(spark)
    uri = str(tmp_path / "t")
    _df(spark, 0, 4).write.format("deltalake").mode("append").option("partitionBy", "day").save(uri)
    wider = _df(spark, 4, 6).selectExpr("*", "'x' AS note")
    with pytest.raises(Exception) as new_column:
        wider.write.format("deltalake").mode("append").save(uri)
    message = _error_line(new_column.value, "SchemaMismatchError")
    assert re.search(
        r"column 'note' \(STRING\) is not in the table: drop it from the input, or set "
        r'\.option\("mergeSchema", "true"\) to add it to the table',
        message,
    )
    assert "schema_mode" not in message
    with pytest.raises(Exception) as partitioning:
        _df(spark, 4, 6).write.format("deltalake").mode("append").option("partitionBy", "k").save(
            uri
        )
    assert re.search(
        r"SchemaMismatchError: table .* is partitioned by \['day'\], but the write asks for "
        r"partitionBy=\['k'\]\. Use the table's partitioning \(or leave partitionBy out\)",
        str(partitioning.value),
    )
    with pytest.raises(Exception) as in_append:
        wider.write.format("deltalake").mode("append").option("overwriteSchema", "true").save(uri)
    assert re.search(
        r"ConfigurationError: option overwriteSchema replaces the table's schema together with "
        r'all its rows: it needs mode\("overwrite"\)\. .* \.option\("mergeSchema", "true"\)',
        str(in_append.value),
    )
    with pytest.raises(Exception) as with_replace_where:
        wider.write.format("deltalake").mode("overwrite").option("overwriteSchema", "true").option(
            "replaceWhere", "day = 'd0'"
        ).save(uri)
    assert "options overwriteSchema and replaceWhere cannot go together" in str(
        with_replace_where.value
    )
    assert _version(uri) == 0 and ids(uri) == list(range(4))
    assert_no_orphans(uri)

    wider.write.format("deltalake").mode("append").option("mergeSchema", "true").save(uri)
    _df(spark, 6, 8).write.format("deltalake").mode("append").option(
        "overwriteSchema", "false"
    ).save(uri)
    assert ids(uri) == list(range(8))
    assert sorted((r["id"], r["note"]) for r in duckdb_rows(uri))[3:6] == [
        (3, None),
        (4, "x"),
        (5, "x"),
    ]

    reshaped = spark.createDataFrame([("a", 1.5), ("b", None)], "name string, score double")
    reshaped.write.format("deltalake").mode("overwrite").option("overwriteSchema", "true").option(
        "partitionBy", "name"
    ).save(uri)
    table = DeltaTable(uri)
    assert table.metadata().partition_columns == ["name"]
    assert [f.name for f in table.schema().fields] == ["name", "score"]
    expected = [{"name": "a", "score": 1.5}, {"name": "b", "score": None}]
    assert sorted(duckdb_rows(uri), key=lambda r: r["name"]) == expected
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["name"]) == expected


@pytest.mark.spark
def test_a_stream_writes_each_batch_once_across_replays(spark, tmp_path):
    register(spark)
    source, target = str(tmp_path / "source"), str(tmp_path / "target")
    checkpoint = tmp_path / "checkpoint"
    _df(spark, 0, 30).write.format("deltalake").mode("append").option("partitionBy", "day").save(
        source
    )

    def run(**options):
        writer = (
            spark.readStream.format("deltalake")
            .option("maxFilesPerTrigger", "1")
            .load(source)
            .where("k <> 2")
            .writeStream.format("deltalake")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
        )
        for key, value in options.items():
            writer = writer.option(key, value)
        query = writer.start(target)
        query.awaitTermination(120)
        if query.exception() is not None:
            raise query.exception()
        return query

    query = run()
    expected = [i for i in range(30) if i % 3 != 2]
    assert ids(target) == expected
    batches = len(DeltaTable(source).file_uris())  # one file per micro-batch
    assert DeltaTable(target).transaction_version(query.id) == batches - 1
    _df(spark, 30, 40).write.format("deltalake").mode("append").save(source)
    forget_newest_commit(checkpoint)  # Spark runs batch 1 again: the table skips it
    run()
    expected += [i for i in range(30, 40) if i % 3 != 2]
    assert_no_duplicates(ids(target))
    assert ids(target) == expected
    assert sorted(r["id"] for r in duckdb_rows(target)) == expected
    assert_no_orphans(target)


@pytest.mark.spark
def test_a_new_checkpoint_with_a_used_app_id_commits_nothing(spark, tmp_path):
    register(spark)
    source, target = str(tmp_path / "source"), str(tmp_path / "target")
    _df(spark, 0, 10).write.format("deltalake").mode("append").save(source)

    def run(checkpoint):
        query = (
            spark.readStream.format("deltalake")
            .load(source)
            .writeStream.format("deltalake")
            .option("checkpointLocation", str(checkpoint))
            .option("app_id", "orders")
            .trigger(availableNow=True)
            .start(target)
        )
        query.awaitTermination(120)
        if query.exception() is not None:
            raise query.exception()

    run(tmp_path / "first")
    with pytest.raises(Exception, match=r"(?s)ConcurrentWriterError.*new checkpoint is a new"):
        run(tmp_path / "second")
    assert ids(target) == list(range(10))


@pytest.mark.spark
def test_special_values_round_trip(spark, tmp_path):
    register(spark)
    uri = str(tmp_path / "values")
    df = spark.sql(
        "SELECT 1L AS `odd name.x`, CAST('NaN' AS DOUBLE) AS f, '' AS s, "
        "TIMESTAMP '9999-12-31 23:59:59.999999' AS ts, DATE '0001-01-01' AS d"
    )
    df.write.format("deltalake").mode("append").save(uri)
    (row,) = read_rows(uri)
    assert row["odd name.x"] == 1 and math.isnan(row["f"]) and row["s"] == ""
    assert row["ts"] == dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)
    assert row["d"] == dt.date(1, 1, 1)


def test_write_options_are_validated_before_anything_is_written():
    options = parse_write_options(
        {"path": "/t", "partitionBy": '["a", "b"]', "txnAppId": "j", "txnVersion": "4"},
        overwrite=False,
    )
    assert options.partition_by == ("a", "b") and (options.app_id, options.txn_version) == ("j", 4)
    assert parse_write_options(
        {"path": "/t", "partitionBy": "a, b"}, overwrite=False
    ).partition_by == ("a", "b")
    for bad, overwrite, message in [
        ({}, False, "needs the table's path"),
        ({"path": "/t", "txnVersion": "1"}, False, "txnAppId and txnVersion go together"),
        (
            {"path": "/t", "txnAppId": "j", "txnVersion": "x"},
            False,
            "txnVersion must be an integer",
        ),
        ({"path": "/t", "mergeSchema": "perhaps"}, False, "mergeSchema must be true or false"),
        ({"path": "/t", "overwriteSchema": "yes"}, False, r'it needs mode\("overwrite"\)'),
        (
            {"path": "/t", "overwriteSchema": "true", "replaceWhere": "a = 1"},
            True,
            "overwriteSchema and replaceWhere cannot go together",
        ),
        ({"path": "/t", "overwriteSchema": "maybe"}, True, "overwriteSchema must be true or"),
        ({"path": "/t", "replaceWhere": "a = 1"}, False, "replaceWhere needs mode"),
        ({"path": "/t", "txnAppId": "a", "app_id": "b"}, False, "not both"),
        ({"path": "/t", "partitionBy": "[1]"}, False, "partitionBy must name columns"),
        ({"path": "/t", "compresion": "zstd"}, False, "own options are path, txnAppId"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            parse_write_options(bad, overwrite=overwrite)


def test_the_arrow_checks_refuse_what_the_table_cannot_hold():
    import datetime as dt_

    import pyarrow as pa

    from committers.delta.format._format_writer import DeltaBatchCheck
    from committers.delta.table._replace_where import ReplaceWhere
    from committers.delta.table._rules import TableShape
    from framework.errors import ConstraintViolationError, NullConstraintError

    schema = pa.schema([("id", pa.int64()), ("day", pa.string()), ("d", pa.date32())])
    shape = TableShape.for_new_table(schema, ["day", "d"])
    where = ReplaceWhere.parse("day = '1'").bind(pa.schema([schema.field("day")]), "t")
    check = DeltaBatchCheck(shape, schema, where, "t")
    ok = pa.record_batch([[1], ["1"], [dt_.date(2026, 1, 1)]], schema=schema)
    assert check(ok).num_rows == 1
    with pytest.raises(ConstraintViolationError, match=r"replaceWhere \(day = '1'\)"):
        check(pa.record_batch([[1], ["2"], [dt_.date(2026, 1, 1)]], schema=schema))
    without_day = pa.schema([("id", pa.int64()), ("d", pa.date32())])
    partial = DeltaBatchCheck(shape, without_day, where, "t")
    with pytest.raises(ConstraintViolationError, match="violated by a row with"):
        partial(pa.record_batch([[1], [dt_.date(2026, 1, 1)]], schema=without_day))
    plain = DeltaBatchCheck(shape, schema, None, "t")
    with pytest.raises(ConstraintViolationError, match="must not hold an empty string"):
        plain(pa.record_batch([[1], [""], [dt_.date(2026, 1, 1)]], schema=schema))
    with pytest.raises(ConstraintViolationError, match="year between 1 and 9999"):
        year_10000 = pa.array([2_932_897], pa.int32()).cast(pa.date32())  # 10000-01-01
        plain(pa.record_batch([pa.array([1]), pa.array(["1"]), year_10000], schema=schema))
    strict = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.string())])
    strict_shape = TableShape.for_new_table(strict, ["day"])
    strict_shape = TableShape(
        type(strict_shape.schema)(
            (
                type(strict_shape.schema.fields[0])("id", "long", False),
                strict_shape.schema.fields[1],
            )
        ),
        strict_shape.partition_by,
        strict_shape.features,
        strict_shape.configuration,
    )
    with pytest.raises(NullConstraintError, match="NOT NULL column 'id'"):
        DeltaBatchCheck(strict_shape, strict, None, "t")(
            pa.record_batch([pa.array([None], pa.int64()), ["1"]], schema=strict)
        )
