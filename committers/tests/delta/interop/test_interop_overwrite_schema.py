"""An overwrite that replaces the table's schema and partitioning (``schema_mode="overwrite"``,
delta-spark's ``overwriteSchema``) on tables delta-spark made: partitioned with a CHECK
constraint and a generated column, with live deletion vectors, with column mapping after a
rename. delta-spark reads back exactly the new rows under the new schema and partitioning and
keeps writing afterwards; delta-rs and DuckDB read the same rows. Replays commit once, a
killed driver's re-run once, and bad input commits nothing and leaves nothing staged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from committers.delta import DeltaSink
from committers.tests._delta_helpers import (
    data_files_on_disk,
    files_ever_added,
    staging_leftovers,
)
from committers.tests._delta_spark import comparable, delta_rs_rows, spark_rows
from committers.tests._readers import duckdb_rows
from committers.tests._schema_overwrite_driver import NEW_ROWS, overwrite_schema
from committers.tests.delta.interop.test_interop_delta_spark_write import _create
from framework import TwoPhaseSink
from framework._crash import CRASH_VARIABLE
from framework.errors import ConfigurationError, ConstraintViolationError, SchemaMismatchError

pytestmark = pytest.mark.spark

REPO_ROOT = Path(__file__).resolve().parents[4]
OLD = "id INT, v STRING, p INT"
OLD_ROWS = "INSERT INTO {t} (id, v, p) VALUES (1, 'a', 1), (2, 'b', 1), (3, 'c', 2)"
NEW_COLUMNS = ["id", "name", "day", "score"]


def _new_rows(spark, rows=NEW_ROWS):  # type: ignore[no-untyped-def]
    return spark.createDataFrame(rows, "id long, name string, day string, score double")


def _expected(rows=NEW_ROWS) -> str:
    """The rows every reader must read, as the repr of :func:`comparable` (NaN equal to NaN)."""
    return repr(comparable([dict(zip(NEW_COLUMNS, r, strict=True)) for r in rows]))


def _read_by(spark, uri: str, *others: str) -> str:  # type: ignore[no-untyped-def]
    """The rows delta-spark reads, which the ``others`` (``deltalake``: its pyarrow dataset;
    ``datafusion``: its QueryBuilder; ``duckdb``) must read alike; as the repr of
    :func:`comparable` (NaN equal to NaN)."""
    by_spark = repr(spark_rows(spark, uri))
    readers = {
        "deltalake": lambda: delta_rs_rows(uri),
        "datafusion": lambda: comparable(
            pa.table(
                QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT * FROM t")
            ).to_pylist()
        ),
        "duckdb": lambda: comparable(duckdb_rows(uri)),
    }
    for name in others:
        assert repr(readers[name]()) == by_spark, name
    return by_spark


def _log(uri: str, version: int) -> list[dict]:
    text = (Path(uri) / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines()]


def _detail(spark, uri: str):  # type: ignore[no-untyped-def]
    return spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0]


def _schema_of(spark, uri: str) -> list[tuple[str, str]]:
    return [
        (f.name, f.dataType.simpleString()) for f in spark.read.format("delta").load(uri).schema
    ]


def test_the_schema_and_partitioning_are_replaced_in_one_commit_with_the_rows(
    delta_spark, tmp_path, each_staging
):
    """A partitioned delta-spark table with a CHECK constraint and a generated column: the
    overwrite makes it the input's columns and types, partitioned by ``day``, in one
    commit; delta-spark then inserts under the new schema and still enforces the
    constraint; a replay of the epoch commits nothing."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        f"{OLD}, g INT GENERATED ALWAYS AS (id * 2)",
        OLD_ROWS,
        "ALTER TABLE {t} ADD CONSTRAINT positive CHECK (id > 0)",
        clauses="PARTITIONED BY (p)",
    )
    before = DeltaTable(uri).version()
    metrics = overwrite_schema(spark, uri)
    assert metrics.status == "committed"
    version = DeltaTable(uri).version()
    assert version == before + 1

    assert _read_by(spark, uri, "deltalake", "duckdb") == _expected()
    assert _schema_of(spark, uri) == [
        ("id", "bigint"),
        ("name", "string"),
        ("day", "string"),
        ("score", "double"),
    ]
    detail = _detail(spark, uri)
    assert list(detail["partitionColumns"]) == ["day"]
    assert detail["properties"]["delta.constraints.positive"] == "id > 0"
    actions = _log(uri, version)
    (info,) = [a["commitInfo"] for a in actions if "commitInfo" in a]
    assert info["operationParameters"]["mode"] == "Overwrite"
    (metadata,) = [a["metaData"] for a in actions if "metaData" in a]
    assert metadata["partitionColumns"] == ["day"]
    assert {a["add"]["partitionValues"]["day"] for a in actions if "add" in a} == {
        "2026-11-01",
        "2026-11-02",
    }
    assert sum("remove" in a for a in actions) == len(DeltaTable(uri, version=before).file_uris())
    assert [a["txn"]["version"] for a in actions if "txn" in a] == [1]

    assert overwrite_schema(spark, uri).status == "skipped"  # the replay
    assert DeltaTable(uri).version() == version

    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (9, 'spark', '2026-11-03', 0.5)")
    with pytest.raises(Exception, match="positive"):
        spark.sql(f"INSERT INTO delta.`{uri}` VALUES (-1, 'x', '2026-11-03', 0.5)")
    with pytest.raises(ConstraintViolationError, match="positive"):
        TwoPhaseSink(DeltaSink(uri)).write(_new_rows(spark, [(-5, "x", "2026-11-03", 1.0)]))
    assert _read_by(spark, uri, "deltalake", "duckdb") == _expected(
        [*NEW_ROWS, (9, "spark", "2026-11-03", 0.5)]
    )
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []


