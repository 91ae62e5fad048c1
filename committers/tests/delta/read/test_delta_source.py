"""Reading Delta tables: the ``"deltalake"`` Python data source and ``read_table``'s native path.

Every read is compared, as a sorted list of rows, with what delta-rs itself reads
(``DeltaTable(uri, version=...).to_pyarrow_table()``; ``QueryBuilder`` for column mapping,
which ``to_pyarrow_table`` reads as nulls), and every filtered read with Spark filtering
delta-rs's rows. The file-skipping rules and the option checks are unit-tested without Spark.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import math
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.transaction import AddAction

from committers.delta import UnsupportedTableFeatureError, read_table, register
from committers.delta.format._format import DeltaScanReader, parse_options, spark_schema
from committers.delta.read._source import DeltaScan
from committers.delta.storage._storage import TableLocation
from committers.delta.table._rules import TableShape
from committers.delta.table._skipping import FilePruner, Predicate, is_exact
from committers.delta.table._snapshot import (
    LogListing,
    SnapshotSpec,
    check_readable,
    open_snapshot,
    parse_timestamp,
)
from committers.tests._delta_helpers import commit_refused_reader_feature
from framework.errors import ConfigurationError, NotATableError
from framework.source import FileSourceConfig
from framework.spark._source import FILTER_PUSHDOWN_CONF

LONG = "k" * 40  # longer than the 32 characters writers keep of a string bound
T0 = 1_700_000_000  # commit times of the history table: T0, T0 + 100, T0 + 200
UTC = dt.timezone.utc
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("p", pa.string()),
        ("n", pa.int32()),
        ("s", pa.string()),
        ("f", pa.float64()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)


def _table(ids, p, n, s, f) -> pa.Table:
    ts = [
        dt.datetime(2026, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=i, microseconds=7) for i in ids
    ]
    return pa.table([list(ids), p, n, s, f, ts], schema=SCHEMA)


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> str:
    """Three versions, partitioned by a string (with a null and an escaped value) and an int."""
    uri = str(tmp_path_factory.mktemp("read") / "history")
    versions = [
        _table(
            range(0, 4),
            ["a b/c%", None, "x", "x"],
            [1, 1, 2, None],
            [LONG + "a", "y", None, LONG + "b"],
            [1.5, math.nan, None, -2.0],
        ),
        _table(
            range(4, 7), ["x", "z", None], [2, 3, 1], ["yy", LONG + "c", "é"], [math.inf, 0.0, 3.0]
        ),
        _table(range(7, 9), ["z", "a b/c%"], [3, 1], [None, "w"], [math.nan, 2.5]),
    ]
    for version, data in enumerate(versions):
        write_deltalake(uri, data, partition_by=["p", "n"], mode="append" if version else "error")
        stamp = T0 + 100 * version
        os.utime(Path(uri, "_delta_log", f"{version:020d}.json"), (stamp, stamp))
    return uri


def _rows(table) -> list[tuple]:
    """Sorted rows, NaN made comparable."""

    def value(v):
        return "NaN" if isinstance(v, float) and math.isnan(v) else v

    rows = [tuple(value(v) for v in row.values()) for row in pa.table(table).to_pylist()]
    return sorted(rows, key=repr)


def _delta_rs(uri: str, version: int | None = None) -> pa.Table:
    return DeltaTable(uri, version=version).to_pyarrow_table()


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


# -- file skipping, without Spark ---------------------------------------------------------------


def _shape(uri: str) -> TableShape:
    return TableShape.of_table(DeltaTable(uri))


def _keeps(shape: TableShape, predicate: Predicate, **action) -> bool:
    return FilePruner([predicate], shape).keep(action)


def test_string_maxima_are_trusted_only_up_to_their_last_character(history):
    shape = _shape(history)
    prefix = LONG[:32]
    # A writer that truncates the max to a bare prefix: the file holds LONG + "b" > prefix.
    bare = {"min.s": prefix, "max.s": prefix, "null_count.s": 0, "num_records": 2}
    assert _keeps(shape, Predicate("s", "eq", LONG + "b"), **bare)
    assert _keeps(shape, Predicate("s", "gt", LONG), **bare)
    # delta-spark's tie-breaker U+FFFD sorts below non-BMP characters such as an emoji.
    tie = {"min.s": prefix, "max.s": prefix + "\ufffd", "null_count.s": 0, "num_records": 2}
    assert _keeps(shape, Predicate("s", "eq", prefix + "\U0001f600"), **tie)
    assert _keeps(shape, Predicate("s", "starts_with", prefix + "\U0001f600"), **tie)
    # Values provably outside the bounds are skipped.
    assert not _keeps(shape, Predicate("s", "eq", "zzz"), **tie)
    assert not _keeps(shape, Predicate("s", "lt", "a"), **tie)
    assert not _keeps(shape, Predicate("s", "starts_with", "zz"), **tie)
    assert not _keeps(shape, Predicate("s", "starts_with", "a"), **tie)


def test_nan_nulls_and_missing_statistics_never_skip_a_matching_file(history):
    shape = _shape(history)
    floats = {"min.f": 1.0, "max.f": 2.0, "null_count.f": 0, "num_records": 3}
    # Spark sorts NaN above every number, and writers leave NaN out of the bounds.
    assert _keeps(shape, Predicate("f", "gt", 5.0), **floats)
    assert _keeps(shape, Predicate("f", "eq", math.nan), **floats)
    assert not _keeps(shape, Predicate("f", "eq", 5.0), **floats)
    assert not _keeps(shape, Predicate("f", "lt", 1.0), **floats)
    assert _keeps(shape, Predicate("f", "lt", 1.5), **{**floats, "min.f": math.nan})
    # Missing bounds or counts keep the file; known counts decide null tests.
    assert _keeps(shape, Predicate("id", "eq", 99), num_records=3)
    assert _keeps(shape, Predicate("id", "is_null"), num_records=3)
    ints = {"min.id": 1, "max.id": 3, "null_count.id": 0, "num_records": 3}
    assert not _keeps(shape, Predicate("id", "is_null"), **ints)
    assert not _keeps(shape, Predicate("id", "in", (0, 4, None)), **ints)
    assert _keeps(shape, Predicate("id", "in", (0, 3)), **ints)
    all_null = {"min.id": None, "max.id": None, "null_count.id": 3, "num_records": 3}
    assert not _keeps(shape, Predicate("id", "gt", 0), **all_null)
    assert not _keeps(shape, Predicate("id", "is_not_null"), **all_null)
    # A literal of another type, or a negation, is never used to skip.
    assert _keeps(shape, Predicate("id", "eq", "7"), **ints)
    assert _keeps(shape, Predicate("id", "eq", 9, negated=True), **ints)


def test_timestamp_maxima_allow_for_millisecond_truncation(history):
    shape = _shape(history)
    high = dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=UTC)
    stats = {"min.ts": high, "max.ts": high, "null_count.ts": 0, "num_records": 1}
    assert _keeps(shape, Predicate("ts", "gt", high + dt.timedelta(microseconds=500)), **stats)
    assert not _keeps(shape, Predicate("ts", "gt", high + dt.timedelta(milliseconds=1)), **stats)
    naive = dt.datetime(2030, 1, 1)  # not comparable with the column's instants: keep
    assert _keeps(shape, Predicate("ts", "gt", naive), **stats)


def test_partition_predicates_are_exact_in_three_valued_logic(history):
    shape = _shape(history)
    assert not _keeps(shape, Predicate("p", "eq", "x"), **{"partition.p": None})
    assert not _keeps(shape, Predicate("p", "eq", "x", negated=True), **{"partition.p": None})
    assert _keeps(shape, Predicate("p", "is_null"), **{"partition.p": None})
    assert _keeps(shape, Predicate("p", "eq_null_safe", None), **{"partition.p": None})
    assert not _keeps(shape, Predicate("p", "in", ("a", None)), **{"partition.p": "x"})
    assert _keeps(shape, Predicate("n", "ge", 2), **{"partition.n": 3})
    assert not _keeps(shape, Predicate("p", "contains", "/"), **{"partition.p": "x"})
    # Exact (Spark need not evaluate it again): partition columns with a value of their type.
    assert is_exact(Predicate("p", "in", ("x", None)), shape)
    assert is_exact(Predicate("n", "lt", 2), shape)
    assert not is_exact(Predicate("n", "lt", 2.5), shape)
    assert not is_exact(Predicate("s", "eq", "x"), shape)  # a data column: stats only


def test_the_log_listing_knows_the_oldest_version_it_can_rebuild():
    def earliest(commits, checkpoints=()):
        return LogListing(dict.fromkeys(commits, 0.0), frozenset(checkpoints)).earliest

    assert earliest([0, 1, 2]) == 0
    assert earliest([3, 4], [3]) == 3
    assert earliest([4, 5], [3]) == 3
    assert earliest([5, 6], [3]) is None
    assert parse_timestamp("2026-11-21") == dt.datetime(2026, 11, 21, tzinfo=UTC)
    assert parse_timestamp("2026-11-21T10:00:00.5Z") == dt.datetime(
        2026, 11, 21, 10, 0, 0, 500000, tzinfo=UTC
    )


def test_read_options_are_validated_before_anything_is_read(history):
    with pytest.raises(ConfigurationError, match="not both"):
        parse_options({"path": history, "versionAsOf": "1", "timestampAsOf": "2026-01-01"})
    with pytest.raises(ConfigurationError, match=r"maxSplitBytes.*below the floor of 1 MiB"):
        parse_options({"path": history, "maxSplitBytes": "1000"})
    with pytest.raises(ConfigurationError, match="versionAsOf must be an integer"):
        parse_options({"path": history, "versionAsOf": "latest"})
    with pytest.raises(ConfigurationError, match="ISO timestamp"):
        parse_options({"path": history, "timestampAsOf": "yesterday"})
    with pytest.raises(
        ConfigurationError,
        match=r"Did you mean 'versionAsOf' \(not 'versionAsOff'\)\? .*; batch reads take "
        r"versionAsOf, timestampAsOf, filterPushdown and maxSplitBytes",
    ):
        parse_options({"path": history, "versionAsOff": "1"})
    with pytest.raises(ConfigurationError, match="filterPushdown must be true or false"):
        parse_options({"path": history, "filterPushdown": "maybe"})
    with pytest.raises(ConfigurationError, match="needs the table's path"):
        parse_options({})
    assert parse_options({"PATH": history, "FilterPushdown": "TRUE"}).filter_pushdown


def test_bad_tables_and_versions_fail_clearly(history, tmp_path):
    def open_(uri, **spec):
        return open_snapshot(TableLocation.of(uri), SnapshotSpec.of(**spec))

    with pytest.raises(NotATableError, match="not a Delta table"):
        open_(str(tmp_path / "missing"))
    pq.write_table(pa.table({"a": [1]}), tmp_path / "plain.parquet")
    with pytest.raises(NotATableError, match="not a Delta table"):
        open_(str(tmp_path))
    with pytest.raises(
        ConfigurationError, match=r"versionAsOf=9 does not exist.*latest version is 2"
    ):
        open_(history, version=9)
    with pytest.raises(ConfigurationError, match="before the first commit"):
        open_(history, timestamp=dt.datetime.fromtimestamp(T0 - 1, UTC))
    with pytest.raises(ConfigurationError, match="after the latest version"):
        open_(history, timestamp=dt.datetime.fromtimestamp(T0 + 300, UTC))
    assert open_(history, timestamp=dt.datetime.fromtimestamp(T0 + 199, UTC))[1].version == 1

    # Log cleanup: a checkpoint at version 2, commits 0 and 1 gone.
    cleaned = str(tmp_path / "cleaned")
    for i in range(3):
        write_deltalake(cleaned, _table([i], ["x"], [1], ["s"], [1.0]), mode="append")
    DeltaTable(cleaned).create_checkpoint()
    for version in (0, 1):
        os.remove(Path(cleaned, "_delta_log", f"{version:020d}.json"))
    with pytest.raises(ConfigurationError, match=r"no longer available.*earliest version.* is 2"):
        open_(cleaned, version=0)
    with pytest.raises(ConfigurationError, match=r"earliest version still available \(2\)"):
        open_(cleaned, timestamp=dt.datetime(2000, 1, 1))


def _shredded_variant_table(tmp_path) -> str:
    """A table whose protocol needs the reader feature variantShredding-preview (refused)."""
    uri = str(tmp_path / "shredded")
    DeltaTable.create(uri, schema=SCHEMA)
    commit_refused_reader_feature(uri, 1)
    return uri


def test_refused_and_unknown_reader_features(tmp_path):
    uri = _shredded_variant_table(tmp_path)
    with pytest.raises(
        UnsupportedTableFeatureError,
        match="variantShredding-preview: variant columns may be stored shredded",
    ):
        open_snapshot(TableLocation.of(uri), SnapshotSpec())
    with pytest.raises(UnsupportedTableFeatureError, match=r"someFutureFeature.*unknown"):
        check_readable("t", 3, {"columnMapping", "someFutureFeature"})
    with pytest.raises(UnsupportedTableFeatureError, match="reader version 4"):
        check_readable("t", 4, ())


def test_splits_of_max_split_bytes_cover_every_row_once(tmp_path):
    """Planning and reading in-process (no Spark job): four ~0.6 MiB files, 1 MiB splits."""
    import random

    uri = str(tmp_path / "big")
    rng = random.Random(7)
    for part in range(4):
        ids = range(part * 20_000, (part + 1) * 20_000)
        strings = [f"{rng.getrandbits(64):x}" for _ in ids]
        data = _table(
            ids, ["x"] * len(ids), [part] * len(ids), strings, [rng.random() for _ in ids]
        )
        write_deltalake(uri, data, partition_by=["p", "n"], mode="append")
    options = parse_options({"path": uri, "maxSplitBytes": str(1024 * 1024)})
    _, snapshot = open_snapshot(options.location, options.snapshot)
    config = options.config
    reader = DeltaScanReader(spark_schema(snapshot), DeltaScan(snapshot, config=config))
    partitions = reader.partitions()
    assert len(partitions) > 1
    ids = [i for p in partitions for b in reader.read(p) for i in b.column("id").to_pylist()]
    assert sorted(ids) == list(range(80_000))
    assert config == FileSourceConfig(max_split_bytes=1024 * 1024, fetch_size=1)


def test_column_mapping_by_field_id_renames_nested_fields(tmp_path):
    """Planning and reading in-process: mode ``id``, a struct whose field has a physical name."""
    uri = str(tmp_path / "by_id")
    point = pa.struct([("x", pa.int32()), ("label", pa.string())])
    schema = pa.schema([("id", pa.int64()), ("pt", point), ("p", pa.string())])
    DeltaTable.create(
        uri, schema=schema, partition_by=["p"], configuration={"delta.columnMapping.mode": "id"}
    )
    data = pa.table(
        {"id": [1, 2], "pt": [{"x": 5, "label": "a"}, None], "p": ["q", None]}, schema=schema
    )
    write_deltalake(uri, data, mode="append")
    options = parse_options({"path": uri})
    _, snapshot = open_snapshot(options.location, options.snapshot)
    assert snapshot.column_mapping_mode == "id"
    reader = DeltaScanReader(spark_schema(snapshot), DeltaScan(snapshot))
    got = pa.Table.from_batches([b for p in reader.partitions() for b in reader.read(p)])
    expected = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT * FROM t")
    assert _rows(got) == _rows(expected.read_all()) == _rows(data)


# -- through Spark ----------------------------------------------------------------------------

# Each combines several pushed filters: partition columns (exact), strings longer than the
# stats keep, NaN (above every number in Spark), nulls, IN / NOT, LIKE, timestamps.
CONDITIONS = [
    "p = 'x' AND f > 1.0",
    "p IN ('a b/c%', 'z') AND n <> 3 AND s IS NOT NULL",
    f"s > '{LONG}a' AND s LIKE 'k%' AND n IS NOT NULL",
    "f = double('NaN') AND ts < timestamp'2026-01-01 00:00:08'",
    "p IS NULL AND id > 1 AND s IS NULL",
]


@pytest.fixture
def pushdown(spark):
    register(spark)
    before = spark.conf.get(FILTER_PUSHDOWN_CONF, "false")
    spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
    yield spark
    spark.conf.set(FILTER_PUSHDOWN_CONF, before)


@pytest.mark.spark
def test_the_python_source_reads_versions_like_delta_rs(spark, history):
    register(spark)
    latest = spark.read.format("deltalake").load(history)
    assert latest.schema == spark_schema(
        open_snapshot(TableLocation.of(history), SnapshotSpec())[1]
    )
    assert "BatchScan deltalake" in _plan(latest)
    assert _rows(latest.toArrow()) == _rows(_delta_rs(history))
    stamp = dt.datetime.fromtimestamp(T0 + 150, UTC).isoformat()
    second = spark.read.format("deltalake").option("timestampAsOf", stamp).load(history)
    assert _rows(second.toArrow()) == _rows(_delta_rs(history, 1))
    # Without pushdown every file is read and Spark filters: the DataFrame serves any query.
    assert latest.count() == 9


@pytest.mark.spark
def test_pushed_filters_prune_files_and_return_exactly_the_matching_rows(pushdown, history):
    reference = pushdown.createDataFrame(_delta_rs(history))
    # One DataFrame for all: every query pushes filters, so each is planned afresh.
    df = pushdown.read.format("deltalake").option("filterPushdown", True).load(history)
    for condition in CONDITIONS:
        got = df.where(condition)
        assert _rows(got.toArrow()) == _rows(reference.where(condition).toArrow()), condition
    # The partition filter is applied exactly by the pruning, so Spark does not evaluate it
    # again; the one on a data column it does.
    plan = _plan(df.where(CONDITIONS[0]))
    assert "(f#" in plan and "= x)" not in plan


@pytest.mark.spark
def test_spark_still_reuses_a_pushed_down_plan_for_later_queries(pushdown, history):
    """Why filterPushdown is off by default. If this fails, Spark no longer reuses the plan of
    a pushed-down query for a later one without filters: the default can change."""
    df = pushdown.read.format("deltalake").option("filterPushdown", True).load(history)
    assert df.where("p = 'z'").count() == 2
    assert df.count() == 2  # wrong: the table has 9 rows; the plan above is reused


@pytest.mark.spark
def test_read_table_hands_the_files_to_sparks_parquet_reader(spark, history, caplog):
    with caplog.at_level(logging.INFO, logger="committers.delta"):
        df = read_table(spark, history)
    assert "native Parquet scan of 9 files, partition values from the Hive directories" in (
        caplog.text
    )
    assert "FileScan parquet" in _plan(df)
    assert _rows(df.toArrow()) == _rows(_delta_rs(history))
    filtered = df.where("p = 'x' AND n = 2")
    assert "PartitionFilters: [isnotnull(p" in _plan(filtered)
    reference = spark.createDataFrame(_delta_rs(history)).where("p = 'x' AND n = 2")
    assert _rows(filtered.toArrow()) == _rows(reference.toArrow())
    earlier = read_table(spark, history, timestamp=dt.datetime.fromtimestamp(T0 + 50, UTC))
    assert _rows(earlier.toArrow()) == _rows(_delta_rs(history, 0))
    assert _rows(read_table(spark, history, version=1).toArrow()) == _rows(_delta_rs(history, 1))


@pytest.mark.spark
def test_tables_the_sink_staged_with_spark_are_one_hive_partitioned_scan(spark, tmp_path, caplog):
    """Spark staging puts a table's files under batch-<n>-<run>/p=.../n=.../: a directory above
    the partition ones, which ends Spark's partition parsing without adding a column."""
    from pyspark.sql.pandas.types import from_arrow_schema as spark_schema_of

    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    uri = str(tmp_path / "staged")
    rows = _table(
        range(0, 6),
        ["a b/c%", None, "x", "x", "z", "z"],
        [1, 1, 2, None, 3, 3],
        ["s"] * 6,
        [1.0] * 6,
    )
    df = spark.createDataFrame(rows.to_pylist(), schema=spark_schema_of(rows.schema))
    TwoPhaseSink(DeltaSink(uri, partition_by=["p", "n"], staging="spark")).write(df)
    assert all("/batch-" in path for path in DeltaTable(uri).file_uris())
    with caplog.at_level(logging.INFO, logger="committers.delta"):
        native = read_table(spark, uri)
    assert "partition values from the Hive directories" in caplog.text
    assert _plan(native).count("FileScan parquet") == 1
    assert _rows(native.toArrow()) == _rows(_delta_rs(uri))
    assert sorted(r.id for r in native.where("p = 'x' AND n = 2").collect()) == [2]


