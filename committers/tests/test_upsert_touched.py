"""The driver's count of an upsert's matching rows per candidate file, and when it declines
(the Spark join then decides; both are compared on real upserts in test_delta_upsert.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from committers.delta import _upsert_touched
from committers.delta._storage import TableLocation
from committers.delta._upsert_touched import Candidate, KeyColumn, driver_matches

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