def test_files_with_deletion_vectors_are_removed_with_their_vectors(delta_spark, tmp_path):
    """delta-spark's DELETE left a vector on a live file: the overwrite's remove of that file
    names the vector (else a reader would take the file and its vector for different
    logical files), and no deleted or old row comes back."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        OLD,
        OLD_ROWS,
        "DELETE FROM {t} WHERE id = 2",
        clauses="TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
    )
    assert any(a.get("deletionVector") for a in _adds_of(uri))
    overwrite_schema(spark, uri)
    removes = [a["remove"] for a in _log(uri, DeltaTable(uri).version()) if "remove" in a]
    assert any(r.get("deletionVector") for r in removes)
    assert _read_by(spark, uri, "duckdb") == _expected()
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 10")
    assert _read_by(spark, uri, "duckdb") == _expected(NEW_ROWS[1:])


def _adds_of(uri: str) -> list[dict]:
    return [
        a["add"] for v in range(DeltaTable(uri).version() + 1) for a in _log(uri, v) if "add" in a
    ]


def test_a_column_mapped_table_gets_new_ids_and_physical_names(delta_spark, tmp_path):
    """Column mapping (name mode), partitioned, with a renamed column: each new column gets an
    id past ``maxColumnId`` and a physical name no file of the table ever used, so an old
    file's ``v`` can never be read as a new column; delta-spark and delta-rs read the new
    rows."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(
        spark,
        uri,
        OLD,
        OLD_ROWS,
        "ALTER TABLE {t} RENAME COLUMN v TO name",
        clauses="PARTITIONED BY (p) TBLPROPERTIES ('delta.columnMapping.mode' = 'name')",
    )
    old = json.loads(DeltaTable(uri).schema().to_json())
    old_max = int(DeltaTable(uri).metadata().configuration["delta.columnMapping.maxColumnId"])
    overwrite_schema(spark, uri)
    new = json.loads(DeltaTable(uri).schema().to_json())
    ids = [f["metadata"]["delta.columnMapping.id"] for f in new["fields"]]
    assert ids == list(range(old_max + 1, old_max + 5))
    configuration = DeltaTable(uri).metadata().configuration
    assert configuration["delta.columnMapping.maxColumnId"] == str(old_max + 4)
    old_names = {f["metadata"]["delta.columnMapping.physicalName"] for f in old["fields"]}
    new_names = {f["metadata"]["delta.columnMapping.physicalName"] for f in new["fields"]}
    assert not old_names & new_names
    # The removes key the old files' partition values by physical name, as the log does.
    (p,) = [f for f in old["fields"] if f["name"] == "p"]
    removes = [a["remove"] for a in _log(uri, DeltaTable(uri).version()) if "remove" in a]
    assert {tuple(r["partitionValues"]) for r in removes} == {
        (p["metadata"]["delta.columnMapping.physicalName"],)
    }
    # Not DuckDB: its delta extension reads the partition columns of column-mapped tables as
    # NULL, delta-spark's own tables included (DuckDB 1.5.5).
    assert _read_by(spark, uri, "datafusion") == _expected()
    spark.sql(f"INSERT INTO delta.`{uri}` VALUES (9, 'spark', '2026-11-03', 0.5)")
    assert len(spark_rows(spark, uri)) == len(NEW_ROWS) + 1


