"""Identity columns of tables delta-spark made (``GENERATED ALWAYS`` / ``BY DEFAULT AS
IDENTITY``, positive and negative steps): the sink's appends generate values that are unique
and beyond the column's high-water mark, advance the mark in the same commit, and delta-spark's
own inserts after them continue beyond it. Every commit of the log is checked against the
protocol's rule (:func:`_assert_marks_respected`), the rows are read by delta-spark, deltalake
and DuckDB."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from committers.delta import DeltaSink, UnsupportedTableFeatureError
from committers.delta.table._identity import IdentityRangeTakenError
from committers.tests._delta_helpers import staging_leftovers
from committers.tests._delta_spark import assert_all_read, data_files, spark_rows
from committers.tests._identity_driver import APP_ID, identity_batch
from committers.tests._spark_helpers import file_stream, make_source, run_available_now
from framework import TwoPhaseSink
from framework._crash import CRASH_VARIABLE
from framework.errors import SchemaMismatchError

pytestmark = pytest.mark.spark

REPO_ROOT = Path(__file__).resolve().parents[4]
MARK = "delta.identity.highWaterMark"

# kind -> (GENERATED clause, start, step)
TABLES = {
    "always": ("ALWAYS", 10, 5),
    "by default": ("BY DEFAULT", 10, 5),
    "negative step": ("ALWAYS", -1, -3),
}


def _create(spark, uri: str, kind: str) -> tuple[int, int]:
    """The delta-spark table of ``kind`` holding three rows delta-spark inserted."""
    clause, start, step = TABLES[kind]
    spark.sql(
        f"CREATE TABLE delta.`{uri}` (id BIGINT GENERATED {clause} AS IDENTITY "
        f"(START WITH {start} INCREMENT BY {step}), v INT) USING delta"
    )
    spark.sql(f"INSERT INTO delta.`{uri}` (v) VALUES (1), (2), (3)")
    return start, step


def _commits(uri: str) -> list[list[dict]]:
    paths = sorted((Path(uri) / "_delta_log").glob("*.json"))
    return [[json.loads(line) for line in p.read_text().splitlines()] for p in paths]


def _mark(uri: str) -> int | None:
    metadata = [a["metaData"] for commit in _commits(uri) for a in commit if "metaData" in a]
    fields = json.loads(metadata[-1]["schemaString"])["fields"]
    return next(f for f in fields if f["name"] == "id")["metadata"].get(MARK)


def _assert_marks_respected(uri: str, start: int, step: int) -> None:
    """Every commit that moves the mark (the sink's and delta-spark's) adds ids of the sequence
    ``start + k * step``, all beyond the mark before it, and sets the mark to the farthest."""
    mark = None
    for commit in _commits(uri):
        metadata = [a["metaData"] for a in commit if "metaData" in a]
        fields = json.loads(metadata[-1]["schemaString"])["fields"] if metadata else None
        new_mark = (
            next(f for f in fields if f["name"] == "id")["metadata"].get(MARK) if fields else mark
        )
        if new_mark == mark:
            continue
        stats = [json.loads(a["add"]["stats"]) for a in commit if "add" in a]
        ids = [s[side]["id"] for s in stats for side in ("minValues", "maxValues")]
        assert ids, commit
        for value in ids:
            assert (value - start) % step == 0 and (value - start) * step >= 0, (value, commit)
            assert mark is None or (value - mark) * step > 0, (value, mark)
        assert new_mark == (max(ids) if step > 0 else min(ids))
        mark = new_mark


def _rows(spark, uri: str) -> list[dict]:
    rows = assert_all_read(spark, uri)  # delta-spark, deltalake and DuckDB agree
    ids = [r["id"] for r in rows]
    assert len(set(ids)) == len(ids), ids
    return rows


@pytest.mark.parametrize(
    ("kind", "staging"),
    [("always", "spark"), ("always", "arrow"), ("negative step", "arrow"), ("by default", "spark")],
)
def test_appends_generate_unique_values_beyond_the_mark(delta_spark, tmp_path, kind, staging):
    """Bounded (with and without app id, replayed) and streaming appends of the sink between
    delta-spark's inserts: every id once, each commit beyond the mark before it, the mark
    advanced in the commit that generates the values."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    start, step = _create(spark, uri, kind)
    assert _mark(uri) == start + 2 * step

    def sink(**options):
        return TwoPhaseSink(DeltaSink(uri, staging=staging, **options))

    first = sink(app_id=APP_ID).write(identity_batch(spark), epoch_id=0)
    assert first.status == "committed"
    # 7 rows over 3 partitions from start + 3 * step, spaced as delta-spark spaces them: row r
    # of partition p gets index 3 * r + p; the third row of partition 2 is the farthest
    assert _mark(uri) == start + (3 + 8) * step
    version = first.version
    replay = sink(app_id=APP_ID).write(identity_batch(spark), epoch_id=0)
    assert (replay.status, len(_commits(uri)) - 1) == ("skipped", version)

    sink().write(spark.range(200, 203).selectExpr("CAST(id AS INT) v"))
    source = make_source(tmp_path, 2, per_file=4, start=300)
    stream = file_stream(spark, source).selectExpr("CAST(id AS INT) AS v")
    run_available_now(sink(app_id="stream"), stream, tmp_path / "chk")
    spark.sql(f"INSERT INTO delta.`{uri}` (v) VALUES (4), (5)")

    _assert_marks_respected(uri, start, step)
    rows = _rows(spark, uri)
    expected_v = [1, 2, 3, 4, 5, *range(100, 107), 200, 201, 202, *range(300, 308)]
    assert sorted(r["v"] for r in rows) == expected_v
    farthest = max if step > 0 else min
    assert _mark(uri) == farthest(r["id"] for r in rows)


