"""Rewrites of tables whose files have deletion vectors, judged by delta-spark: a compaction
drops the deleted rows (both stagings), purges files whose vectors delete many rows, and its
removes carry each file's vector, so that delta-spark, DuckDB and deltalake's DataFusion reader
see exactly the rows they saw before; a vector that changes while the compaction runs makes it
fail with nothing committed; delta-spark keeps deleting, merging, optimizing and vacuuming
afterwards. Vectors the sink writes itself are read by delta-spark, which builds on them. A
table on S3 with vectors under random prefixes is read and compacted there."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, QueryBuilder

from committers.delta import DeltaSink, read_table
from committers.delta.commit._compact import (
    CompactionConflictError,
    CompactionResult,
    compact_table,
)
from committers.delta.inspect._inspect_cli import main
from committers.delta.storage._storage import TableLocation
from committers.tests._delta_spark import comparable, spark_rows
from committers.tests._readers import duckdb_rows
from framework import TwoPhaseSink

pytestmark = pytest.mark.spark


def _dv_table(spark, uri: str, *, rows: int = 3000, files: int = 4) -> None:
    """A table partitioned by ``s`` (three values) with ``files`` files per partition, by
    delta-spark with deletion vectors on, then a DELETE that leaves vectors on every file."""
    (
        spark.range(0, rows)
        .selectExpr("id", "cast(id % 3 as string) as s", "cast(id as double) / 8 as d")
        .repartition(files)
        .write.format("delta")
        .partitionBy("s")
        .option("delta.enableDeletionVectors", "true")
        .save(uri)
    )
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id % 7 = 3")


def _log(uri: str, version: int) -> list[dict]:
    path = Path(uri, "_delta_log", f"{version:020d}.json")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _live_vectors(uri: str, version: int) -> dict[str, dict | None]:
    """Path -> deletion vector of every add of the commits up to ``version`` (no checkpoints
    in these tables), replayed by hand: what delta-spark's log replay keys files by."""
    live: dict[str, dict | None] = {}
    for v in range(version + 1):
        actions = _log(uri, v)
        for a in actions:
            if "remove" in a:
                key = (a["remove"]["path"], json.dumps(a["remove"].get("deletionVector")))
                assert live.pop(key[0], "missing") != "missing", f"remove of a dead file {key}"
        for a in actions:
            if "add" in a:
                live[a["add"]["path"]] = a["add"].get("deletionVector")
    return live


def _every_reader(spark, uri: str) -> list[dict]:
    """delta-spark's rows, after checking DuckDB, DataFusion and read_table agree."""
    by_spark = spark_rows(spark, uri)
    assert comparable(duckdb_rows(uri)) == by_spark
    datafusion = QueryBuilder().register("t", DeltaTable(uri)).execute("SELECT * FROM t")
    assert comparable(pa.table(datafusion.read_all()).to_pylist()) == by_spark
    assert comparable(read_table(spark, uri).toArrow().to_pylist()) == by_spark
    return by_spark


@pytest.mark.usefixtures("each_staging")
def test_compaction_drops_deleted_rows_and_removes_files_with_their_vectors(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri)
    before = _every_reader(spark, uri)
    assert len(before) == 3000 - len(range(3, 3000, 7))
    vectors_before = {
        a["add"]["path"]: a["add"]["deletionVector"] for a in _log(uri, 1) if "add" in a
    }
    assert len(vectors_before) == 12 and all(vectors_before.values())

    result = DeltaSink(uri).compact(spark)
    assert (result.version, result.files_removed, result.files_added) == (2, 12, 3)
    assert result.rows == len(before)
    commit = _log(uri, 2)
    removed = {a["remove"]["path"]: a["remove"] for a in commit if "remove" in a}
    # Each remove names the logical file (path and vector) delta-spark holds live.
    assert {p: r["deletionVector"] for p, r in removed.items()} == vectors_before
    assert all(not r["dataChange"] for r in removed.values())
    added = [a["add"] for a in commit if "add" in a]
    assert all(not a["dataChange"] and "deletionVector" not in a for a in added)
    assert sum(json.loads(a["stats"])["numRecords"] for a in added) == len(before)
    assert set(_live_vectors(uri, 2)) == {a["path"] for a in added}
    assert _every_reader(spark, uri) == before

    # delta-spark keeps working on the compacted table: a DELETE (new vectors), a MERGE,
    # OPTIMIZE and VACUUM, and its rows stay what the operations say.
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id < 100")
    spark.sql(
        f"MERGE INTO delta.`{uri}` t USING (SELECT 5000L AS id, '1' AS s, 1.0D AS d UNION ALL "
        "SELECT 200L, '2', -1.0D) u ON t.id = u.id WHEN MATCHED THEN UPDATE SET d = u.d "
        "WHEN NOT MATCHED THEN INSERT *"
    )
    expected = {r["id"]: r for r in before if r["id"] >= 100}
    expected[200] = {"id": 200, "s": "2", "d": -1.0}
    expected[5000] = {"id": 5000, "s": "1", "d": 1.0}
    assert _every_reader(spark, uri) == comparable(list(expected.values()))
    spark.sql(f"OPTIMIZE delta.`{uri}`")  # (VACUUM after ours: the next test)
    assert _every_reader(spark, uri) == comparable(list(expected.values()))


