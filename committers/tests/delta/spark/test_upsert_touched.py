"""An upsert's key matching in pyarrow: the driver's count of matching rows per candidate file,
and when it declines (the Spark join then decides); the filter that drops the changed rows when
Python tasks rewrite a file; with ``sequence_by``, the rule that makes a change stale. All are
compared with Spark's on real upserts in test_delta_upsert.py."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from committers.delta.spark import _upsert_touched
from committers.delta.spark._upsert_touched import (
    Candidate,
    KeyColumn,
    SequenceColumn,
    change_applies,
    driver_matches,
    keys_to_drop,
)
from committers.delta.storage._storage import TableLocation

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
    assert matches is not None
    assert matches.rows == {(0, False): 1, (0, True): 1, (1, True): 2}
    assert matches.stale.num_rows == 0  # without sequence_by every change applies
    assert {i: p.tolist() for i, p in matches.positions.items()} == {0: [1, 2], 1: [0, 1]}


def test_positions_count_the_rows_a_vector_deletes(tmp_path: Path) -> None:
    """A file's row indexes are its physical ones: rows its vector deletes match nothing and
    still count, as the new vector must name the rows after them."""
    ids = pa.table({"id": pa.array([5, 6, 7, 6], pa.int64())})
    pq.write_table(ids, tmp_path / "v.parquet")
    vectored = Candidate(
        "v.parquet", (tmp_path / "v.parquet").stat().st_size, (None,), np.array([1], np.uint64)
    )
    batch = _batch(pa.array([6, 7], pa.int64()), deletes=[True, False])
    matches = driver_matches(TableLocation.of(str(tmp_path)), [ID], [vectored], batch)
    assert matches is not None and matches.rows == {(0, True): 1, (0, False): 1}
    assert matches.positions[0].tolist() == [2, 3]  # row 1 (a 6) was deleted already


def test_partition_keys_come_from_the_log_and_missing_columns_match_nothing(
    tmp_path: Path,
) -> None:
    old = _file(tmp_path, "old.parquet", pa.table({"other": [1, 2]}), day="d1")  # no id column
    d1 = _file(tmp_path, "d1.parquet", pa.table({"id": pa.array([1, 2], pa.int64())}), day="d1")
    d2 = _file(tmp_path, "d2.parquet", pa.table({"id": pa.array([1, 2], pa.int64())}), day="d2")
    batch = _batch(pa.array(["d1", "d2"]), pa.array([1, 2], pa.int64()), deletes=[False, False])
    location = TableLocation.of(str(tmp_path))
    matches = driver_matches(location, [DAY, ID], [old, d1, d2], batch)
    assert matches is not None and matches.rows == {(1, False): 1, (2, False): 1}


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
    found = driver_matches(location, [ID], files, batch)
    assert found is not None and found.rows == {(1, False): 1}
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


# -- sequence_by across batches: a change older than the stored row is stale -------------------

TS = SequenceColumn("ts", pa.int64())
NAN = float("nan")
#: (stored sequence, change sequence, the change deletes, whether it applies); shared with the
#: Spark twin of the rule in test_delta_upsert.py.
APPLIES_CASES = [
    ((5,), (6,), False, True),
    ((5,), (4,), False, False),  # a late update: the stored row is newer
    ((5,), (5,), False, True),  # a tie: the later arrival, the change, wins
    ((5,), (6,), True, True),
    ((5,), (4,), True, False),  # a late delete does nothing
    ((5,), (5,), True, False),  # a tie: a non-delete (the stored row) wins over a delete
    ((None,), (1,), False, True),  # a row stored without a sequence is older than any change
    ((None,), (1,), True, True),
    ((5, 2), (5, 3), False, True),  # several columns compare left to right
    ((5, 2), (5, 1), False, False),
    ((5, 2), (4, 9), False, False),
    ((5, 2), (6, 0), True, True),
    ((5, None), (5, 0), True, True),
    ((5, 2), (5, 2), True, False),
]
#: The same for a floating-point sequence: NaN above every number and equal to itself.
APPLIES_NAN_CASES = [
    ((NAN,), (1.0,), False, False),
    ((1.0,), (NAN,), False, True),
    ((NAN,), (NAN,), False, True),
    ((NAN,), (NAN,), True, False),
    ((-0.0,), (0.0,), True, False),  # -0.0 equals 0.0
]


@pytest.mark.parametrize(
    ("cases", "kind"), [(APPLIES_CASES, pa.int64()), (APPLIES_NAN_CASES, pa.float64())]
)
def test_a_change_applies_when_it_ranks_at_least_as_high_as_the_stored_row(cases, kind) -> None:
    for stored, change, deletes, expected in cases:
        width = len(stored)
        applies = change_applies(
            [pa.array([stored[i]], kind) for i in range(width)],
            [pa.array([change[i]], kind) for i in range(width)],
            pa.array([deletes]),
        )
        assert applies.to_pylist() == [expected], (stored, change, deletes)


def test_the_filter_keeps_the_rows_newer_than_their_change() -> None:
    rows = pa.table(
        {
            "id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
            "ts": pa.array([5, 5, 5, 5, None, 5], pa.int64()),
            "v": ["a", "b", "c", "d", "e", "f"],
        }
    )
    batch = _batch(
        pa.array([1, 2, 3, 4, 5], pa.int32()),
        pa.array([6, 4, 5, 5, 0], pa.int32()),  # (typed as the table: cast exactly)
        deletes=[False, False, False, True, True],
    )
    batch = batch.select([0, 2, 1])  # keys, delete flag, sequence values
    drop = keys_to_drop([ID], batch, [TS])
    assert drop is not None
    # 1 newer: replaced; 2 older: kept; 3 tie: replaced; 4 deleted at a tie: kept;
    # 5 stored without a sequence: deleted; 6 not in the batch: kept.
    assert drop(rows).column("v").to_pylist() == ["b", "d", "f"]


def test_the_driver_counts_only_the_rows_a_change_replaces_and_names_the_stale_changes(
    tmp_path: Path,
) -> None:
    stamped = _file(
        tmp_path,
        "a.parquet",
        pa.table({"id": pa.array([1, 2, 3], pa.int64()), "ts": pa.array([5, 5, 5], pa.int64())}),
    )
    unstamped = _file(tmp_path, "b.parquet", pa.table({"id": pa.array([4], pa.int64())}))
    batch = pa.table(
        [
            pa.array([1, 2, 3, 4], pa.int64()),
            pa.array([False, True, False, True]),
            pa.array([6, 5, 4, 0], pa.int64()),
        ],
        names=["k", "d", "s"],
    )
    location = TableLocation.of(str(tmp_path))
    matches = driver_matches(location, [ID], [stamped, unstamped], batch, [TS])
    assert matches is not None
    # 1 replaced; 2 a delete at a tie and 3 older: stale; 4 lacks the column: deleted.
    assert matches.rows == {(0, False): 1, (1, True): 1}
    assert sorted(matches.stale.to_pylist(), key=str) == [
        {"__sparksink_key_0__": 2, "__sparksink_delete__": True},
        {"__sparksink_key_0__": 3, "__sparksink_delete__": False},
    ]
    too_long = pa.table(
        [pa.array([1]), pa.array([False]), pa.array([2**40])], names=["k", "d", "s"]
    )
    narrow = SequenceColumn("ts", pa.int32())
    assert driver_matches(location, [ID], [stamped], too_long, [narrow]) is None  # Spark decides
