"""Idempotent overwrites: ``DeltaSink(mode="overwrite", replace_where=...)`` replaces the rows
the predicate matches (whole partitions, or rows of data columns by rewriting the files that
hold them), or the whole table, in one transaction carrying the txn."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder, write_deltalake

from committers.delta import DeltaGlobalCommitter, DeltaSink, UnsupportedTableFeatureError
from committers.delta.commit._log_store import LogStore
from committers.delta.table._replace_where import FileClassifier, ReplaceWhere
from committers.delta.table._rules import TableShape
from committers.tests._delta_helpers import (
    committed_files,
    count_table_loads,
    data_files_on_disk,
    files_ever_added,
    read_rows,
    staging_leftovers,
)
from committers.tests._readers import duckdb_rows
from committers.tests._replace_driver import overwrite_evens
from framework import TwoPhaseSink
from framework._crash import CRASH_VARIABLE
from framework.errors import (
    CommitConflictError,
    ConfigurationError,
    ConstraintViolationError,
    DestinationError,
    SchemaMismatchError,
    StagingError,
)

# -- the predicate on its own (no Spark) -------------------------------------------------------


def dt_(day: int) -> datetime.date:
    return datetime.date(2026, 1, day)


PARTITIONS = pa.schema(
    [
        ("day", pa.string()),
        ("n", pa.int32()),
        ("d", pa.date32()),
        ("ok", pa.bool_()),
        ("amount", pa.decimal128(5, 2)),
    ]
)


@pytest.mark.parametrize(
    ("text", "values", "matched"),
    [
        ("day = 'a'", {"day": "a"}, True),
        ("day = 'a'", {"day": "b"}, False),
        ("day = 'a'", {"day": None}, False),  # NULL = 'a' is NULL: not replaced
        ("day != 'a'", {"day": None}, False),
        ("day <> 'a'", {"day": "b"}, True),
        ("day IS NULL", {"day": None}, True),
        ("day is not null", {"day": None}, False),
        ("day in ('a', 'it''s')", {"day": "it's"}, True),
        ("day not in ('a')", {"day": None}, False),
        ("n >= 3 AND n < 5", {"n": 4}, True),
        ("n >= 3 AND n < 5", {"n": 5}, False),
        ("n = '7'", {"n": 7}, True),  # Spark casts the string to the column's type
        ("d = '2026-11-21'", {"d": datetime.date(2026, 11, 21)}, True),
        ("d > DATE '2026-11-21'", {"d": datetime.date(2026, 11, 21)}, False),
        ("ok = true", {"ok": True}, True),
        ("amount = 1.50", {"amount": Decimal("1.50")}, True),
        ("(day = 'a' OR day = 'b') AND n = 1", {"day": "b", "n": 1}, True),
        ("(day = 'a' OR day = 'b') AND n = 1", {"day": "b", "n": 2}, False),
        ("day = 'a' OR n IS NULL", {"day": "c", "n": None}, True),
        ("`Day` = 'a'", {"day": "a"}, True),  # names match ignoring case, as in Spark
        ("NOT day = 'a'", {"day": None}, False),  # NOT NULL is NULL
        ("NOT (day = 'a' OR n = 1)", {"day": "b", "n": 2}, True),
        ("NOT (day = 'a' AND n = 1)", {"day": "a", "n": None}, False),
        ("NOT (day = 'a' AND n = 1)", {"day": "b", "n": None}, True),
        ("NOT n IN (1, 2)", {"n": 3}, True),
        ("NOT day IS NULL", {"day": None}, False),
        ("ok", {"ok": True}, True),  # a boolean column alone
        ("NOT ok", {"ok": None}, False),
        ("day = 'it\\'s'", {"day": "it's"}, True),
    ],
)
def test_replace_where_follows_sql_semantics(text, values, matched) -> None:
    assert ReplaceWhere.parse(text).bind(PARTITIONS, "t").matches(values) is matched


@pytest.mark.parametrize(
    ("text", "error", "message"),
    [
        ("", ConfigurationError, "it is empty"),
        ("day = ", ConfigurationError, "expected a literal"),
        ("day = 'a' AND", ConfigurationError, "expected a column name"),
        ("day = NULL", ConfigurationError, "use IS NULL"),
        ("day LIKE 'a%'", ConfigurationError, "does not parse"),
        ("upper(day) = 'A'", ConfigurationError, "does not parse"),
        ("n + 1 < 10", ConfigurationError, "does not parse"),  # Delta takes any expression
        ("id = 3", SchemaMismatchError, "'id', which is not a column of t"),
        ("day = 3", ConfigurationError, "3 is not a string literal"),
        ("n = 'x'", ConfigurationError, "'x' is not a valid value"),
        ("n = 1.5", ConfigurationError, "'1.5' is not a valid value"),
        ("n = 99999999999999999999", ConfigurationError, "outside the range of a long"),
        ("d = '2026-13-01'", ConfigurationError, "is not a valid value"),
        ("d = '20261121'", ConfigurationError, "not a date written YYYY-MM-DD"),
        ("day = 'a\\nb'", ConfigurationError, r"escape \\n in .* is not supported"),
        ("n", ConfigurationError, "not boolean, so it cannot stand alone"),
    ],
)
def test_replace_where_refuses_what_it_cannot_evaluate_exactly(text, error, message) -> None:
    with pytest.raises(error, match=message):
        ReplaceWhere.parse(text).bind(PARTITIONS, "t")


def test_replace_where_refuses_column_types_it_cannot_compare_exactly() -> None:
    schema = pa.schema([("at", pa.timestamp("us", "UTC")), ("x", pa.float64())])
    with pytest.raises(ConfigurationError, match="only string, integer, decimal, date"):
        ReplaceWhere.parse("at = '2026-01-01 00:00:00'").bind(schema, "t")
    with pytest.raises(ConfigurationError, match="column 'x' is double; only string"):
        ReplaceWhere.parse("x > 1").bind(schema, "t")


def test_files_are_classified_by_partition_values_and_stats() -> None:
    """None of a file's rows can match (partition value or stats rule it out), all must
    (a conjunction on partition columns alone is TRUE), or maybe some."""
    schema = pa.schema([("id", pa.int64()), ("day", pa.string()), ("ok", pa.bool_())])
    shape = TableShape.for_new_table(schema, ["day"])

    def outcome(text: str, day: str | None, low: object, high: object, nulls: int = 0) -> str:
        where = ReplaceWhere.parse(text).bind(schema, "t", ["day"])
        action = {
            "partition.day": day,
            "num_records": 3,
            "min.ok": low,
            "max.ok": high,
            "null_count.ok": nulls,
        }
        return FileClassifier(where, shape)(action)

    assert outcome("day = 'd1'", "d1", False, True) == "all"
    assert outcome("day = 'd1'", None, False, True) == "none"  # NULL = 'd1' is not TRUE
    assert outcome("ok = true", "d1", False, False, nulls=1) == "none"  # stats: no TRUE
    assert outcome("ok = true", "d1", True, True) == "some"  # only partition values prove all
    assert outcome("ok = true", "d1", None, None) == "some"  # no stats
    assert outcome("day = 'd1' AND ok", "d2", True, True) == "none"
    assert outcome("day = 'd1' OR ok", "d2", False, True) == "some"
    assert outcome("day = 'd1' OR ok", "d1", False, False) == "all"
    assert outcome("ok IS NULL", "d1", True, True, nulls=0) == "none"


@pytest.mark.parametrize(
    "text",
    [
        "is_even = true",
        "NOT is_even",
        "is_even IS NULL OR n >= 3",
        "n IN (1, 4) AND s <> 'b'",
        "n NOT IN (2)",
        "d < DATE '2026-01-03' OR amount > 1.005",
        "s >= 'b' AND s < 'é'",
        "NOT (s = 'it''s' OR is_even)",
    ],
)
def test_spark_and_pyarrow_evaluate_the_predicate_alike(spark, text) -> None:
    """The rows Spark admits (the written rows' check, the Spark rewrite's filter) are the
    rows pyarrow finds TRUE (the Python rewrite, the format writer), NULLs included."""
    rows = pa.table(
        {
            "n": pa.array([1, 2, 3, 4, None, 5], pa.int32()),
            "s": ["a", "b", "it's", None, "é", "c"],
            "is_even": [False, True, None, True, False, None],
            "d": pa.array([dt_(1), dt_(2), dt_(3), None, dt_(4), dt_(1)], pa.date32()),
            "amount": pa.array(
                [Decimal(a) if a else None for a in ("1.00", None, "1.01", "2.50", "0.10", "1")],
                pa.decimal128(5, 2),
            ),
        }
    )
    where = ReplaceWhere.parse(text).bind(rows.schema, "t")
    by_arrow = where.mask(rows).to_pylist()
    by_python = [where.matches(row) for row in rows.to_pylist()]
    flagged = spark.createDataFrame(rows).selectExpr(f"coalesce(({where.sql()}), false) AS hit")
    by_spark = [row.hit for row in flagged.collect()]
    assert by_arrow == by_python == by_spark


# -- on Spark ----------------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[4]


def _rows(spark, ids, day):
    return spark.createDataFrame([(i, day) for i in ids], "id long, day string")


def _table(tmp_path: Path) -> str:
    """A table of three partitions (d1, d2 and the null partition) made by delta-rs."""
    uri = str(tmp_path / "t")
    write_deltalake(
        uri,
        pa.table(
            {
                "id": pa.array([1, 2, 3, 4, 5], pa.int64()),
                "day": ["d1", "d1", "d2", None, "d2"],
            }
        ),
        partition_by=["day"],
    )
    return uri


def _expect(uri: str, rows: list[tuple[int, str | None]]) -> None:
    """The table holds exactly ``rows``, read by deltalake and by DuckDB."""
    expected = sorted(rows, key=lambda r: r[0])
    assert [(r["id"], r["day"]) for r in sorted(read_rows(uri), key=lambda r: r["id"])] == expected
    duck = sorted((r["id"], r["day"]) for r in duckdb_rows(uri))
    assert duck == expected


def _last_commit(uri: str) -> list[dict]:
    newest = sorted((Path(uri) / "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in newest.read_text().splitlines()]


def test_replace_where_replaces_the_matching_partition_once(spark, tmp_path) -> None:
    uri = _table(tmp_path)
    d1_files = {f for f in committed_files(uri) if f.startswith("day=d1/")}
    sink = TwoPhaseSink(
        DeltaSink(uri, app_id="daily", mode="overwrite", replace_where="day = 'd1'")
    )
    metrics = sink.write(_rows(spark, [10, 11, 12], "d1"), epoch_id=1)
    assert metrics.status == "committed"
    _expect(uri, [(3, "d2"), (4, None), (5, "d2"), (10, "d1"), (11, "d1"), (12, "d1")])
    actions = _last_commit(uri)
    assert {a["remove"]["path"] for a in actions if "remove" in a} == d1_files
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    # As delta-spark and delta-rs record a replaceWhere: a WRITE in mode Overwrite.
    assert info["operation"] == "WRITE"
    assert info["operationParameters"]["mode"] == "Overwrite"
    assert info["operationParameters"]["predicate"] == "day = 'd1'"
    assert info["isBlindAppend"] is False
    assert info["operationMetrics"]["numRemovedFiles"] == str(len(d1_files))
    assert next(a["txn"] for a in actions if "txn" in a) == {"appId": "daily:write", "version": 1}
    assert DeltaTable(uri, version=0).to_pyarrow_table().num_rows == 5  # history readable

    version = DeltaTable(uri).version()
    rerun = TwoPhaseSink(
        DeltaSink(uri, app_id="daily", mode="overwrite", replace_where="day = 'd1'")
    )
    assert rerun.write(_rows(spark, [10, 11, 12], "d1"), epoch_id=1).status == "skipped"
    assert DeltaTable(uri).version() == version
    _expect(uri, [(3, "d2"), (4, None), (5, "d2"), (10, "d1"), (11, "d1"), (12, "d1")])
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []


def test_replace_where_on_the_null_partition_and_a_new_table(spark, tmp_path) -> None:
    uri = _table(tmp_path)
    sink = DeltaSink(uri, app_id="nulls", mode="overwrite", replace_where="day IS NULL")
    TwoPhaseSink(sink).write(_rows(spark, [40], None), epoch_id=1)
    _expect(uri, [(1, "d1"), (2, "d1"), (3, "d2"), (5, "d2"), (40, None)])
    info = next(a["commitInfo"] for a in _last_commit(uri) if "commitInfo" in a)
    assert info["operationParameters"]["mode"] == "Overwrite"
    assert [a["remove"]["path"] for a in _last_commit(uri) if "remove" in a] == [
        p for p in files_ever_added(uri) if p.startswith("day=__HIVE_DEFAULT_PARTITION__/")
    ]

    fresh = str(tmp_path / "fresh")
    new = DeltaSink(fresh, partition_by=["day"], mode="overwrite", replace_where="day = 'd9'")
    TwoPhaseSink(new).write(_rows(spark, [1, 2], "d9"))
    _expect(fresh, [(1, "d9"), (2, "d9")])


def test_a_partition_predicate_matching_no_file_only_adds_and_is_recorded_as_overwrite(
    spark, tmp_path
) -> None:
    uri = _table(tmp_path)
    sink = DeltaSink(uri, mode="overwrite", replace_where="day = 'd7'")
    TwoPhaseSink(sink).write(_rows(spark, [70], "d7"))
    _expect(uri, [(1, "d1"), (2, "d1"), (3, "d2"), (4, None), (5, "d2"), (70, "d7")])
    actions = _last_commit(uri)
    assert not [a for a in actions if "remove" in a]
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operationParameters"]["mode"] == "Overwrite"
    assert info["operationParameters"]["predicate"] == "day = 'd7'"


def test_an_overwrite_removing_other_files_than_selected_is_reported(
    spark, tmp_path, monkeypatch
) -> None:
    """The removes of an overwrite recorded as mode Overwrite are derived by delta-rs from
    partition filters; were they to select more than the replace_where (simulated with a
    filter that also names d2), the write fails loudly, naming the file, instead of losing
    its rows silently; they can be read back from the previous version."""
    uri = _table(tmp_path)
    d2_files = sorted(f for f in committed_files(uri) if f.startswith("day=d2/"))

    def too_wide(self, table, removed):  # type: ignore[no-untyped-def]
        return [("day", "in", ["d1", "d2"])]

    monkeypatch.setattr(DeltaGlobalCommitter, "_overwrite_filters", too_wide)
    sink = TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="day = 'd1'"))
    with pytest.raises(DestinationError, match="removed other files") as caught:
        sink.write(_rows(spark, [10], "d1"))
    assert d2_files[0] in str(caught.value)
    before = DeltaTable(uri, version=DeltaTable(uri).version() - 1).to_pyarrow_table()
    assert sorted(before.column("id").to_pylist()) == [1, 2, 3, 4, 5]


def test_a_row_outside_replace_where_fails_the_write_with_nothing_committed(
    spark, tmp_path
) -> None:
    uri = _table(tmp_path)
    before = DeltaTable(uri).version()
    sink = TwoPhaseSink(
        DeltaSink(uri, app_id="daily", mode="overwrite", replace_where="day = 'd1'")
    )
    rows = _rows(spark, [10, 11], "d1").union(_rows(spark, [12], "d2"))
    with pytest.raises(ConstraintViolationError, match=r"replace_where \(day = 'd1'\)") as caught:
        sink.write(rows, epoch_id=1)
    assert "d2" in str(caught.value) and "widen replace_where" in str(caught.value)
    assert DeltaTable(uri).version() == before
    _expect(uri, [(1, "d1"), (2, "d1"), (3, "d2"), (4, None), (5, "d2")])
    assert data_files_on_disk(uri) == committed_files(uri)
    assert staging_leftovers(uri) == []


def test_overwrite_without_replace_where_replaces_the_table(spark, tmp_path) -> None:
    uri = _table(tmp_path)
    sink = TwoPhaseSink(DeltaSink(uri, app_id="full", mode="overwrite"))
    sink.write(_rows(spark, [7, 8], "d3"), epoch_id=3)
    _expect(uri, [(7, "d3"), (8, "d3")])
    assert DeltaTable(uri, version=0).to_pyarrow_table().num_rows == 5
    assert sink.write(_rows(spark, [7, 8], "d3"), epoch_id=3).status == "skipped"
    _expect(uri, [(7, "d3"), (8, "d3")])


@pytest.mark.parametrize("replace_where", [None, "day = 'd1'", "id > 1"])
def test_an_overwrite_loads_the_table_once(spark, tmp_path, monkeypatch, replace_where) -> None:
    """A (re)started overwrite opens the table once and refreshes it once for its batch (its
    rewrite of the files holding matching rows, if any, plans on that same snapshot); nothing
    reads the log back after the commit (it lands right on top of the snapshot or fails)."""
    uri = _table(tmp_path)
    rows = _rows(spark, [7, 8], "d1")
    loads = count_table_loads(monkeypatch)
    sink = DeltaSink(uri, app_id="full", mode="overwrite", replace_where=replace_where)
    assert TwoPhaseSink(sink).write(rows, epoch_id=3).status == "committed"
    assert loads == {"is_deltatable": 1, "open": 1, "update_incremental": 1}
    monkeypatch.undo()
    kept = {None: [], "day = 'd1'": [(3, "d2"), (4, None), (5, "d2")], "id > 1": [(1, "d1")]}
    _expect(uri, [*kept[replace_where], (7, "d1"), (8, "d1")])


def test_a_concurrent_append_is_never_left_behind_nor_overwritten_unseen(
    spark, tmp_path, monkeypatch
) -> None:
    """Another writer appends to the replaced partition and to another one after the
    overwrite read its snapshot: the commit is redone on the newer snapshot (its files are
    not staged again), so the partition holds exactly the overwrite's rows, as if the append
    had come first, and the other partition keeps the appended row."""
    uri = _table(tmp_path)
    original = DeltaTable.create_write_transaction
    calls: list[int] = []

    def append_first(self, actions, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(len(actions))
        if len(calls) == 1:
            concurrent = pa.table({"id": pa.array([90, 91], pa.int64()), "day": ["d1", "d2"]})
            write_deltalake(uri, concurrent, mode="append", partition_by=["day"])
        return original(self, actions, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", append_first)
    sink = TwoPhaseSink(
        DeltaSink(uri, app_id="daily", mode="overwrite", replace_where="day = 'd1'")
    )
    sink.write(_rows(spark, [10], "d1"), epoch_id=1)
    assert len(calls) == 2  # redone on the newer snapshot, now removing the new d1 file too
    removed = {a["remove"]["path"] for a in _last_commit(uri) if "remove" in a}
    assert len(removed) == 2 and all(path.startswith("day=d1/") for path in removed)
    _expect(uri, [(3, "d2"), (4, None), (5, "d2"), (10, "d1"), (91, "d2")])


def test_overwrite_is_for_bounded_writes_and_replace_where_needs_it(spark, tmp_path) -> None:
    uri = _table(tmp_path)
    stream = spark.readStream.format("rate").load()
    sink = TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="day = 'd1'"))
    with pytest.raises(ConfigurationError, match="writes bounded DataFrames only"):
        sink.write_stream(stream, checkpoint_location=str(tmp_path / "chk"))
    assert not spark.streams.active
    with pytest.raises(ConfigurationError, match="replace_where needs mode='overwrite'"):
        DeltaSink(uri, replace_where="day = 'd1'")
    with pytest.raises(ConfigurationError, match="mode must be 'append', 'overwrite' or 'upsert'"):
        DeltaSink(uri, mode="merge")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="use mode='overwrite', replace_where="):
        DeltaSink(uri, replaceWhere="day = 'd1'")
    with pytest.raises(SchemaMismatchError, match="'nope', which is not a column of"):
        TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="nope = 1")).write(
            _rows(spark, [1], "d1")
        )
    assert DeltaTable(uri).version() == 0


def test_partition_values_that_need_escaping_are_replaced_exactly(spark, tmp_path) -> None:
    """delta-rs logs partition directories URL-encoded and re-encodes every path it is given
    in a remove: the removes must name the files so that they match."""
    uri = str(tmp_path / "t")
    days = ["a b", "x%y", "é+ü", "k=v:w", "plain"]
    write_deltalake(
        uri,
        pa.table({"id": pa.array(range(len(days)), pa.int64()), "day": days}),
        partition_by=["day"],
    )
    sink = DeltaSink(uri, mode="overwrite", replace_where="day IN ('a b', 'x%y', 'é+ü', 'k=v:w')")
    TwoPhaseSink(sink).write(
        spark.createDataFrame([(10 + i, d) for i, d in enumerate(days[:4])], "id long, day string")
    )
    _expect(uri, [(4, "plain"), (10, "a b"), (11, "x%y"), (12, "é+ü"), (13, "k=v:w")])


def test_a_file_another_writer_logged_in_a_foreign_encoding_is_refused(spark, tmp_path) -> None:
    """delta-rs re-encodes a remove's path; a file whose logged spelling it cannot reproduce
    would stay in the replaced partition, so the overwrite is refused, nothing committed."""
    uri = _table(tmp_path)
    foreign = Path(uri) / "day=é" / "f+é.parquet"
    foreign.parent.mkdir()
    pq.write_table(pa.table({"id": pa.array([7], pa.int64())}), foreign)
    add = {
        "path": "day=é/f+é.parquet",  # delta-rs would write day=%C3%A9/f+%C3%A9.parquet
        "partitionValues": {"day": "é"},
        "size": foreign.stat().st_size,
        "modificationTime": 0,
        "dataChange": True,
    }
    (Path(uri) / "_delta_log" / f"{1:020d}.json").write_text(
        json.dumps({"commitInfo": {"operation": "WRITE"}}) + "\n" + json.dumps({"add": add}) + "\n",
        encoding="utf-8",
    )
    sink = TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="day = 'é'"))
    with pytest.raises(UnsupportedTableFeatureError, match="URL encoding delta-rs cannot write"):
        sink.write(_rows(spark, [8], "é"))
    assert DeltaTable(uri).version() == 1
    assert staging_leftovers(uri) == []
    _expect(uri, [(1, "d1"), (2, "d1"), (3, "d2"), (4, None), (5, "d2"), (7, "é")])


# -- replace_where on data columns: the files holding matching rows are rewritten ---------------

EVEN = pa.schema([("id", pa.int64()), ("is_even", pa.bool_()), ("s", pa.string())])


def _even_table(tmp_path: Path, *, vectors: bool = False) -> tuple[str, dict[str, str]]:
    """An unpartitioned table of four files made by delta-rs: only odd rows, only even rows,
    both, and odd rows with a NULL ``is_even``; and the files by that name. ``vectors``: the
    table enables deletion vectors (an overwrite marks rows instead of rewriting files)."""
    uri = str(tmp_path / "even")
    configuration = {"delta.enableDeletionVectors": "true"} if vectors else None
    files = {
        "odd": [(1, False), (3, False), (5, False)],
        "even": [(2, True), (4, True)],
        "mixed": [(6, True), (7, False)],
        "nulls": [(8, None), (9, False)],
    }
    names = {}
    for name, rows in files.items():
        table = pa.table(
            {
                "id": [r[0] for r in rows],
                "is_even": [r[1] for r in rows],
                "s": [f"s{r[0]}" for r in rows],
            },
            schema=EVEN,
        )
        write_deltalake(uri, table, mode="append", configuration=configuration)
        (names[name],) = set(committed_files(uri)) - set(names.values())
    return uri, names


def _even_rows(spark, ids):
    return spark.createDataFrame(
        [(i, None if i is None else i % 2 == 0, f"new{i}") for i in ids],
        "id long, is_even boolean, s string",
    )


def _expect_even(uri: str, rows: list[tuple[int, bool | None, str]]) -> None:
    """The table holds exactly ``rows`` (id, is_even, s), by deltalake (DataFusion: its
    pyarrow dataset refuses deletion vectors) and by DuckDB."""
    expected = sorted(rows)

    def key(r):
        return (r["id"], r["is_even"], r["s"])

    by_datafusion = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT * FROM t")
    assert sorted(key(r) for r in pa.table(by_datafusion.read_all()).to_pylist()) == expected
    assert sorted(key(r) for r in duckdb_rows(uri)) == expected


def _adds(uri: str, version: int) -> list[dict]:
    """The add actions of ``version``'s commit."""
    path = Path(uri, "_delta_log", f"{version:020d}.json")
    actions = [json.loads(line) for line in path.read_text().splitlines()]
    return [a["add"] for a in actions if "add" in a]


