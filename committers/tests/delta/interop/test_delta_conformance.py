"""DeltaSink runs the framework's exactly-once conformance checks."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import (
    committed_files,
    data_files_on_disk,
    ids,
    staging_leftovers,
)
from framework.testing import CONFORMANCE_CHECKS, ConformanceHarness

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), ("day", pa.string())])


class DeltaHarness(ConformanceHarness):
    def __init__(self, root) -> None:
        self.table = str(root / "table")

    def create_sink(self) -> DeltaSink:
        sink = DeltaSink(self.table, app_id="conformance", partition_by=["day"])
        sink.prepare(SCHEMA)
        return sink

    def make_batch(self, keys):
        keys = list(keys)
        return pa.RecordBatch.from_pydict(
            {"id": keys, "day": [f"d{k % 2}" for k in keys]}, schema=SCHEMA
        )

    def committed_keys(self):
        return ids(self.table) if self._exists() else []  # the first commit creates the table

    def uncommitted_leftovers(self):
        committed = committed_files(self.table) if self._exists() else set()
        orphans = data_files_on_disk(self.table) - committed
        return sorted(orphans) + staging_leftovers(self.table)

    def _exists(self) -> bool:
        return DeltaTable.is_deltatable(self.table)


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS, ids=lambda c: c.__name__)
def test_delta_sink_conformance(tmp_path, check):
    check(DeltaHarness(tmp_path))
