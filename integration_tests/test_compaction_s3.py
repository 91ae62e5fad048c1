"""Compaction of a table on S3, by Python tasks (``staging="auto"``) and by Spark's reader and
writer through ``s3a://`` (``staging="spark"``): the small files are rewritten and committed
once, cleanly."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from committers.delta import DeltaSink
from integration_tests._s3helpers import S3Table

MIB = 1024 * 1024


@pytest.mark.parametrize("staging", ["auto", "spark"])
def test_small_files_on_s3_are_compacted(spark, table: S3Table, staging: str) -> None:  # type: ignore[no-untyped-def]
    for n in range(4):
        rows = pa.table(
            {
                "id": pa.array(range(n * 10, n * 10 + 10), pa.int64()),
                "day": ["d0" if i % 2 else "d1" for i in range(10)],
            }
        )
        write_deltalake(
            table.uri, rows, mode="append", partition_by=["day"], storage_options=table.options
        )
    sink = DeltaSink(table.uri, **table.sink_kwargs(staging=staging))
    result = sink.compact(spark, target_file_size=MIB)

    assert (result.files_removed, result.files_added, result.rows) == (8, 2, 40)
    assert table.ids() == list(range(40))
    assert len(table.committed_keys()) == 2
    assert table.staged_leftovers() == []
    # Only the removed files (kept for time travel) and the two new ones are on storage.
    assert len(table.data_keys()) == 8 + 2