@pytest.mark.spark
def test_partition_types_spark_cannot_parse_from_directories_come_from_the_log(
    spark, tmp_path, caplog
):
    uri = str(tmp_path / "odd")
    odd = pa.table(
        {
            "id": pa.array([1, 2, 3, 4], pa.int64()),
            "t": pa.array(
                [dt.datetime(2026, 1, 1, 12, 30, tzinfo=UTC), None] * 2,
                pa.timestamp("us", tz="UTC"),
            ),
            "g": pa.array([0.5, math.nan, None, 0.5]),
            "d": pa.array([decimal.Decimal("1.50"), None] * 2, pa.decimal128(5, 2)),
        }
    )
    write_deltalake(uri, odd, partition_by=["t", "g", "d"])
    register(spark)
    with caplog.at_level(logging.INFO, logger="committers.delta"):
        native = read_table(spark, uri)
    assert "4 files, partition values from the log joined by file path" in caplog.text
    assert _plan(native).count("FileScan parquet") == 1  # one scan, whatever the partitions
    python = spark.read.format("deltalake").load(uri)
    expected = _rows(_delta_rs(uri))
    assert _rows(native.toArrow()) == expected
    assert _rows(python.toArrow()) == expected
    condition = "t = timestamp'2026-01-01 12:30:00' AND d IS NOT NULL"
    pruned = native.where(condition)
    assert _rows(pruned.toArrow()) == _rows(python.where(condition).toArrow())