def _compact_none_small(spark, uri: str) -> CompactionResult:
    """A compaction for which no file is small: only the purge picks files."""
    location = TableLocation.of(uri)
    return compact_table(spark, location, target_file_size=128 << 20, min_file_size=1)


def _inspected_files(capsys, uri: str) -> dict:
    assert main(["inspect", uri, "--json"]) == 0
    return json.loads(capsys.readouterr().out)["files"]


def test_files_deleting_many_rows_are_purged_whatever_their_size(delta_spark, tmp_path, capsys):
    """A file whose vector deletes more than 5 % of its rows is rewritten even when it is big
    enough to be left alone, and even alone in its partition; one deleting fewer is not. The
    inspect CLI counts the rows the vectors delete."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri, rows=3000, files=1)  # one file per partition, 1/7 of rows deleted
    before = _every_reader(spark, uri)
    deleted = len(range(3, 3000, 7))
    files = _inspected_files(capsys, uri)
    assert (files["count"], files["deletion_vectors"]) == (3, 3)
    assert (files["rows"], files["deleted_rows"]) == (3000 - deleted, deleted)
    result = _compact_none_small(spark, uri)
    assert (result.files_removed, result.files_added) == (3, 3)
    assert not any(v for v in _live_vectors(uri, result.version).values())
    assert _every_reader(spark, uri) == before
    files = _inspected_files(capsys, uri)
    assert (files["rows"], files["deletion_vectors"], files["deleted_rows"]) == (len(before), 0, 0)
    # Now nothing is deleted any more: nothing to purge, nothing small.
    assert _compact_none_small(spark, uri).version is None

    spark.sql(f"DELETE FROM delta.`{uri}` WHERE id = 4")  # one row of ~1000: under 5 %
    assert _compact_none_small(spark, uri).version is None
    spark.sql(f"DELETE FROM delta.`{uri}` WHERE s = '1'")  # a whole partition's rows
    expected = [r for r in before if r["id"] != 4 and r["s"] != "1"]
    assert _every_reader(spark, uri) == comparable(expected)


def test_a_vector_changed_during_the_compaction_fails_it_and_commits_nothing(delta_spark, tmp_path):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri)
    version = max(int(p.name[:20]) for p in Path(uri, "_delta_log").glob("*.json"))

    def delete_meanwhile(attempt: int) -> None:
        if attempt == 1:
            spark.sql(f"DELETE FROM delta.`{uri}` WHERE id IN (1, 2)")

    with pytest.raises(CompactionConflictError, match="got a new deletion vector"):
        compact_table(
            spark, TableLocation.of(uri), target_file_size=128 << 20, before_commit=delete_meanwhile
        )
    assert max(int(p.name[:20]) for p in Path(uri, "_delta_log").glob("*.json")) == version + 1
    rows = _every_reader(spark, uri)
    assert {1, 2, 3, 10} & {r["id"] for r in rows} == set()
    assert len(rows) == 3000 - len(range(3, 3000, 7)) - 2
    # The compaction's files were deleted: only the table's own files are left.
    staged = [p for p in Path(uri).rglob("*.parquet") if "_delta_log" not in p.parts]
    live = set(_live_vectors(uri, version + 1))
    assert {p.relative_to(uri).as_posix() for p in staged} == live


def _live_adds(uri: str) -> dict[str, dict]:
    """Path -> the add action of every live file (no checkpoints in these tables)."""
    version = max(int(p.name[:20]) for p in Path(uri, "_delta_log").glob("*.json"))
    live: dict[str, dict] = {}
    for v in range(version + 1):
        actions = _log(uri, v)
        for a in actions:
            if "remove" in a:
                live.pop(a["remove"]["path"], None)
        for a in actions:
            if "add" in a:
                live[a["add"]["path"]] = a["add"]
    return live


@pytest.mark.parametrize(
    ("staging", "vectors", "feed"), [("auto", "off", False), ("spark", "auto", True)]
)
def test_replace_where_on_data_columns_never_brings_back_a_deleted_row(
    delta_spark, tmp_path, staging, vectors, feed
):
    """An overwrite whose replace_where reads a data column either rewrites the files holding
    matching rows without them and without the rows their vectors delete
    (``deletion_vectors="off"``), or (``"auto"``, the table enables vectors) marks the matching
    rows in new vectors and adds each file back with its new vector, writing only the new rows;
    either way it removes each file with its old vector; with the change data feed on,
    delta-spark's feed reports the live rows replaced, never a deleted one."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri)
    if feed:
        spark.sql(
            f"ALTER TABLE delta.`{uri}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
        )
    version = DeltaTable(uri).version()
    before = _every_reader(spark, uri)
    vectors_before = _live_vectors(uri, version)
    new = [(i, str(i % 3), -1.0) for i in (3, 10, 100, 101, 102)]  # (3, 10: deleted before)
    sink = DeltaSink(
        uri, mode="overwrite", replace_where="id < 800", staging=staging, deletion_vectors=vectors
    )
    TwoPhaseSink(sink).write(spark.createDataFrame(new, "id long, s string, d double"))

    replaced = [r for r in before if r["id"] < 800]
    expected = [r for r in before if r["id"] >= 800] + [
        {"id": i, "s": s_, "d": d} for i, s_, d in new
    ]
    assert _every_reader(spark, uri) == comparable(expected)
    commit = _log(uri, version + 1)
    removes = {a["remove"]["path"]: a["remove"] for a in commit if "remove" in a}
    assert removes and all(r["deletionVector"] == vectors_before[p] for p, r in removes.items())
    adds = {a["add"]["path"]: a["add"] for a in commit if "add" in a}
    re_added = {p: a for p, a in adds.items() if p in removes}
    if vectors == "auto":  # every file kept some rows: each is added back, none rewritten
        assert set(re_added) == set(removes)
        new_files = [a for p, a in adds.items() if p not in re_added]
        written = [json.loads(a["stats"])["numRecords"] for a in new_files]
        assert sum(written) == len(new)  # no row copied: the new rows only
        for path, add in re_added.items():
            assert add["deletionVector"]["storageType"] == "u"
            assert add["deletionVector"] != removes[path]["deletionVector"]
            assert json.loads(add["stats"])["tightBounds"] is False
        marked = sum(a["deletionVector"]["cardinality"] for a in re_added.values())
        old = sum((removes[p]["deletionVector"] or {}).get("cardinality", 0) for p in re_added)
        assert marked - old == len(replaced)  # exactly the live rows replaced
    else:
        assert not re_added
    if feed:
        changes = spark.sql(f"SELECT * FROM table_changes_by_path('{uri}', {version + 1})")
        rows = changes.select("id", "s", "d", "_change_type").toArrow().to_pylist()
        by_type = {
            kind: comparable(
                [{k: r[k] for k in ("id", "s", "d")} for r in rows if r["_change_type"] == kind]
            )
            for kind in ("delete", "insert")
        }
        assert by_type["delete"] == comparable(replaced)  # (no row a vector deleted)
        assert by_type["insert"] == comparable([{"id": i, "s": s_, "d": d} for i, s_, d in new])


