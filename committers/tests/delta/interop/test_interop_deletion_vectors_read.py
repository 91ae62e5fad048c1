"""Every reader gives delta-spark's own rows of tables whose rows delta-spark deleted with
deletion vectors (DELETE, UPDATE, MERGE): ``read_table`` (Spark's native Parquet scan),
``spark.read.format("deltalake")`` (the Python reader), DuckDB's delta extension and
deltalake's QueryBuilder, with partition and stats filters and time travel; vectors stored
inline or at an absolute path read the same; a damaged or missing vector fails the read naming
the data file and the vector; the streaming source reads a snapshot without deleted rows and
stops at (or skips) a later DELETE."""

from __future__ import annotations

import datetime
import json
import logging
import re
import shutil
import struct
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

from committers.delta import DeletionVectorError, read_table, register
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import (
    DeletionVectorDescriptor,
    vector_file,
    z85_encode,
)
from committers.tests._delta_spark import comparable, spark_rows
from committers.tests._readers import duckdb_with_delta
from committers.tests._spark_helpers import drain_available_now

pytestmark = pytest.mark.spark

ODD = ["a b", "100%", "k=v", "ü€𠮷", None]
DAYS = [datetime.date(2024, 2, 28), datetime.date(2024, 2, 29)]
# The unpartitioned table: two files of 10,000 rows each in many row groups and pages.
ROWS = 20_000


def _sql(spark, text: str, uri: str) -> None:
    spark.sql(text.replace("{t}", f"delta.`{uri}`"))


def _commit(uri: str, version: int) -> list[dict]:
    path = Path(uri, "_delta_log", f"{version:020d}.json")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _vectors_added(uri: str, version: int) -> int:
    return sum(1 for a in _commit(uri, version) if a.get("add", {}).get("deletionVector"))


@pytest.fixture(scope="module")
def tables(delta_spark, tmp_path_factory):
    """Two delta-spark tables with deletion vectors and the ids each version holds.

    ``partitioned``: by a string (values with a space, ``%``, ``=``, non-BMP text and null) and
    a date, 3,000 rows in about 30 files; version 1 DELETEs, 2 UPDATEs, 3 MERGEs.
    ``flat``: unpartitioned, 20,000 rows in two files of many row groups; version 1 DELETEs.
    """
    spark = delta_spark
    root = tmp_path_factory.mktemp("dv")
    partitioned, flat = str(root / "partitioned"), str(root / "flat")
    odd = ", ".join("NULL" if v is None else f"'{v}'" for v in ODD)
    spark.range(0, 3000, 1, 3).selectExpr(
        "id",
        "CAST(id AS STRING) AS s",
        f"element_at(array({odd}), CAST(id % 5 AS INT) + 1) AS p",
        f"date_add(DATE'{DAYS[0]}', CAST(id % 2 AS INT)) AS d",
    ).write.format("delta").partitionBy("p", "d").option(
        "delta.enableDeletionVectors", "true"
    ).save(partitioned)
    _sql(spark, "DELETE FROM {t} WHERE id % 7 = 0", partitioned)
    _sql(spark, "UPDATE {t} SET s = concat(s, '-u') WHERE id % 11 = 1", partitioned)
    spark.range(2990, 3010).selectExpr(
        "id", "CASE WHEN id % 2 = 0 THEN 'd' ELSE 'u' END AS op"
    ).createOrReplaceTempView("dv_merge_source")
    _sql(
        spark,
        "MERGE INTO {t} AS t USING dv_merge_source AS src ON t.id = src.id "
        "WHEN MATCHED AND src.op = 'd' THEN DELETE "
        "WHEN MATCHED THEN UPDATE SET s = 'merged' "
        "WHEN NOT MATCHED THEN INSERT (id, s, p, d) "
        f"VALUES (src.id, 'new', 'k=v', DATE'{DAYS[1]}')",
        partitioned,
    )
    for version in (1, 2, 3):  # each change left vectors, not rewritten files
        assert _vectors_added(partitioned, version) > 0, version

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("parquet.block.size", str(32 * 1024))
    hadoop.set("parquet.page.size", "2048")
    try:
        spark.range(0, ROWS, 1, 2).selectExpr("id", "CAST(id AS STRING) AS s").write.format(
            "delta"
        ).option("delta.enableDeletionVectors", "true").save(flat)
    finally:
        hadoop.unset("parquet.block.size")
        hadoop.unset("parquet.page.size")
    _sql(spark, "DELETE FROM {t} WHERE id % 3 = 0", flat)
    assert _vectors_added(flat, 1) == 2
    for add in _commit(flat, 0):
        if "add" in add:
            assert pq.ParquetFile(Path(flat, add["add"]["path"])).metadata.num_row_groups > 1

    present = set(range(3000)) - {i for i in range(3000) if i % 7 == 0}
    source = set(range(2990, 3010))  # MERGE: even matched ids deleted, unmatched ids inserted
    merged = (present - {i for i in source & present if i % 2 == 0}) | (source - present)
    return {
        "partitioned": partitioned,
        "flat": flat,
        "partitioned_ids": {
            0: set(range(3000)),
            1: present,
            3: merged,
        },
        "flat_ids": {0: set(range(ROWS)), 1: {i for i in range(ROWS) if i % 3}},
    }


