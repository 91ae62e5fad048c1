"""Column defaults (delta-spark's ``DEFAULT``, the ``allowColumnDefaults`` feature) on tables
delta-spark made: a column the input lacks gets its default, evaluated by Spark once per batch
as delta-spark evaluates it once per statement; a value the input gives, NULL included, is
kept. Appends (both stagings), a stream, an overwrite and an upsert with partial updates
(an updated row keeps its stored value, an inserted one gets the default); delta-spark,
delta-rs and DuckDB read the same rows, and delta-spark keeps writing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.tests._delta_helpers import assert_no_orphans
from committers.tests._delta_spark import assert_all_read, comparable
from committers.tests.delta.interop.test_interop_delta_spark_write import _create
from framework import TwoPhaseSink
from framework.errors import SchemaMismatchError

pytestmark = pytest.mark.spark

COLUMNS = (
    "id BIGINT, v INT DEFAULT 7, note STRING DEFAULT concat('n', '/', 'a'), "
    "at TIMESTAMP DEFAULT current_timestamp(), day DATE DEFAULT DATE'2026-11-30'"
)
# (a checkpoint every two versions: the sink's log maintenance runs on such tables too)
DEFAULTS_ON = (
    "TBLPROPERTIES ('delta.feature.allowColumnDefaults' = 'supported', "
    "'delta.checkpointInterval' = '2')"
)


def _table(spark, tmp_path, *statements: str, clauses: str = DEFAULTS_ON) -> str:  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "t")
    _create(spark, uri, COLUMNS, *statements, clauses=clauses)
    return uri


def _rows(spark, uri: str) -> list[dict]:  # type: ignore[no-untyped-def]
    """Every reader's rows (``at`` aside: checked on its own), by id."""
    rows = assert_all_read(spark, uri)
    return sorted(({k: v for k, v in r.items() if k != "at"} for r in rows), key=lambda r: r["id"])


def _set_default(commit: Path, column: str, expression: str) -> None:
    """Rewrite the ``CURRENT_DEFAULT`` of ``column`` in the ``metaData`` of ``commit``."""
    actions = [json.loads(line) for line in commit.read_text().splitlines()]
    for action in actions:
        if "metaData" in action:
            schema = json.loads(action["metaData"]["schemaString"])
            for f in schema["fields"]:
                if f["name"] == column:
                    f["metadata"]["CURRENT_DEFAULT"] = expression
            action["metaData"]["schemaString"] = json.dumps(schema)
    commit.write_text("".join(json.dumps(a) + "\n" for a in actions))
    for checksum in commit.parent.glob("*.crc"):  # (readers take the metadata from them too)
        checksum.unlink()


def _instants(uri: str) -> dict[int, dt.datetime | None]:
    table = DeltaTable(uri).to_pyarrow_table(columns=["id", "at"]).to_pylist()
    return {r["id"]: r["at"] for r in table}


def test_an_append_lacking_columns_gets_their_defaults_and_keeps_given_nulls(
    delta_spark, tmp_path, each_staging
):
    spark = delta_spark
    uri = _table(spark, tmp_path, "INSERT INTO {t} (id) VALUES (1)")
    before = dt.datetime.now(dt.timezone.utc)
    lacking = spark.createDataFrame([(2,), (3,)], "id BIGINT")
    TwoPhaseSink(DeltaSink(uri, app_id="a")).write(lacking)
    given = spark.createDataFrame([(4, None, "given")], "id BIGINT, v INT, note STRING")
    TwoPhaseSink(DeltaSink(uri, app_id="b")).write(given)
    after = dt.datetime.now(dt.timezone.utc)
    spark.sql(f"INSERT INTO delta.`{uri}` (id, v) VALUES (5, 50)")

    default = {"v": 7, "note": "n/a", "day": dt.date(2026, 11, 30)}
    assert _rows(spark, uri) == comparable(
        [
            {"id": 1, **default},
            {"id": 2, **default},
            {"id": 3, **default},
            {"id": 4, "v": None, "note": "given", "day": dt.date(2026, 11, 30)},
            {"id": 5, **default, "v": 50},
        ]
    )
    instants = _instants(uri)
    assert instants[2] == instants[3]  # one instant per batch, as per statement in delta-spark
    assert before <= instants[2] <= instants[4] <= after
    assert_no_orphans(uri)


