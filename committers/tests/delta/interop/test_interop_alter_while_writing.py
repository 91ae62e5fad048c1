"""delta-spark changes the table's rules (``ALTER TABLE ... ADD COLUMNS``, ``ADD CONSTRAINT``)
while the sink writes to it: between two micro-batches of a running stream, or between a
bounded write's staging and its commit. The commit finds the table no longer asks for what
the rows were staged under; the batch is staged again under the new rules and committed once,
and the query goes on. Only input the new rules reject fails, naming the rule, with nothing of
that batch committed and nothing staged left behind. Each case reads back with delta-spark,
delta-rs and DuckDB."""

from __future__ import annotations

from pathlib import Path

import pytest

from committers.delta import DeltaSink
from committers.tests._delta_helpers import (
    assert_no_orphans,
    data_files_on_disk,
    files_ever_added,
    staging_leftovers,
)
from committers.tests._delta_spark import assert_all_read, comparable
from committers.tests._log_races import race_before_write
from committers.tests._spark_helpers import file_stream, make_source, run_available_now
from committers.tests.delta.interop.test_interop_delta_spark_write import _create
from framework import TwoPhaseSink
from framework.errors import ConstraintViolationError, SchemaMismatchError
from framework.spark import BatchMetrics
from framework.spark import _two_phase as two_phase

pytestmark = pytest.mark.spark

COLUMNS = "id BIGINT, day STRING"


def _alter_after_batch(spark, uri: str, batch_id: int, statement: str):  # type: ignore[no-untyped-def]
    """An ``on_batch`` callback running ``statement`` (``{t}`` names the table) with
    delta-spark right after batch ``batch_id`` ended, before the next one is staged."""

    def on_batch(metrics: BatchMetrics) -> None:
        if metrics.batch_id == batch_id:
            spark.sql(statement.format(t=f"delta.`{uri}`"))

    return on_batch


def _before_commit(monkeypatch: pytest.MonkeyPatch, other_writer) -> None:  # type: ignore[no-untyped-def]
    """Run ``other_writer`` once, when the first epoch has been staged and is about to be
    committed (the engine's ``before_commit`` step)."""
    pending = [other_writer]
    original = two_phase.crash_point

    def step(name: str, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        if name == "before_commit" and pending:
            pending.pop()()
        original(name, *args, **kwargs)

    monkeypatch.setattr(two_phase, "crash_point", step)


def _stream(spark, tmp_path: Path, uri: str, on_batch) -> TwoPhaseSink:  # type: ignore[no-untyped-def]
    """Three micro-batches of ten rows (ids 0-29) into ``uri``; returns the sink once the
    query ended (re-raising its failure)."""
    source = make_source(tmp_path, files=3)
    sink = TwoPhaseSink(DeltaSink(uri, app_id="altered"), on_batch=on_batch)
    run_available_now(sink, file_stream(spark, source), tmp_path / "checkpoint")
    return sink


def test_a_column_added_between_batches_is_null_in_the_next_ones(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, COLUMNS)
    on_batch = _alter_after_batch(spark, uri, 0, "ALTER TABLE {t} ADD COLUMNS (note STRING)")
    sink = _stream(spark, tmp_path, uri, on_batch)
    assert [(m.batch_id, m.status, m.restaged) for m in sink.batches] == [
        (0, "committed", 0),
        (1, "committed", 1),  # staged under the old schema first
        (2, "committed", 0),  # planned on the new one
    ]
    expected = [{"id": i, "day": f"d{i % 3}", "note": None} for i in range(30)]
    assert assert_all_read(spark, uri) == comparable(expected)
    assert_no_orphans(uri)
    versions = spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").collect()
    assert len(versions) == 5  # create, batch 0, the ALTER, batches 1 and 2: one commit each
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (30, 'd0', 'by delta-spark')")
    assert len(assert_all_read(spark, uri)) == 31


def test_a_constraint_added_between_batches_is_checked_on_the_next_ones(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, COLUMNS)
    on_batch = _alter_after_batch(
        spark, uri, 0, "ALTER TABLE {t} ADD CONSTRAINT known_day CHECK (day IN ('d0', 'd1', 'd2'))"
    )
    sink = _stream(spark, tmp_path, uri, on_batch)
    assert [m.restaged for m in sink.batches] == [0, 1, 0]
    expected = [{"id": i, "day": f"d{i % 3}"} for i in range(30)]
    assert assert_all_read(spark, uri) == comparable(expected)
    assert_no_orphans(uri)


def test_a_constraint_the_next_batch_breaks_fails_it_by_name(delta_spark, tmp_path):
    """After batch 0 (one source file: ten consecutive ids), only its ids are allowed: the
    next batch, from another file, breaks the rule."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, COLUMNS)
    first: list[int] = []

    def allow_only_the_first_batch(metrics: BatchMetrics) -> None:
        if metrics.batch_id == 0:
            first.extend(row.id for row in spark.read.format("delta").load(uri).collect())
            spark.sql(
                f"ALTER TABLE delta.`{uri}` ADD CONSTRAINT first_ids "
                f"CHECK (id BETWEEN {min(first)} AND {max(first)})"
            )

    with pytest.raises(Exception, match="first_ids"):
        _stream(spark, tmp_path, uri, allow_only_the_first_batch)
    assert len(first) == 10
    expected = [{"id": i, "day": f"d{i % 3}"} for i in sorted(first)]  # batch 0 only
    assert assert_all_read(spark, uri) == comparable(expected)
    assert_no_orphans(uri)


def test_a_column_added_between_staging_and_commit_restages_a_bounded_write(
    delta_spark, tmp_path, monkeypatch
):
    """The race inside one write: delta-spark's ALTER lands right before the sink's commit
    file is written (the append loses the race to a metadata change)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, COLUMNS, "INSERT INTO {t} VALUES (0, 'd0')")
    alter = f"ALTER TABLE delta.`{uri}` ADD COLUMNS (note STRING)"
    race_before_write(monkeypatch, lambda: spark.sql(alter))
    sink = TwoPhaseSink(DeltaSink(uri, app_id="bounded-altered"))
    metrics = sink.write(spark.createDataFrame([(1, "d1"), (2, "d2")], COLUMNS), epoch_id=0)
    assert (metrics.status, metrics.restaged) == ("committed", 1)
    expected = [{"id": i, "day": f"d{i}", "note": None} for i in range(3)]
    assert assert_all_read(spark, uri) == comparable(expected)
    assert_no_orphans(uri)