OLD_ROWS_KEPT = [
    (1, False, "s1"),
    (3, False, "s3"),
    (5, False, "s5"),
    (7, False, "s7"),
    (8, None, "s8"),
    (9, False, "s9"),
]


@pytest.mark.parametrize("staging", ["auto", "spark"])
def test_replace_where_on_a_data_column_rewrites_only_the_files_holding_matching_rows(
    spark, tmp_path, staging
) -> None:
    """DeltaSuite's "valid replaceWhere" on a data column: the even rows are replaced, the odd
    rows and the row whose is_even is NULL stay; a file without a matching row (by its stats)
    is untouched, a file of matching rows only leaves no file, a mixed file is rewritten with
    its odd row. A replay of the epoch is skipped."""
    uri, files = _even_table(tmp_path)
    sink = DeltaSink(
        uri, app_id="evens", mode="overwrite", replace_where="is_even = true", staging=staging
    )
    metrics = TwoPhaseSink(sink).write(_even_rows(spark, [10, 12]), epoch_id=1)
    assert metrics.status == "committed"
    _expect_even(uri, [*OLD_ROWS_KEPT, (10, True, "new10"), (12, True, "new12")])
    actions = _last_commit(uri)
    assert {a["remove"]["path"] for a in actions if "remove" in a} == {
        files["even"],
        files["mixed"],
    }
    live = committed_files(uri)
    assert files["odd"] in live and files["nulls"] in live  # never rewritten
    kept = [a["add"] for a in actions if "add" in a and "-rewrite0/" in a["add"]["path"]]
    assert [json.loads(a["stats"])["numRecords"] for a in kept] == [1]  # row 7, rewritten
    info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
    assert info["operation"] == "WRITE"
    assert info["operationParameters"]["predicate"] == "is_even = true"
    # Part of the table was rewritten: delta-rs 1.6 takes explicit removes in an append only.
    assert info["operationParameters"]["mode"] == "Append"
    assert info["operationMetrics"]["numCopiedRows"] == "1"  # row 7
    assert info["operationMetrics"]["numDeletedRows"] == "3"  # rows 2, 4, 6
    assert info["operationMetrics"]["numRemovedFiles"] == "2"
    assert next(a["txn"] for a in actions if "txn" in a) == {"appId": "evens:write", "version": 1}
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []

    version = DeltaTable(uri).version()
    rerun = TwoPhaseSink(
        DeltaSink(uri, app_id="evens", mode="overwrite", replace_where="is_even = true")
    )
    assert rerun.write(_even_rows(spark, [10, 12]), epoch_id=1).status == "skipped"
    assert DeltaTable(uri).version() == version
    _expect_even(uri, [*OLD_ROWS_KEPT, (10, True, "new10"), (12, True, "new12")])
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []


def test_replace_where_marks_rows_in_vectors_without_spark(tmp_path) -> None:
    """On a table that enables deletion vectors, the rewrite of an overwrite run without Spark
    (the ``"deltalake"`` format commits in a Python worker) marks the matching rows instead of
    rewriting files: the mixed file is added back with a vector deleting its even row (its
    first), the file of even rows only is removed whole, the others are left alone, and no data
    file is written; with ``deletion_vectors="off"`` the mixed file is rewritten."""
    from committers.delta.spark._replace_rewrite import replace_rows
    from committers.delta.storage._storage import TableLocation
    from committers.delta.table._deletion_vectors import deleted_rows
    from committers.delta.write._options import WriterOptions
    from framework.sink import Epoch

    uri, files = _even_table(tmp_path, vectors=True)
    location = TableLocation.of(uri)
    epoch = Epoch(app_id="evens", epoch_id=1, writer_identity="w", run_id="r1")
    where = ReplaceWhere.parse("is_even = true")
    kwargs = {"attempt": 0, "staging": "auto", "session": None}
    staged, rewrite = replace_rows(
        location, DeltaTable(uri), where, WriterOptions(), epoch, **kwargs
    )
    assert staged == []
    assert {f.logged_path for f in rewrite.replaced} == {files["even"], files["mixed"]}
    assert rewrite.unchanged == ()  # (the odd and NULL files: not read, by their stats)
    (marked,) = rewrite.marked
    assert marked.path == files["mixed"] and marked.vector.cardinality == 1
    assert deleted_rows(marked.vector, location, marked.path).tolist() == [0]  # row 6
    assert json.loads(marked.stats) == {**_stats_of(uri, files["mixed"]), "tightBounds": False}
    assert rewrite.metrics["numDeletedRows"] == 3 and rewrite.metrics["numCopiedRows"] == 0

    staged, rewrite = replace_rows(
        location, DeltaTable(uri), where, WriterOptions(), epoch, **kwargs, deletion_vectors="off"
    )
    assert not rewrite.marked and [f.num_records for f in staged] == [1]  # row 7