def test_a_table_on_s3_with_vectors_under_random_prefixes(delta_spark, s3, bucket, tmp_path):
    """A delta-spark table whose data files and vectors sit under random prefix directories
    (``delta.randomizeFilePrefixes``), copied to the S3 server: read through fsspec and
    compacted there (removes carrying the vectors, written with a conditional PUT); the rows
    stay what delta-spark read, as deltalake's DataFusion reader sees them too."""
    spark = delta_spark
    local = str(tmp_path / "t")
    spark.sql(
        f"CREATE TABLE delta.`{local}` (id BIGINT, s STRING, d DOUBLE) USING delta "
        "PARTITIONED BY (s) TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', "
        "'delta.randomizeFilePrefixes' = 'true')"
    )
    for part in range(3):
        spark.range(part * 400, (part + 1) * 400).selectExpr(
            "id", "cast(id % 3 as string) as s", "cast(id as double) / 8 as d"
        ).write.format("delta").mode("append").save(local)
    spark.sql(f"DELETE FROM delta.`{local}` WHERE id % 7 = 3")
    expected = spark_rows(spark, local)
    vectors = list(Path(local).rglob("deletion_vector_*.bin"))
    assert vectors and all(p.parent != Path(local) for p in vectors)  # under prefixes

    client = s3.client()
    for path in Path(local).rglob("*"):
        if path.is_file():
            key = f"dv/{path.relative_to(local).as_posix()}"
            client.upload_file(str(path), bucket, key)
    uri = f"s3://{bucket}/dv"
    options = s3.storage_options()
    assert comparable(read_table(spark, uri, storage_options=options).toArrow().to_pylist()) == (
        expected
    )
    result = DeltaSink(uri, storage_options=options).compact(spark)
    assert (result.rows, result.files_removed) == (len(expected), len(_live_adds(local)))
    assert comparable(read_table(spark, uri, storage_options=options).toArrow().to_pylist()) == (
        expected
    )
    table = DeltaTable(uri, storage_options=options)
    datafusion = QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all()
    assert comparable(pa.table(datafusion).to_pylist()) == expected