@pytest.mark.spark
def test_truncated_string_statistics_never_hide_a_row(spark, tmp_path):
    """Files whose stats truncate the max to a bare prefix, or end it with delta-spark's
    tie-breaker U+FFFD below an emoji: a filter for the full value still finds it."""
    uri = str(tmp_path / "truncated")
    DeltaTable.create(uri, schema=SCHEMA)
    prefix = LONG[:32]
    values = [LONG + "b", prefix + "\U0001f600"]
    maxima = [prefix, prefix + "\ufffd"]
    actions = []
    for index, (value, maximum) in enumerate(zip(values, maxima, strict=True)):
        name = f"part-{index}.parquet"
        pq.write_table(
            _table([index], ["x"], [1], [value], [1.0]).drop(["p", "n"]), f"{uri}/{name}"
        )
        stats = {
            "numRecords": 1,
            "minValues": {"id": index, "s": prefix},
            "maxValues": {"id": index, "s": maximum},
            "nullCount": {"id": 0, "s": 0},
        }
        actions.append(
            AddAction(name, os.path.getsize(f"{uri}/{name}"), {}, 0, True, json.dumps(stats))
        )
    DeltaTable(uri).create_write_transaction(actions, mode="append", schema=SCHEMA)
    register(spark)
    df = spark.read.format("deltalake").load(uri)
    found = df.where(f"s = '{values[0]}' OR s = '{values[1]}'").select("id")
    assert sorted(r.id for r in found.collect()) == [0, 1]
    assert [r.id for r in df.where(f"s = '{values[1]}'").select("id").collect()] == [1]