def _native(spark, uri: str, version: int | None = None):
    df = read_table(spark, uri, version=version)
    plan = df._jdf.queryExecution().executedPlan().toString()
    assert "FileScan parquet" in plan and "BatchScan" not in plan, plan
    return df


def _python(spark, uri: str, version: int | None = None):
    register(spark)
    reader = spark.read.format("deltalake")
    if version is not None:
        reader = reader.option("versionAsOf", str(version))
    return reader.load(uri)


def _rows(df, where: str | None) -> list[dict]:
    return comparable((df if where is None else df.where(where)).toArrow().to_pylist())


def _sql_rows(uri: str, where: str | None, version: int | None = None) -> dict[str, list]:
    """DuckDB's (latest version only) and QueryBuilder's rows."""
    clause = "" if where is None else f" WHERE {where}"
    table = DeltaTable(uri, version=version)
    by_datafusion = QueryBuilder().register("t", table).execute(f"SELECT * FROM t{clause}")
    found = {"QueryBuilder": comparable(pa.table(by_datafusion.read_all()).to_pylist())}
    if version is None:
        with duckdb_with_delta() as con:
            arrow = con.execute(f"SELECT * FROM delta_scan(?){clause}", [uri]).to_arrow_table()
        found["DuckDB"] = comparable(arrow.to_pylist())
    return found


def _assert_every_reader(spark, uri: str, where: str | None = None, version=None) -> list[dict]:
    """Each reader's rows (with ``where``, at ``version``) equal delta-spark's; returns them."""
    options = {} if version is None else {"versionAsOf": version}
    expected = spark_rows(spark, uri, where, **options)
    assert _rows(_native(spark, uri, version), where) == expected, "read_table"
    assert _rows(_python(spark, uri, version), where) == expected, "deltalake format"
    for reader, rows in _sql_rows(uri, where, version).items():
        assert rows == expected, reader
    return expected


@pytest.mark.smoke  # make check: the end-to-end test of its feature
def test_partitioned_table_read_by_every_reader(delta_spark, tables):
    spark, uri, ids = delta_spark, tables["partitioned"], tables["partitioned_ids"]
    latest = _assert_every_reader(spark, uri)
    assert sorted(r["id"] for r in latest) == sorted(ids[3])
    assert sum(r["s"].endswith("-u") for r in latest) == len(
        [i for i in ids[3] if i % 11 == 1 and i < 3000 and i not in range(2990, 3010)]
    )
    for value in ODD:  # partition filters, every odd value and the null
        where = "p IS NULL" if value is None else f"p = '{value}'"
        rows = _assert_every_reader(spark, uri, where)
        assert rows and all(r["p"] == value for r in rows)
    rows = _assert_every_reader(spark, uri, f"d = DATE'{DAYS[1]}' AND id BETWEEN 100 AND 400")
    assert sorted(r["id"] for r in rows) == sorted(
        i for i in ids[3] & set(range(100, 401)) if i % 2
    )
    for version in (0, 1):  # before the DELETE, and before the UPDATE
        rows = _assert_every_reader(spark, uri, version=version)
        assert sorted(r["id"] for r in rows) == sorted(ids[version])


