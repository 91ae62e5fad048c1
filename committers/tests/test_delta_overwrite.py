"""Idempotent overwrites: ``DeltaSink(mode="overwrite", replace_where=...)`` replaces the
matching partitions (or the whole table) in one transaction carrying the txn."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.delta._replace_where import ReplaceWhere
from committers.tests._delta_helpers import (
    committed_files,
    data_files_on_disk,
    read_rows,
    staging_leftovers,
)
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import ConfigurationError, ConstraintViolationError, SchemaMismatchError

# -- the predicate on its own (no Spark) -------------------------------------------------------

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
        ("id = 3", SchemaMismatchError, "'id', which is not a partition column"),
        ("day = 3", ConfigurationError, "3 is not a string literal"),
        ("n = 'x'", ConfigurationError, "'x' is not a valid value"),
        ("d = '2026-13-01'", ConfigurationError, "is not a valid value"),
    ],
)
def test_replace_where_refuses_what_it_cannot_evaluate_exactly(text, error, message) -> None:
    with pytest.raises(error, match=message):
        ReplaceWhere.parse(text).bind(PARTITIONS, "t")


def test_replace_where_refuses_partition_types_it_cannot_compare_exactly() -> None:
    schema = pa.schema([("at", pa.timestamp("us", "UTC"))])
    with pytest.raises(ConfigurationError, match="only string, integer, decimal, date"):
        ReplaceWhere.parse("at = '2026-01-01 00:00:00'").bind(schema, "t")


# -- on Spark ----------------------------------------------------------------------------------


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


def _files_ever_added(uri: str) -> set[str]:
    added = set()
    for commit in sorted((Path(uri) / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                added.add(action["add"]["path"])
    return added


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
    assert info["operationParameters"]["predicate"] == json.dumps(["day = 'd1'"])
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
    assert data_files_on_disk(uri) <= _files_ever_added(uri) and staging_leftovers(uri) == []


def test_replace_where_on_the_null_partition_and_a_new_table(spark, tmp_path) -> None:
    uri = _table(tmp_path)
    sink = DeltaSink(uri, app_id="nulls", mode="overwrite", replace_where="day IS NULL")
    TwoPhaseSink(sink).write(_rows(spark, [40], None), epoch_id=1)
    _expect(uri, [(1, "d1"), (2, "d1"), (3, "d2"), (5, "d2"), (40, None)])

    fresh = str(tmp_path / "fresh")
    new = DeltaSink(fresh, partition_by=["day"], mode="overwrite", replace_where="day = 'd9'")
    TwoPhaseSink(new).write(_rows(spark, [1, 2], "d9"))
    _expect(fresh, [(1, "d9"), (2, "d9")])


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
    assert len(calls) == 2 and calls[1] == calls[0] + 1  # redone, now removing the new d1 file
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
    with pytest.raises(SchemaMismatchError, match="'id', which is not a partition column"):
        TwoPhaseSink(DeltaSink(uri, mode="overwrite", replace_where="id = 1")).write(
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