def test_a_stream_and_an_overwrite_fill_defaults_per_batch(delta_spark, tmp_path):
    spark = delta_spark
    uri = _table(spark, tmp_path)
    sink = TwoPhaseSink(DeltaSink(uri, app_id="s"))
    for batch_id, ids in enumerate([(1, 2), (3,)]):
        sink.write(spark.createDataFrame([(i,) for i in ids], "id BIGINT"), epoch_id=batch_id)
    instants = _instants(uri)
    assert instants[1] == instants[2] != instants[3]
    DeltaSink(uri).compact(spark)
    assert _instants(uri) == instants
    assert list((Path(uri) / "_delta_log").glob("*.checkpoint.parquet"))
    # A new column (delta-rs cannot commit to the table: the sink's log writer adds it, the
    # defaults kept, as the overwrite below shows).
    TwoPhaseSink(DeltaSink(uri, app_id="m", schema_mode="merge")).write(
        spark.createDataFrame([(5, "n")], "id BIGINT, extra STRING")
    )
    overwrite = DeltaSink(uri, app_id="o", mode="overwrite")
    TwoPhaseSink(overwrite).write(spark.createDataFrame([(9, "x")], "id BIGINT, note STRING"))
    assert _rows(spark, uri) == [
        {"id": 9, "v": 7, "note": "x", "day": dt.date(2026, 11, 30), "extra": None}
    ]


def test_an_upsert_keeps_stored_values_and_inserts_defaults(delta_spark, tmp_path):
    """``partial_updates``: the input lacks ``v`` and ``day``; key 1 (stored ``v`` NULL) keeps
    its NULL, key 2 its 20; the new key 3 gets the defaults."""
    spark = delta_spark
    uri = _table(
        spark, tmp_path, "INSERT INTO {t} (id, v, note) VALUES (1, NULL, 'a'), (2, 20, 'b')"
    )
    changes = spark.createDataFrame(
        [(1, "a2", "U"), (2, "b2", "U"), (3, "c", "U")], "id BIGINT, note STRING, op STRING"
    )
    sink = DeltaSink(
        uri,
        app_id="u",
        mode="upsert",
        keys=["id"],
        delete_when="op = 'D'",
        partial_updates=True,
    )
    TwoPhaseSink(sink).write(changes)
    day = dt.date(2026, 11, 30)
    assert _rows(spark, uri) == [
        {"id": 1, "v": None, "note": "a2", "day": day},
        {"id": 2, "v": 20, "note": "b2", "day": day},
        {"id": 3, "v": 7, "note": "c", "day": day},
    ]
    spark.sql(
        f"MERGE INTO delta.`{uri}` t USING (SELECT 4L AS id) s ON t.id = s.id "
        "WHEN NOT MATCHED THEN INSERT (id) VALUES (s.id)"
    )
    assert [r["v"] for r in _rows(spark, uri)] == [None, 20, 7, 7]


def test_the_format_refuses_a_table_with_defaults_by_name(delta_spark, tmp_path):
    """The ``"deltalake"`` format checks rules in Arrow and cannot evaluate Spark SQL."""
    from committers.delta import register

    spark = delta_spark
    register(spark)
    uri = _table(spark, tmp_path, "INSERT INTO {t} (id) VALUES (1)")
    version = DeltaTable(uri).version()
    with pytest.raises(Exception, match=r"column defaults of at, day, note, v"):
        spark.createDataFrame([(2,)], "id BIGINT").write.format("deltalake").mode("append").save(
            uri
        )
    assert DeltaTable(uri).version() == version


def test_a_default_spark_cannot_evaluate_fails_the_batch_by_name(delta_spark, tmp_path):
    """A default no Spark of this session can evaluate (here a function it lacks, written into
    the log by hand) fails the write naming the column, with nothing committed or staged."""
    spark = delta_spark
    uri = _table(spark, tmp_path, "INSERT INTO {t} (id) VALUES (1)")
    _set_default(Path(uri) / "_delta_log" / f"{0:020d}.json", "v", "no_such_function(7)")
    assert "no_such_function(7)" in DeltaTable(uri).schema().to_json()
    version = DeltaTable(uri).version()
    unevaluable = r"default of column 'v' \(CAST\(\(no_such_function\(7\)\) AS INT\)\): "
    with pytest.raises(SchemaMismatchError, match=unevaluable + ".*UNRESOLVED_ROUTINE"):
        TwoPhaseSink(DeltaSink(uri)).write(spark.createDataFrame([(2,)], "id BIGINT"))
    assert DeltaTable(uri).version() == version
    assert_no_orphans(uri)