def test_row_groups_and_pages_skipped_by_filters_keep_row_indexes(delta_spark, tables):
    """A stats filter makes Spark skip row groups and pages, and small splits cut each file
    into several tasks: deleted rows are still found by their index in the whole file."""
    spark, uri, ids = delta_spark, tables["flat"], tables["flat_ids"]
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(16 * 1024))
    try:
        rows = _assert_every_reader(spark, uri)
        assert sorted(r["id"] for r in rows) == sorted(ids[1])
        for low, high in ((7000, 7100), (12_345, 19_999), (0, 5)):
            where = f"id BETWEEN {low} AND {high}"
            rows = _assert_every_reader(spark, uri, where)
            assert sorted(r["id"] for r in rows) == [i for i in range(low, high + 1) if i % 3]
        rows = _assert_every_reader(spark, uri, version=0)
        assert len(rows) == ROWS
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)


def _copy(uri: str, target: Path) -> str:
    """A copy of the table without delta-spark's checksum files (they describe the original
    commits, which the tests rewrite)."""
    shutil.copytree(uri, target)
    for crc in target.glob("_delta_log/*.crc"):
        crc.unlink()
    return str(target)


def _rewrite(uri: str, version: int, change) -> None:
    """Rewrite commit ``version``, passing each add action with a vector to ``change``."""
    actions = _commit(uri, version)
    adds = [a["add"] for a in actions if a.get("add", {}).get("deletionVector")]
    for index, add in enumerate(adds):
        change(index, add)
    # Raw UTF-8, as delta-spark writes: deltalake 1.6 decodes a JSON surrogate pair escape
    # (\ud842\udfb7) in a path to the wrong character.
    Path(uri, "_delta_log", f"{version:020d}.json").write_text(
        "".join(json.dumps(a, ensure_ascii=False) + "\n" for a in actions), encoding="utf-8"
    )


def _bin_file(uri: str) -> Path:
    (found,) = Path(uri).glob("deletion_vector_*.bin")
    return found


def test_inline_and_absolute_path_vectors_read_the_same(delta_spark, tables, tmp_path, caplog):
    """The MERGE's vectors of two files rewritten: one inline, one at an absolute path (a copy
    of the vector file in a directory with a space). The first file is also moved out of its
    partition directories, so read_table takes its partition values from the log."""
    spark = delta_spark
    expected = spark_rows(spark, tables["partitioned"])
    uri = _copy(tables["partitioned"], tmp_path / "copy")
    location = TableLocation.of(uri)
    moved = Path(uri, "dv dir", "moved vector.bin")
    moved.parent.mkdir()

    def change(index: int, add: dict) -> None:
        vector = add["deletionVector"]
        offset, size = vector["offset"], vector["sizeInBytes"]
        data = Path(vector_file(DeletionVectorDescriptor.from_json(vector), location)).read_bytes()
        if index == 0:  # inline: the serialized bitmap itself, in Z85
            (stored,) = struct.unpack_from(">i", data, offset)
            assert stored == size
            vector.update(
                storageType="i", pathOrInlineDv=z85_encode(data[offset + 4 : offset + 4 + size])
            )
            del vector["offset"]
            data_file = Path(uri, unquote(add["path"]))
            shutil.copyfile(data_file, Path(uri, "moved here", data_file.name))
            add["path"] = quote(f"moved here/{data_file.name}")
        elif index == 1:  # an absolute path, URI-encoded like an add action's path
            moved.write_bytes(data)
            vector.update(storageType="p", pathOrInlineDv=f"file://{quote(str(moved))}")

    Path(uri, "moved here").mkdir()
    _rewrite(uri, 3, change)
    vectors = [a["add"].get("deletionVector") for a in _commit(uri, 3) if "add" in a]
    assert sorted(v["storageType"] for v in vectors if v and v["storageType"] != "u") == [
        "i",
        "p",
    ]
    assert spark_rows(spark, uri) == expected  # delta-spark reads the rewritten log alike
    assert _assert_every_reader(spark, uri) == expected
    with caplog.at_level(logging.INFO, logger="committers.delta"):
        read_table(spark, uri)
    assert re.search(
        r"native Parquet scan of \d+ files, partition values from the Hive directories; 1 files, "
        r"partition values from the log joined by file path, \d+ rows of \d+ files dropped",
        caplog.text,
    ), caplog.text