def _stats_of(uri: str, path: str) -> dict:
    """The stats the add of live file ``path`` logs (tables without checkpoints)."""
    (stats,) = [
        json.loads(a["stats"])
        for v in range(DeltaTable(uri).version() + 1)
        for a in _adds(uri, v)
        if a["path"] == path
    ]
    return stats


def test_a_new_row_the_data_predicate_does_not_hold_for_commits_nothing(spark, tmp_path) -> None:
    """A new row for which the predicate is FALSE, or NULL (Delta's constraint on the written
    rows fails on NULL too), fails the write before anything is rewritten or committed."""
    uri, _ = _even_table(tmp_path)
    before = DeltaTable(uri).version()
    for bad, shown in (((11, False), "is_even = false"), ((13, None), "is_even = NULL")):
        rows = spark.createDataFrame(
            [(10, True, "new10"), (*bad, "bad")], "id long, is_even boolean, s string"
        )
        sink = TwoPhaseSink(
            DeltaSink(uri, app_id="evens", mode="overwrite", replace_where="is_even = true")
        )
        with pytest.raises(
            ConstraintViolationError, match=r"replace_where \(is_even = true\)"
        ) as e:
            sink.write(rows, epoch_id=1)
        assert shown in str(e.value)
        assert DeltaTable(uri).version() == before
        assert data_files_on_disk(uri) == committed_files(uri) and staging_leftovers(uri) == []
    _expect_even(uri, [*OLD_ROWS_KEPT, (2, True, "s2"), (4, True, "s4"), (6, True, "s6")])


