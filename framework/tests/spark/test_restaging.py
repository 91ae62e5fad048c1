"""An epoch whose destination changed its rules between staging and commit
(``StaleStagingError``) is staged again under the new rules and committed once, at most
``MAX_RESTAGES`` times; the stale output is aborted each time and nothing of it is committed.

The destination is a fake (an in-memory log of committed epochs with a "rules version" another
writer bumps right before chosen commits); Spark runs the writers for real (local mode)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pytest

from framework import TwoPhaseSink
from framework.errors import StaleStagingError
from framework.sink import Epoch, GlobalCommitter, Sink, SinkWriter, WriterContext
from framework.spark._two_phase import MAX_RESTAGES

pytestmark = pytest.mark.spark


class _CountSerializer:
    version = 1

    def serialize(self, obj: int) -> bytes:
        return struct.pack(">q", obj)

    def deserialize(self, version: int, data: bytes) -> int:
        return int(struct.unpack(">q", data)[0])


class _CountingWriter(SinkWriter[pa.RecordBatch, int]):
    """Stages nothing but the number of rows it saw (its committable)."""

    def __init__(self) -> None:
        self.rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows

    def prepare_commit(self, flush: bool) -> list[int]:
        return [self.rows]


@dataclass
class _Destination:
    """What the fake destination holds; lives on the driver only."""

    rules: int = 0
    changes_before_commits: int = 0  # another writer's ALTERs, one right before each commit
    committed: dict[int, int] = field(default_factory=dict)  # epoch id -> rows
    aborted: int = 0
    prepared: int = 0


class _Committer(GlobalCommitter[int, tuple[Epoch, int]]):
    def __init__(self, sink: _RulesSink) -> None:
        self.sink = sink

    def is_committed(self, epoch: Epoch) -> bool:
        return epoch.epoch_id in self.sink.state.committed

    def combine(self, epoch: Epoch, committables: list[int]) -> tuple[Epoch, int]:
        return epoch, sum(committables)

    def commit(self, global_committables: list[tuple[Epoch, int]]) -> list[tuple[Epoch, int]]:
        destination = self.sink.state
        if destination.changes_before_commits:
            destination.changes_before_commits -= 1
            destination.rules += 1
        for epoch, rows in global_committables:
            if self.sink.planned_rules != destination.rules:
                raise StaleStagingError(f"rules {destination.rules} since batch {epoch.epoch_id}")
            destination.committed[epoch.epoch_id] = rows
        return []

    def abort(self, epoch: Epoch) -> None:
        self.sink.state.aborted += 1


class _RulesSink(Sink[pa.RecordBatch, int, tuple[Epoch, int]]):
    app_id = "restaging"

    def __init__(self, destination: _Destination) -> None:
        self.state = destination
        self.planned_rules = -1

    def __getstate__(self) -> dict[str, Any]:
        return {"state": _Destination(), "planned_rules": self.planned_rules}

    @property
    def destination(self) -> str:
        return "fake"

    def prepare(self, input_schema: Any) -> None:
        self.state.prepared += 1
        self.planned_rules = self.state.rules

    def create_writer(self, context: WriterContext) -> SinkWriter[pa.RecordBatch, int]:
        return _CountingWriter()

    def create_global_committer(self) -> GlobalCommitter[int, tuple[Epoch, int]]:
        return _Committer(self)

    def committable_serializer(self) -> _CountSerializer:
        return _CountSerializer()


@pytest.mark.parametrize("changes", [1, MAX_RESTAGES])
def test_a_stale_epoch_is_staged_again_and_committed_once(spark, changes):
    destination = _Destination(changes_before_commits=changes)
    sink = TwoPhaseSink(_RulesSink(destination))
    metrics = sink.write(spark.range(0, 50, numPartitions=2), epoch_id=7)
    assert (metrics.status, metrics.restaged, metrics.rows) == ("committed", changes, 50)
    assert destination.committed == {7: 50}  # the last staging's rows, once
    assert destination.prepared == 1 + changes
    assert destination.aborted == changes  # each stale staging discarded


def test_a_destination_that_keeps_changing_fails_the_epoch_with_nothing_committed(spark):
    destination = _Destination(changes_before_commits=MAX_RESTAGES + 1)
    sink = TwoPhaseSink(_RulesSink(destination))
    with pytest.raises(StaleStagingError, match="rules 4 since batch 3"):
        sink.write(spark.range(0, 50, numPartitions=2), epoch_id=3)
    assert destination.committed == {}
    assert destination.prepared == 1 + MAX_RESTAGES
    assert destination.aborted == MAX_RESTAGES + 1  # the last one by the failed epoch's clean-up
