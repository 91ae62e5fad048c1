"""Merge-on-read upserts without Spark: the stats a marked file is added back with, the
option, and the vector files a commit references (what the staging clean-up keeps). The
upserts themselves are judged by delta-spark in test_interop_deletion_vectors_upsert.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pyroaring import BitMap64

from committers.delta import DeltaSink
from committers.delta.spark._upsert_marks import _loose_stats, mark_rows
from committers.delta.spark._upsert_stored import _LiveFile
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import (
    DeletionVectorDescriptor,
    read_bitmap,
    vector_path,
)
from committers.delta.table._table import added_paths
from framework.errors import ConfigurationError


def _file(stats: str | None, records: int = 10, vector: int = 0) -> _LiveFile:
    old = DeletionVectorDescriptor("i", "x", 1, vector) if vector else None
    return _LiveFile(
        index=0,
        logged_path="a.parquet",
        path="a.parquet",
        size=100,
        records=records,
        bounds=(),
        deletion_vector=old,
        logged_stats=stats,
        modification_time=1,
    )


@pytest.mark.parametrize(
    ("logged", "expected"),
    [
        # every digit of a decimal bound kept (a float would round it)
        (
            '{"numRecords":12,"minValues":{"d":12345678901234567890.123456789}}',
            '{"numRecords":12,"minValues":{"d":12345678901234567890.123456789},'
            '"tightBounds":false}',
        ),
        ('{"numRecords":12,"tightBounds":true}', '{"numRecords":12,"tightBounds":false}'),
        ('{"minValues":{"id":1}}', '{"minValues":{"id":1},"numRecords":12,"tightBounds":false}'),
        (None, '{"numRecords":12,"tightBounds":false}'),  # physical rows: live 10 + 2 deleted
    ],
)
def test_a_marked_file_keeps_its_logged_stats_with_loose_bounds(logged, expected) -> None:
    assert _loose_stats(_file(logged, records=10, vector=2)) == expected
    json.loads(expected)


def test_mark_rows_unions_the_old_vector_with_the_replaced_rows(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path))
    touched = [_file('{"numRecords":10}'), _file(None)]
    touched[1] = _LiveFile(**{**touched[1].__dict__, "path": "b.parquet"})
    marked = mark_rows(
        location,
        touched,
        {"a.parquet": np.array([1, 5], np.uint64), "b.parquet": np.array([0], np.uint64)},
        {"a.parquet": np.array([2, 5], np.uint64)},  # (5: deleted already, kept so)
        [{}, {}],
        "batch-3-run",
    )
    assert [m.path for m in marked] == ["a.parquet", "b.parquet"]
    assert [list(read_bitmap(m.vector, location, m.path)) for m in marked] == [[1, 2, 5], [0]]
    assert {vector_path(m.vector, location) for m in marked} == {
        str(p.relative_to(tmp_path)) for p in tmp_path.glob("batch-3-run/deletion_vector_*.bin")
    }
    assert BitMap64([1, 2, 5]) == read_bitmap(marked[0].vector, location, "a.parquet")


def test_the_vector_files_a_commit_adds_are_its_files(tmp_path: Path) -> None:
    """The staging clean-up keeps what a commit references: its data files and the files of
    the vectors its adds carry (a ``u`` vector's file, relative to the root)."""
    log = tmp_path / "_delta_log"
    log.mkdir()
    vector = {
        "storageType": "u",
        "pathOrInlineDv": "batch-1-r" + "0" * 20,
        "offset": 1,
        "sizeInBytes": 10,
        "cardinality": 1,
    }
    inline = {
        "storageType": "i",
        "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
        "sizeInBytes": 40,
        "cardinality": 6,
    }
    lines = [
        {"add": {"path": "x.parquet", "deletionVector": vector}},
        {"add": {"path": "y%20z.parquet", "deletionVector": inline}},
        {"cdc": {"path": "_change_data/c.parquet"}},
    ]
    (log / f"{0:020d}.json").write_text("".join(json.dumps(line) + "\n" for line in lines))
    location = TableLocation.of(str(tmp_path))
    named = vector_path(DeletionVectorDescriptor.from_json(vector), location)
    assert named is not None and named.startswith("batch-1-r/deletion_vector_")
    assert added_paths(location, 0) == {"x.parquet", "y z.parquet", "_change_data/c.parquet", named}


def test_the_option_is_auto_or_off() -> None:
    assert DeltaSink("/tmp/t", mode="upsert", keys=["id"]).deletion_vectors == "auto"
    assert DeltaSink("/tmp/t", mode="upsert", keys=["id"], deletion_vectors="off")
    with pytest.raises(ConfigurationError, match=r"deletion_vectors must be 'auto'.*'off'"):
        DeltaSink("/tmp/t", mode="upsert", keys=["id"], deletion_vectors="on")  # type: ignore[arg-type]