def test_a_data_predicate_matching_no_row_only_adds_the_new_rows(spark, tmp_path) -> None:
    uri, _ = _even_table(tmp_path)
    old = [*OLD_ROWS_KEPT, (2, True, "s2"), (4, True, "s4"), (6, True, "s6")]
    sink = DeltaSink(uri, mode="overwrite", replace_where="is_even AND id > 100")
    TwoPhaseSink(sink).write(_even_rows(spark, [102]))
    _expect_even(uri, [*old, (102, True, "new102")])
    actions = _last_commit(uri)
    assert not [a for a in actions if "remove" in a]
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []


def test_replace_where_on_the_null_rows_of_a_data_column(spark, tmp_path) -> None:
    uri, files = _even_table(tmp_path)
    sink = DeltaSink(uri, mode="overwrite", replace_where="is_even IS NULL")
    new = spark.createDataFrame([(80, None, "new80")], "id long, is_even boolean, s string")
    TwoPhaseSink(sink).write(new)
    kept = [r for r in OLD_ROWS_KEPT if r[0] != 8]
    _expect_even(
        uri, [*kept, (2, True, "s2"), (4, True, "s4"), (6, True, "s6"), (80, None, "new80")]
    )
    removed = {a["remove"]["path"] for a in _last_commit(uri) if "remove" in a}
    assert removed == {files["nulls"]}  # the only file with a null is_even (by its stats)