def _damage(kind: str, uri: str) -> tuple[str, str]:
    """Break the first vector of the flat table's DELETE in one way; (its data file, what the
    error says)."""
    first: dict = {}

    def change(index: int, add: dict) -> None:
        if index:
            return
        first.update(add)
        vector = add["deletionVector"]
        if kind == "cardinality":
            vector["cardinality"] += 1
        elif kind == "size":
            vector["sizeInBytes"] -= 1

    _rewrite(uri, 1, change)
    vector = first["deletionVector"]
    if kind == "checksum":
        path = _bin_file(uri)
        raw = bytearray(path.read_bytes())
        raw[vector["offset"] + 4 + vector["sizeInBytes"] // 2] ^= 0x01
        path.write_bytes(bytes(raw))
        return first["path"], "CRC-32 of the vector .* does not match"
    if kind == "missing file":
        _bin_file(uri).unlink()
        return first["path"], "does not exist"
    if kind == "cardinality":
        return first["path"], f"holds {vector['cardinality'] - 1} rows, not the"
    return first["path"], "stores .* bytes at offset .*, the descriptor says"


@pytest.mark.parametrize("kind", ["checksum", "missing file", "cardinality", "size"])
def test_a_damaged_vector_fails_both_readers_naming_file_and_vector(
    delta_spark, tables, tmp_path, kind
):
    spark = delta_spark
    uri = _copy(tables["flat"], tmp_path / "copy")
    data_file, detail = _damage(kind, uri)
    pattern = rf"(?s)data file {data_file}: .*{detail}"
    with pytest.raises(DeletionVectorError, match=pattern):
        read_table(spark, uri)
    with pytest.raises(Exception, match=rf"(?s)DeletionVectorError.*{pattern[4:]}"):
        _python(spark, uri).collect()
    # Time travel to before the DELETE does not need the vector.
    assert _python(spark, uri, version=0).count() == ROWS


def test_stream_reads_a_snapshot_without_deleted_rows_then_stops_or_skips_a_delete(
    delta_spark, tmp_path
):
    spark = delta_spark
    register(spark)
    uri = str(tmp_path / "source")
    spark.range(0, 100, 1, 2).selectExpr("id", "CAST(id AS STRING) AS s").write.format(
        "delta"
    ).option("delta.enableDeletionVectors", "true").save(uri)
    _sql(spark, "DELETE FROM {t} WHERE id % 4 = 0", uri)
    assert _vectors_added(uri, 1) == 2

    def drain(checkpoint: Path, **options) -> list[int]:
        delivered: list[int] = []
        reader = spark.readStream.format("deltalake")
        for key, value in options.items():
            reader = reader.option(key, value)
        drain_available_now(
            reader.load(uri),
            checkpoint,
            lambda df, _: delivered.extend(r.id for r in df.select("id").collect()),
        )
        return sorted(delivered)

    snapshot = [i for i in range(100) if i % 4]
    assert drain(tmp_path / "strict") == snapshot
    assert drain(tmp_path / "skipping", skipChangeCommits="true") == snapshot
    _sql(spark, "DELETE FROM {t} WHERE id % 4 = 1", uri)  # version 2: vectors replaced
    spark.range(100, 110, 1, 1).selectExpr("id", "CAST(id AS STRING) AS s").write.format(
        "delta"
    ).mode("append").save(uri)
    with pytest.raises(Exception, match=r"(?s)SourceTableChangedError.*version 2"):
        drain(tmp_path / "strict")
    assert drain(tmp_path / "skipping", skipChangeCommits="true") == list(range(100, 110))