def test_explicit_values_into_a_generated_always_column_are_refused(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, "always")
    commits, files = len(_commits(uri)), data_files(uri)
    rows = spark.createDataFrame([(1000, 7)], "id BIGINT, v INT")
    with pytest.raises(SchemaMismatchError, match="GENERATED ALWAYS AS IDENTITY"):
        TwoPhaseSink(DeltaSink(uri, app_id="explicit")).write(rows)
    assert (len(_commits(uri)), data_files(uri)) == (commits, files)
    assert staging_leftovers(uri) == []
    assert sorted(r["v"] for r in spark_rows(spark, uri)) == [1, 2, 3]


def test_explicit_values_into_a_by_default_column_are_written_and_leave_the_mark(
    delta_spark, tmp_path
):
    """As delta-spark: given values are written as they are, and do not move the mark (only
    generated values do), so the next generated ones continue from the mark."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    start, step = _create(spark, uri, "by default")
    mark = _mark(uri)
    rows = spark.createDataFrame([(1000, 7), (1001, 8)], "id BIGINT, v INT")
    TwoPhaseSink(DeltaSink(uri, app_id="explicit")).write(rows)
    assert _mark(uri) == mark
    assert not [a for a in _commits(uri)[-1] if "metaData" in a]
    TwoPhaseSink(DeltaSink(uri, app_id="generated")).write(spark.sql("SELECT 9 AS v"))
    assert _mark(uri) == mark + step
    assert {(r["id"], r["v"]) for r in _rows(spark, uri)} == {
        (10, 1),
        (15, 2),
        (20, 3),
        (1000, 7),
        (1001, 8),
        (25, 9),
    }
    _assert_marks_respected(uri, start, step)


def test_operations_that_remove_rows_are_refused_before_anything_is_written(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, "by default")
    commits, files, before = len(_commits(uri)), data_files(uri), spark_rows(spark, uri)
    rows = spark.createDataFrame([(10, 9, "U")], "id BIGINT, v INT, op STRING")
    attempts = {
        "mode='upsert'": lambda: TwoPhaseSink(
            DeltaSink(uri, app_id="u", mode="upsert", keys=["id"], delete_when="op = 'D'")
        ).write(rows),
        "mode='overwrite'": lambda: TwoPhaseSink(DeltaSink(uri, mode="overwrite")).write(
            rows.drop("op")
        ),
        "compaction": lambda: DeltaSink(uri).compact(spark),
    }
    for operation, attempt in attempts.items():
        with pytest.raises(UnsupportedTableFeatureError, match=f"{operation}.*identityColumns"):
            attempt()
        assert (len(_commits(uri)), data_files(uri)) == (commits, files), operation
    assert spark_rows(spark, uri) == before


def test_a_mark_moved_while_staging_fails_the_batch_and_a_rerun_lands(
    delta_spark, tmp_path, monkeypatch
):
    """delta-spark inserts between the sink's reservation of values and its commit, from the
    same mark: the sink's commit sees the mark moved into its range, commits nothing and leaves
    nothing staged; writing the batch again generates values beyond the new mark."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    start, step = _create(spark, uri, "always")
    reserve = DeltaSink.batch_input_plan

    def reserve_then_insert(sink, df):
        plan = reserve(sink, df)
        spark.sql(f"INSERT INTO delta.`{uri}` (v) VALUES (4)")
        return plan

    monkeypatch.setattr(DeltaSink, "batch_input_plan", reserve_then_insert)
    with pytest.raises(IdentityRangeTakenError, match="another writer generated values"):
        TwoPhaseSink(DeltaSink(uri, app_id=APP_ID)).write(identity_batch(spark), epoch_id=0)
    assert sorted(r["v"] for r in spark_rows(spark, uri)) == [1, 2, 3, 4]
    assert staging_leftovers(uri) == [] and len(data_files(uri)) == len(
        [a for c in _commits(uri) for a in c if "add" in a]
    )
    monkeypatch.undo()
    TwoPhaseSink(DeltaSink(uri, app_id=APP_ID)).write(identity_batch(spark), epoch_id=0)
    _assert_marks_respected(uri, start, step)
    assert sorted(r["v"] for r in _rows(spark, uri)) == [1, 2, 3, 4, *range(100, 107)]


def test_a_driver_killed_before_its_commit_then_rerun_writes_each_id_once(delta_spark, tmp_path):
    """The driver reserves and stages the batch's values, then is SIGKILLed before its commit;
    the rerun of the same epoch reserves again (the gap is allowed, a duplicate never) and
    commits once."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    start, step = _create(spark, uri, "always")
    process = subprocess.run(
        [sys.executable, "-m", "committers.tests._identity_driver", uri],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), CRASH_VARIABLE: "before_commit"},
        capture_output=True,
        text=True,
        start_new_session=True,  # the crash kills its own process group, not pytest's
        timeout=300,
    )
    assert process.returncode == -signal.SIGKILL, process.stderr[-3000:]
    assert "CRASH AT before_commit" in process.stdout
    assert len(_commits(uri)) == 2 and staging_leftovers(uri)  # staged, not committed

    rerun = TwoPhaseSink(DeltaSink(uri, app_id=APP_ID)).write(identity_batch(spark), epoch_id=0)
    assert rerun.status == "committed"
    _assert_marks_respected(uri, start, step)
    assert sorted(r["v"] for r in _rows(spark, uri)) == [1, 2, 3, *range(100, 107)]
    assert staging_leftovers(uri) == []  # the killed run's files went with the commit's clean-up
    assert data_files(uri) == {a["add"]["path"] for c in _commits(uri) for a in c if "add" in a}