DAYS = pa.schema([("id", pa.int64()), ("day", pa.string()), ("is_even", pa.bool_())])


def _days_table(tmp_path: Path) -> str:
    uri = str(tmp_path / "days")
    write_deltalake(
        uri,
        pa.table(
            {
                "id": [1, 2, 3, 4, 5, 6],
                "day": ["d1", "d1", "d2", "d2", "d3", "d3"],
                "is_even": [False, True, False, True, False, True],
            },
            schema=DAYS,
        ),
        partition_by=["day"],
    )
    return uri


@pytest.mark.parametrize("staging", ["auto", "spark"])
def test_a_mixed_predicate_removes_whole_partitions_unread_and_rewrites_the_rest(
    spark, tmp_path, staging
) -> None:
    """ "day = 'd1' OR (day = 'd2' AND is_even)": d1's file holds only matching rows by its
    partition value, so it is removed without being read (it is damaged here, and the
    overwrite still succeeds); d2's file is rewritten with its odd row; d3 is untouched.
    The removed files are whole partitions, so delta-rs's overwrite removes them and the
    history records mode Overwrite."""
    uri = _days_table(tmp_path)
    (d1_file,) = [f for f in committed_files(uri) if f.startswith("day=d1/")]
    (Path(uri) / d1_file).write_bytes(b"not parquet")  # any read of it would fail
    rows = spark.createDataFrame(
        [(7, "d1", False), (8, "d2", True)], "id long, day string, is_even boolean"
    )
    where = "day = 'd1' OR (day = 'd2' AND is_even)"
    sink = DeltaSink(uri, app_id="mixed", mode="overwrite", replace_where=where, staging=staging)
    TwoPhaseSink(sink).write(rows, epoch_id=5)
    expected = [
        (3, "d2", False),
        (5, "d3", False),
        (6, "d3", True),
        (7, "d1", False),
        (8, "d2", True),
    ]
    assert sorted((r["id"], r["day"], r["is_even"]) for r in read_rows(uri)) == expected
    assert sorted((r["id"], r["day"], r["is_even"]) for r in duckdb_rows(uri)) == expected
    info = next(a["commitInfo"] for a in _last_commit(uri) if "commitInfo" in a)
    assert info["operationParameters"]["mode"] == "Overwrite"
    assert info["operationParameters"]["predicate"] == where
    removed = {a["remove"]["path"] for a in _last_commit(uri) if "remove" in a}
    assert {p.split("/")[0] for p in removed} == {"day=d1", "day=d2"} and len(removed) == 2
    assert staging_leftovers(uri) == []


