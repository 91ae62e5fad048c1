"""An upsert's key matching in pyarrow: the driver's count of matching rows per candidate file,
and when it declines (the Spark join then decides); the filter that drops the changed rows when
Python tasks rewrite a file. Both are compared with Spark's on real upserts in
test_delta_upsert.py."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from committers.delta import _upsert_touched
from committers.delta._storage import TableLocation
from committers.delta._upsert_touched import Candidate, KeyColumn, driver_matches, keys_to_drop

ID = KeyColumn("id", pa.int64(), partition=False)
DAY = KeyColumn("day", pa.string(), partition=True)
UTC = dt.timezone.utc


def _file(root: Path, name: str, table: pa.Table, day: str | None = None) -> Candidate:
    pq.write_table(table, root / name)
    return Candidate(name, (root / name).stat().st_size, (day,) if day is None else (day, None))


def _batch(*columns: pa.Array, deletes: list[bool]) -> pa.Table:
    arrays = [*columns, pa.array(deletes)]
    return pa.table(arrays, names=[f"c{i}" for i in range(len(arrays))])


def test_matching_rows_are_counted_per_file_and_delete_flag(tmp_path: Path) -> None:
    # Files written by another tool: int32 ids in one, NULL ids in another, a duplicate key.
    first = _file(tmp_path, "a.parquet", pa.table({"id": pa.array([1, 2, 3], pa.int32())}))
    second = _file(tmp_path, "b.parquet", pa.table({"id": pa.array([3, 3, None, 9], pa.int64())}))
    untouched = _file(tmp_path, "c.parquet", pa.table({"id": pa.array([7], pa.int64())}))
    batch = _batch(pa.array([2, 3, 4], pa.int32()), deletes=[False, True, False])
    location = TableLocation.of(str(tmp_path))
    matches = driver_matches(location, [ID], [first, second, untouched], batch)
    assert matches == {(0, False): 1, (0, True): 1, (1, True): 2}


def test_partition_keys_come_from_the_log_and_missing_columns_match_nothing(
    tmp_path: Path,
) -> None:
    old = _file(tmp_path, "old.parquet", pa.table({"other": [1, 2]}), day="d1")  # no id column
    d1 = _file(tmp_path, "d1.parquet", pa.table({"id": pa.array([1, 2], pa.int64())}), day="d1")
    d2 = _file(tmp_path, "d2.parquet", pa.table({"id": pa.array([1, 2], pa.int64())}), day="d2")
    batch = _batch(pa.array(["d1", "d2"]), pa.array([1, 2], pa.int64()), deletes=[False, False])
    location = TableLocation.of(str(tmp_path))
    matches = driver_matches(location, [DAY, ID], [old, d1, d2], batch)
    assert matches == {(1, False): 1, (2, False): 1}


def test_values_that_do_not_cast_exactly_leave_the_decision_to_spark(tmp_path: Path) -> None:
    stamp = KeyColumn("ts", pa.timestamp("us", UTC), partition=False)
    nanos = pa.array([1_000_000_001], pa.timestamp("ns", UTC))  # not a whole microsecond
    in_file = _file(tmp_path, "ns.parquet", pa.table({"ts": nanos}))
    exact = _batch(pa.array([dt.datetime(2026, 1, 1, tzinfo=UTC)]), deletes=[False])
    location = TableLocation.of(str(tmp_path))
    assert driver_matches(location, [stamp], [in_file], exact) is None
    ids = _file(tmp_path, "ids.parquet", pa.table({"id": pa.array([1], pa.int64())}))
    too_long = KeyColumn("id", pa.int32(), partition=False)
    assert (
        driver_matches(location, [too_long], [ids], _batch(pa.array([2**40]), deletes=[True]))
        is None
    )


def test_too_many_or_too_large_candidates_are_left_to_spark(tmp_path: Path, monkeypatch) -> None:
    files = [_file(tmp_path, f"{i}.parquet", pa.table({"id": [i]})) for i in range(3)]
    batch = _batch(pa.array([1], pa.int64()), deletes=[False])
    location = TableLocation.of(str(tmp_path))
    assert driver_matches(location, [ID], files, batch) == {(1, False): 1}
    monkeypatch.setattr(_upsert_touched, "DRIVER_MAX_FILES", 2)
    assert driver_matches(location, [ID], files, batch) is None
    monkeypatch.setattr(_upsert_touched, "DRIVER_MAX_FILES", 3)
    monkeypatch.setattr(_upsert_touched, "DRIVER_MAX_BYTES", sum(f.size for f in files) - 1)
    assert driver_matches(location, [ID], files, batch) is None


def test_a_file_gone_from_storage_is_an_error_not_a_miss(tmp_path: Path) -> None:
    gone = Candidate("gone.parquet", 100, (None,))
    location = TableLocation.of(str(tmp_path))
    with pytest.raises(FileNotFoundError):
        driver_matches(location, [ID], [gone], _batch(pa.array([1], pa.int64()), deletes=[False]))


# -- the filter of a rewrite in Python tasks ---------------------------------------------------


def test_the_filter_drops_exactly_the_named_keys_and_keeps_order_and_null_keys() -> None:
    rows = pa.table(
        {
            "id": pa.array([5, None, 3, 1, 3, 8], pa.int64()),
            "v": ["a", "b", "c", "d", "e", "f"],
        }
    )
    batch = _batch(pa.array([3, 8, 42], pa.int32()), deletes=[True, False, False])
    drop = keys_to_drop([ID], batch)
    assert drop is not None
    assert drop(rows).to_pydict() == {"id": [5, None, 1], "v": ["a", "b", "d"]}


def test_the_filter_matches_composite_keys_as_a_whole() -> None:
    rows = pa.table(
        {
            "day": ["d1", "d1", "d2", "d2", None],
            "id": pa.array([1, 2, 1, 2, 1], pa.int64()),
        }
    )
    batch = _batch(pa.array(["d1", "d2"]), pa.array([1, 2], pa.int64()), deletes=[False, True])
    drop = keys_to_drop([DAY, ID], batch)
    assert drop is not None
    assert drop(rows).to_pydict() == {"day": ["d1", "d2", None], "id": [2, 1, 1]}


@pytest.mark.parametrize(
    ("key", "in_batch", "in_rows"),
    [
        (  # a time zone is only the display of a timestamp
            pa.timestamp("us", UTC),
            pa.array([dt.datetime(2026, 1, 1, 1, tzinfo=UTC)], pa.timestamp("us", "Europe/Paris")),
            [dt.datetime(2026, 1, 1, 1, tzinfo=UTC), dt.datetime(2026, 1, 1, 2, tzinfo=UTC)],
        ),
        (pa.date32(), pa.array([dt.date(9999, 12, 31)]), [dt.date(9999, 12, 31), dt.date(1, 1, 1)]),
        (
            pa.decimal128(20, 4),
            pa.array([Decimal("1.50")], pa.decimal128(10, 2)),
            [Decimal("1.5000"), Decimal("1.5001")],
        ),
        (pa.binary(), pa.array([b"\x00"]), [b"\x00", b""]),
        (pa.string(), pa.array(["\U0001f600"]), ["\U0001f600", ""]),
        (pa.bool_(), pa.array([True]), [True, False]),
    ],
)
def test_the_filter_compares_values_typed_as_the_table(key, in_batch, in_rows) -> None:
    rows = pa.table({"k": pa.array(in_rows, key)})
    drop = keys_to_drop([KeyColumn("k", key, partition=False)], _batch(in_batch, deletes=[False]))
    assert drop is not None
    assert drop(rows).column("k").to_pylist() == in_rows[1:]


def test_keys_that_do_not_cast_exactly_leave_the_rewrite_to_spark() -> None:
    narrow = KeyColumn("id", pa.int32(), partition=False)
    assert keys_to_drop([narrow], _batch(pa.array([2**40]), deletes=[False])) is None
    micros = KeyColumn("ts", pa.timestamp("us", UTC), partition=False)
    nanos = pa.array([1_000_000_001], pa.timestamp("ns", UTC))
    assert keys_to_drop([micros], _batch(nanos, deletes=[False])) is None