@pytest.mark.spark
def test_column_mapped_tables_are_read_by_physical_names(spark, tmp_path, caplog):
    uri = str(tmp_path / "mapped")
    DeltaTable.create(
        uri, schema=SCHEMA, partition_by=["p"], configuration={"delta.columnMapping.mode": "name"}
    )
    write_deltalake(
        uri, _table([1, 2], ["a", None], [1, 2], [LONG, None], [1.0, math.nan]), mode="append"
    )
    write_deltalake(uri, _table([3], ["a"], [None], ["y"], [None]), mode="append")
    files = [p.name for p in Path(uri).rglob("*.parquet")]
    assert files and "s" not in pq.read_schema(next(Path(uri).rglob("*.parquet"))).names

    def expected(version=None):
        table = DeltaTable(uri, version=version)
        return QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()

    with caplog.at_level(logging.INFO, logger="committers.delta"):
        df = read_table(spark, uri)
    assert "Python data source 'deltalake', because the table uses column mapping" in caplog.text
    assert "BatchScan deltalake" in _plan(df)
    assert _rows(df.toArrow()) == _rows(expected())
    assert sorted(r.id for r in df.where("p = 'a' AND s = 'y'").collect()) == [3]
    # read_table pins the version for the Python data source with versionAsOf.
    assert _rows(read_table(spark, uri, version=1).toArrow()) == _rows(expected(1))