def test_a_violated_constraint_added_between_staging_and_commit_commits_nothing(
    delta_spark, tmp_path, monkeypatch
):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, COLUMNS, "INSERT INTO {t} VALUES (0, 'd0')")
    constraint = f"ALTER TABLE delta.`{uri}` ADD CONSTRAINT no_d2 CHECK (day <> 'd2')"
    race_before_write(monkeypatch, lambda: spark.sql(constraint))
    sink = TwoPhaseSink(DeltaSink(uri, app_id="bounded-violated"))
    with pytest.raises(ConstraintViolationError, match="no_d2"):
        sink.write(spark.createDataFrame([(1, "d1"), (2, "d2")], COLUMNS), epoch_id=0)
    assert assert_all_read(spark, uri) == comparable([{"id": 0, "day": "d0"}])
    assert_no_orphans(uri)


@pytest.mark.parametrize("mode", ["upsert", "overwrite"])
def test_a_rewrite_staged_before_a_new_column_is_staged_again(
    delta_spark, tmp_path, monkeypatch, mode
):
    """An upsert (rewriting the file of the key it updates) and an overwrite meet delta-spark's
    ADD COLUMNS between their staging and their commit: both are planned again and commit
    once."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, COLUMNS, "INSERT INTO {t} VALUES (0, 'd0'), (1, 'd1')")
    alter = f"ALTER TABLE delta.`{uri}` ADD COLUMNS (note STRING)"
    _before_commit(monkeypatch, lambda: spark.sql(alter))
    # an upsert replaces the whole row of a key: a column the input lacks keeps its value
    options = {"keys": ["id"], "partial_updates": True} if mode == "upsert" else {}
    sink = TwoPhaseSink(DeltaSink(uri, app_id=f"{mode}-altered", mode=mode, **options))
    metrics = sink.write(spark.createDataFrame([(1, "x"), (2, "y")], COLUMNS), epoch_id=0)
    assert (metrics.status, metrics.restaged) == ("committed", 1)
    kept = [{"id": 0, "day": "d0", "note": None}] if mode == "upsert" else []
    expected = [*kept, {"id": 1, "day": "x", "note": None}, {"id": 2, "day": "y", "note": None}]
    assert assert_all_read(spark, uri) == comparable(expected)
    # the files the rewrite removed stay until a vacuum; the stale staging's are gone
    assert data_files_on_disk(uri) == files_ever_added(uri)
    assert staging_leftovers(uri) == []


def test_an_upsert_whose_input_lacks_a_column_added_before_its_commit_fails_naming_it(
    delta_spark, tmp_path, monkeypatch
):
    """Staged again under the new schema, an upsert without ``partial_updates`` is refused as
    it would be from the start (it would set the new column to null in every updated row, as
    delta-spark's MERGE ``UPDATE SET *`` refuses a source without a target column)."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, COLUMNS, "INSERT INTO {t} VALUES (0, 'd0'), (1, 'd1')")
    alter = f"ALTER TABLE delta.`{uri}` ADD COLUMNS (note STRING)"
    _before_commit(monkeypatch, lambda: spark.sql(alter))
    sink = TwoPhaseSink(DeltaSink(uri, app_id="upsert-refused", mode="upsert", keys=["id"]))
    with pytest.raises(SchemaMismatchError, match=r"lacks column\(s\) \['note'\]"):
        sink.write(spark.createDataFrame([(1, "x")], COLUMNS), epoch_id=0)
    expected = [{"id": 0, "day": "d0", "note": None}, {"id": 1, "day": "d1", "note": None}]
    assert assert_all_read(spark, uri) == comparable(expected)
    assert_no_orphans(uri)