def test_bad_input_commits_nothing_and_leaves_nothing_staged(delta_spark, tmp_path):
    """Options that contradict it are refused at once; a constraint naming a dropped column,
    and rows breaking a kept constraint, fail the write with the table unchanged."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, OLD, OLD_ROWS, "ALTER TABLE {t} ADD CONSTRAINT has_v CHECK (v <> '')")
    with pytest.raises(ConfigurationError, match="needs mode='overwrite'"):
        DeltaSink(uri, schema_mode="overwrite")
    with pytest.raises(ConfigurationError, match="replace_where"):
        DeltaSink(uri, mode="overwrite", schema_mode="overwrite", replace_where="p = 1")
    with pytest.raises(ConfigurationError, match="schema_mode='overwrite'"):
        DeltaSink(uri, mode="overwrite", overwriteSchema=True)  # type: ignore[call-arg]
    version = DeltaTable(uri).version()
    with pytest.raises(SchemaMismatchError, match=r"has_v.*\['v'\].*DROP CONSTRAINT has_v"):
        overwrite_schema(spark, uri)
    spark.sql(f"ALTER TABLE delta.`{uri}` DROP CONSTRAINT has_v")
    spark.sql(f"ALTER TABLE delta.`{uri}` ADD CONSTRAINT low CHECK (id < 11)")
    version = DeltaTable(uri).version()
    with pytest.raises(ConstraintViolationError, match="low"):
        overwrite_schema(spark, uri)  # id 12 breaks it
    assert DeltaTable(uri).version() == version
    assert _schema_of(spark, uri) == [("id", "int"), ("v", "string"), ("p", "int")]
    assert len(spark_rows(spark, uri)) == 3
    assert staging_leftovers(uri) == []


def test_a_driver_killed_at_the_commit_replaces_the_schema_once_on_rerun(delta_spark, tmp_path):
    """The driver is SIGKILLed as it writes the commit: the re-run of the same epoch commits
    the replacement once (or finds it committed) and leaves nothing staged."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _create(spark, uri, OLD, OLD_ROWS, clauses="PARTITIONED BY (p)")
    before = DeltaTable(uri).version()
    process = subprocess.run(
        [sys.executable, "-m", "committers.tests._schema_overwrite_driver", uri],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), CRASH_VARIABLE: "commit_write@1"},
        capture_output=True,
        text=True,
        start_new_session=True,  # the crash kills its own process group, not pytest's
        timeout=600,
        check=False,
    )
    assert process.returncode == -signal.SIGKILL, process.stdout[-3000:]
    assert "CRASH AT commit_write epoch=1" in process.stdout
    landed = DeltaTable(uri).version() == before + 1
    metrics = overwrite_schema(spark, uri)
    assert metrics.status == ("skipped" if landed else "committed")
    assert DeltaTable(uri).version() == before + 1
    assert _read_by(spark, uri, "deltalake", "duckdb") == _expected()
    assert list(_detail(spark, uri)["partitionColumns"]) == ["day"]
    assert data_files_on_disk(uri) <= files_ever_added(uri) and staging_leftovers(uri) == []