def test_a_concurrent_append_of_matching_rows_is_read_again_once_then_fails(
    spark, tmp_path, monkeypatch
) -> None:
    """Another writer appends a file that may hold matching rows after the overwrite read
    its snapshot: the rewrite is computed again on the newer snapshot, so that file's even
    row is replaced too (as if it had come first) and its odd row kept; an append of a file
    without a matching row (pruned by its stats) costs only a commit attempt. If a matching
    file arrives again after the second computation, the write fails, nothing committed."""
    uri, _ = _even_table(tmp_path)
    original = DeltaTable.create_write_transaction
    appended: list[int] = []

    def append_first(self, actions, *args, **kwargs):  # type: ignore[no-untyped-def]
        if len(appended) < 2:
            rows = [(90 + len(appended), False, "odd")]
            if len(appended) == 1:
                rows.append((100, True, "even"))
            write_deltalake(
                uri,
                pa.table(
                    {
                        "id": [r[0] for r in rows],
                        "is_even": [r[1] for r in rows],
                        "s": [r[2] for r in rows],
                    },
                    schema=EVEN,
                ),
                mode="append",
            )
            appended.append(len(rows))
        return original(self, actions, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", append_first)
    sink = TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="is_even = true"))
    sink.write(_even_rows(spark, [10]))
    assert appended == [1, 2]  # an odd-only file (no redo), then a file with an even row
    _expect_even(
        uri,
        [*OLD_ROWS_KEPT, (10, True, "new10"), (90, False, "odd"), (91, False, "odd")],
    )
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []

    def always_append(self, actions, *args, **kwargs):  # type: ignore[no-untyped-def]
        table = pa.table({"id": [200], "is_even": [True], "s": ["late"]}, schema=EVEN)
        write_deltalake(uri, table, mode="append")
        return original(self, actions, *args, **kwargs)

    monkeypatch.setattr(DeltaTable, "create_write_transaction", always_append)
    before = DeltaTable(uri).version()
    with pytest.raises(CommitConflictError, match="computed again on the newer snapshot"):
        TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="is_even = true")).write(
            _even_rows(spark, [20])
        )
    monkeypatch.setattr(DeltaTable, "create_write_transaction", original)
    table = DeltaTable(uri)
    assert table.version() == before + 2  # the two late appends, nothing of the overwrite
    assert 20 not in {r["id"] for r in read_rows(uri)}
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []


