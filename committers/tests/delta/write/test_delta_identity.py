"""Who a write is: app ids and epoch ids never make a job skip, or collide with, another job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import assert_no_orphans, ids, staging_leftovers
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink
from framework.errors import ConfigurationError, EpochRegressionError

pytestmark = [pytest.mark.spark, pytest.mark.usefixtures("each_staging")]


def _logged(table: str, kind: str) -> list[dict]:
    """Every ``kind`` action (``txn``, ``commitInfo``) in the table's JSON commits."""
    commits = sorted((Path(table) / "_delta_log").glob("*.json"))
    actions = [json.loads(line) for path in commits for line in path.read_text().splitlines()]
    return [action[kind] for action in actions if kind in action]


def _frame(spark, start: int, stop: int):
    return spark.range(start, stop, numPartitions=2).selectExpr(
        "id", "cast(id % 3 as string) as day"
    )


def test_epoch_id_without_app_id_is_refused(spark, tmp_path):
    """Two jobs without app_id, both passing the same epoch_id, used to share one identity: the
    second was skipped as a replay and its rows were lost without a word."""
    table = str(tmp_path / "table")
    with pytest.raises(ConfigurationError, match="needs an app_id"):
        TwoPhaseSink(DeltaSink(table)).write(_frame(spark, 0, 10), epoch_id=20261121)
    assert not DeltaTable.is_deltatable(table)


def test_jobs_without_app_id_never_skip_each_other_and_record_no_txn(spark, tmp_path):
    """Nothing can replay a write without an app id, so its commit records no txn (as a plain
    delta-spark df.write): one txn per such write would stay in the table's state forever."""
    table = str(tmp_path / "table")
    first = TwoPhaseSink(DeltaSink(table)).write(_frame(spark, 0, 30))
    second = TwoPhaseSink(DeltaSink(table)).write(_frame(spark, 100, 130))
    assert (first.status, second.status) == ("committed", "committed")
    assert (first.version, second.version) == (0, 1)
    assert first.app_id != second.app_id
    assert ids(table) == [*range(30), *range(100, 130)]
    assert_no_orphans(table)
    overwrite = TwoPhaseSink(DeltaSink(table, mode="overwrite")).write(_frame(spark, 200, 210))
    assert (overwrite.status, overwrite.version) == ("committed", 2)
    assert ids(table) == list(range(200, 210))
    assert sorted(r["id"] for r in duckdb_rows(table)) == list(range(200, 210))
    assert _logged(table, "txn") == []
    infos = _logged(table, "commitInfo")
    assert len({info["sink.runId"] for info in infos}) == 3
    assert not [info for info in infos if "sink.appId" in info or "sink.epochId" in info]
    assert DeltaTable(table).transaction_version(first.app_id) is None
    assert staging_leftovers(table) == []  # (the overwritten files stay until a vacuum)


@pytest.mark.parametrize("epoch_id", [-1, True, 1.5, "3"])
def test_malformed_epoch_id(spark, tmp_path, epoch_id):
    sink = TwoPhaseSink(DeltaSink(str(tmp_path / "table"), app_id="job"))
    with pytest.raises(ConfigurationError, match="epoch_id must be a non-negative integer"):
        sink.write(_frame(spark, 0, 10), epoch_id=epoch_id)


def test_lower_epoch_id_is_its_own_clear_error(spark, tmp_path):
    """A backfill of an earlier day after a later one: not 'two writers', and never skipped."""
    table = str(tmp_path / "table")
    sink = TwoPhaseSink(DeltaSink(table, app_id="daily", partition_by=["day"]))
    assert sink.write(_frame(spark, 0, 30), epoch_id=20261122).status == "committed"
    with pytest.raises(EpochRegressionError) as caught:
        sink.write(_frame(spark, 100, 130), epoch_id=20261121)
    message = str(caught.value)
    assert "20261121" in message and "20261122" in message and "app_id" in message
    # nothing committed, nothing staged left behind, and the later epoch is still a replay
    assert ids(table) == list(range(30))
    assert_no_orphans(table)
    assert sink.write(_frame(spark, 0, 30), epoch_id=20261122).status == "skipped"
    # an earlier epoch that DID commit is still recognised as a replay
    assert sink.write(_frame(spark, 200, 210), epoch_id=20261123).status == "committed"
    assert sink.write(_frame(spark, 0, 30), epoch_id=20261122).status == "skipped"
    assert ids(table) == [*range(30), *range(200, 210)]