@pytest.mark.spark
def test_empty_tables_and_refusals_through_spark(spark, tmp_path):
    uri = str(tmp_path / "empty")
    DeltaTable.create(uri, schema=SCHEMA, partition_by=["p"])
    native = read_table(spark, uri)
    assert native.count() == 0 and native.columns == SCHEMA.names
    register(spark)
    assert spark.read.format("deltalake").load(uri).count() == 0

    shredded = _shredded_variant_table(tmp_path)
    with pytest.raises(UnsupportedTableFeatureError, match="variantShredding-preview"):
        read_table(spark, shredded)
    # Errors raised in Spark's Python workers arrive inside Spark's exception, named.
    with pytest.raises(
        Exception, match=r"(?s)UnsupportedTableFeatureError.*variantShredding-preview"
    ):
        spark.read.format("deltalake").load(shredded)
    with pytest.raises(Exception, match=r"(?s)NotATableError.*is not a Delta table"):
        spark.read.format("deltalake").load(str(tmp_path / "nothing"))
    with pytest.raises(Exception, match=r"(?s)ConfigurationError.*takes its schema from the table"):
        spark.read.format("deltalake").schema("id BIGINT").load(uri).collect()


@pytest.mark.spark
def test_a_table_on_s3_is_read_through_fsspec_by_python_tasks(spark, s3, bucket, caplog):
    uri = f"s3://{bucket}/read/history"
    options = s3.storage_options()
    data = _table(range(3), ["x", None, "x"], [1, 1, 2], [LONG, "y", None], [1.0, math.nan, None])
    write_deltalake(uri, data, partition_by=["p", "n"], storage_options=options)
    with caplog.at_level(logging.INFO, logger="committers.delta"):
        df = read_table(spark, uri, storage_options=options)
    assert "because storage options reach delta-rs and fsspec" in caplog.text
    assert _rows(df.toArrow()) == _rows(data)