@pytest.mark.parametrize(
    ("configuration", "problem"),
    [
        ({"delta.appendOnly": "true"}, "it is append-only"),
        # (on storage the sink's log writer cannot commit to: gs://, az://)
        ({"delta.enableDeletionVectors": "true"}, "it uses deletion vectors"),
    ],
)
def test_tables_whose_rows_a_rewrite_would_break_are_refused_for_data_predicates(
    spark, tmp_path, monkeypatch, configuration, problem
) -> None:
    monkeypatch.setattr(LogStore, "supports", staticmethod(lambda location: False))
    uri = str(tmp_path / "t")
    write_deltalake(
        uri,
        pa.table({"id": [1, 2], "is_even": [False, True], "s": ["a", "b"]}, schema=EVEN),
        configuration=configuration,
    )
    sink = TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="is_even = true"))
    with pytest.raises(UnsupportedTableFeatureError, match=problem):
        sink.write(_even_rows(spark, [4]))
    assert DeltaTable(uri).version() == 0
    assert data_files_on_disk(uri) == committed_files(uri) and staging_leftovers(uri) == []


@pytest.mark.parametrize("staging", ["auto", "spark"])
def test_a_file_to_rewrite_that_is_gone_fails_the_overwrite_with_nothing_committed(
    spark, tmp_path, staging
) -> None:
    """A file that may hold matching rows cannot be read (deleted by a VACUUM with too
    short a retention, say): the overwrite fails, nothing committed, nothing left staged."""
    uri, files = _even_table(tmp_path)
    (Path(uri) / files["mixed"]).unlink()
    before = DeltaTable(uri).version()
    sink = DeltaSink(uri, mode="overwrite", replace_where="is_even = true", staging=staging)
    with pytest.raises(StagingError, match=r"the overwrite .*(could not read|failed while)"):
        TwoPhaseSink(sink).write(_even_rows(spark, [10]))
    assert DeltaTable(uri).version() == before
    assert data_files_on_disk(uri) == committed_files(uri) - {files["mixed"]}
    assert staging_leftovers(uri) == []


def test_a_file_spark_would_read_as_a_pattern_is_refused_under_spark_staging(
    spark, tmp_path
) -> None:
    """Hadoop expands ``[...]`` in the paths Spark reads: under ``staging="spark"`` such a
    file to rewrite is refused (nothing committed); Python tasks read it by its name."""
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"id": [1], "is_even": [False], "s": ["a"]}, schema=EVEN))
    odd = Path(uri) / "f[1].parquet"
    pq.write_table(pa.table({"id": [2, 3], "is_even": [True, False], "s": ["b", "c"]}), odd)
    add = {
        "path": "f%5B1%5D.parquet",
        "partitionValues": {},
        "size": odd.stat().st_size,
        "modificationTime": 0,
        "dataChange": True,
        "stats": json.dumps({"numRecords": 2}),
    }
    (Path(uri) / "_delta_log" / f"{1:020d}.json").write_text(
        json.dumps({"commitInfo": {"operation": "WRITE"}}) + "\n" + json.dumps({"add": add}) + "\n",
        encoding="utf-8",
    )
    spark_sink = DeltaSink(uri, mode="overwrite", replace_where="is_even", staging="spark")
    with pytest.raises(UnsupportedTableFeatureError, match="as a pattern"):
        TwoPhaseSink(spark_sink).write(_even_rows(spark, [10]))
    assert DeltaTable(uri).version() == 1 and staging_leftovers(uri) == []
    TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="is_even")).write(
        _even_rows(spark, [10])
    )
    _expect_even(uri, [(1, False, "a"), (3, False, "c"), (10, True, "new10")])


@pytest.mark.parametrize("vectors", [False, True], ids=["rewrite", "deletion-vectors"])
def test_a_driver_killed_between_the_rewrite_and_the_commit_overwrites_once_on_rerun(
    spark, tmp_path, vectors
) -> None:
    """The driver is SIGKILLed (its whole process group) right as it commits, after the
    matching files were rewritten (or, on a table with deletion vectors, their rows marked in a
    new vector file): the re-run of the same epoch commits the overwrite once (or finds it
    committed, if the kill came after the commit landed), with exactly the expected rows and
    no staged, rewritten or vector file left behind."""
    uri, names = _even_table(tmp_path, vectors=vectors)
    before = DeltaTable(uri).version()
    out = tmp_path / "driver.out"
    with out.open("w") as stdout_file:
        process = subprocess.run(
            [sys.executable, "-m", "committers.tests._replace_driver", uri],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT), CRASH_VARIABLE: "commit_write@1"},
            stdout=stdout_file,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # the crash kills its own process group, not pytest's
            timeout=600,
            check=False,
        )
    assert process.returncode == -signal.SIGKILL
    assert "CRASH AT commit_write epoch=1" in out.read_text()
    landed = DeltaTable(uri).version() == before + 1
    if not landed:
        assert staging_leftovers(uri)  # the manifests of the new rows and of the rewrite
    metrics = overwrite_evens(spark, uri)
    assert metrics.status == ("skipped" if landed else "committed")
    assert DeltaTable(uri).version() == before + 1
    _expect_even(uri, [*OLD_ROWS_KEPT, (10, True, "new10"), (12, True, "new12")])
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []
    if vectors:  # the mixed file kept, its even row marked; one vector file, the committed one
        (add,) = [a for a in _adds(uri, before + 1) if a["path"] == names["mixed"]]
        assert add["deletionVector"]["cardinality"] == 1
        assert len(list(Path(uri).rglob("deletion_vector_*.bin"))) == 1
