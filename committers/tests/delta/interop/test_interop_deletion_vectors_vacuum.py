"""VACUUM and ``remove_orphan_files`` on tables with deletion vectors, judged by delta-spark's
own ``VACUUM ... DRY RUN``: the files they find to delete are exactly delta-spark's (data files
and vector files: the vectors replaced by a newer one, a crashed writer's vector file), the
vector files of live files are kept (one file of the sink's holds the vectors of many data
files; delta-spark's too), and every reader reads the same rows afterwards."""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from deltalake import DeltaTable

from committers.delta import DeltaSink
from committers.delta.commit._vacuum import vacuum_table
from committers.delta.storage._storage import TableLocation
from committers.delta.table._table import remove_orphan_files
from committers.tests.delta.interop.test_interop_deletion_vectors_rewrite import (
    _dv_table,
    _every_reader,
    _live_vectors,
)
from committers.tests.delta.interop.test_interop_deletion_vectors_upsert import CHANGES, _upsert

pytestmark = pytest.mark.spark

DAY = 86400


def _age_everything(uri: str, seconds: float) -> None:
    """Make every file under the table but the log ``seconds`` old."""
    old = time.time() - seconds
    for path in Path(uri).rglob("*"):
        if path.is_file() and "_delta_log" not in path.parts:
            os.utime(path, (old, old))


def _delta_spark_would_delete(spark, uri: str) -> set[str]:
    """What delta-spark's VACUUM with no retention lists (relative to the table root)."""
    spark.sql("SET spark.databricks.delta.retentionDurationCheck.enabled = false")
    try:
        found = spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS DRY RUN").collect()
    finally:
        spark.sql("SET spark.databricks.delta.retentionDurationCheck.enabled = true")
    root = Path(uri).resolve().as_posix().rstrip("/") + "/"
    return {row["path"].removeprefix("file:").removeprefix(root) for row in found}


def _vector_files(uri: str) -> set[str]:
    root = Path(uri)
    return {p.relative_to(root).as_posix() for p in root.rglob("deletion_vector_*.bin")}


def _neighbour_of(spark, uri: str, key: int) -> int:
    """Another live id in the data file that holds ``key``."""
    rows = spark.read.format("delta").load(uri).selectExpr("id", "_metadata.file_path AS f")
    (file,) = {r["f"] for r in rows.where(f"id = {key}").collect()}
    return min(r["id"] for r in rows.where(f"f = '{file}' AND id != {key}").collect())


def _orphan_vector(uri: str, age_seconds: float) -> str:
    """A copy of one of the table's vector files under a new name, as a writer killed after
    writing its vector file leaves one; ``age_seconds`` old."""
    source = sorted(Path(uri).glob("deletion_vector_*.bin"))[0]
    orphan = Path(uri, f"deletion_vector_{uuid.uuid4()}.bin")
    shutil.copyfile(source, orphan)
    old = time.time() - age_seconds
    os.utime(orphan, (old, old))
    return orphan.name


def test_vacuum_deletes_the_vector_files_delta_spark_would_and_keeps_live_ones(
    delta_spark, tmp_path
):
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri, rows=600, files=2)  # delta-spark's vectors on every file
    # Two merge-on-read batches: the second marks the one file the first marked again, so the
    # first batch's vector file is replaced; the second's holds the vectors of two files.
    neighbour = _neighbour_of(spark, uri, 0)
    sink = _upsert(uri)
    sink.write(spark.createDataFrame([(0, "0", 0.0, "D")], CHANGES))
    first = {p for p in _vector_files(uri) if p.startswith("batch-")}
    again = [(neighbour, "0", 2.5, "U"), (1, "1", 0.0, "D")]
    sink.write(spark.createDataFrame(again, CHANGES), epoch_id=1)
    expected = _every_reader(spark, uri)
    version = DeltaTable(uri).version()
    _age_everything(uri, 2 * DAY)
    stale = _orphan_vector(uri, 8 * DAY)
    fresh = _orphan_vector(uri, 60)
    location = TableLocation.of(uri)

    # At the table's retention (7 days) only the crashed writer's old vector file goes: the
    # replaced vectors were removed just now, the fresh orphan may be a running writer's.
    kept = vacuum_table(location)
    assert [(f.path, f.kind) for f in kept.files] == [(stale, "unreferenced")]

    theirs = _delta_spark_would_delete(spark, uri)
    live = {p for p in _vector_files(uri) if p not in theirs}
    report = vacuum_table(location, retention_seconds=0, unsafe_allow_short_retention=True)
    assert {f.path for f in report.files} == theirs
    kinds = {f.path: f.kind for f in report.files}
    assert kinds[stale] == kinds[fresh] == "unreferenced"
    assert {kinds[p] for p in first} == {"removed"}  # replaced by the second batch's
    second = {p for p in live if p.startswith("batch-")}
    assert len(second) == 1  # the second batch's: one file of vectors, of two data files
    assert (
        sum(
            (v or {}).get("pathOrInlineDv", "").startswith("batch-")
            for v in _live_vectors(uri, version).values()
        )
        == 2
    )

    done = vacuum_table(
        location, retention_seconds=0, unsafe_allow_short_retention=True, dry_run=False
    )
    # Only vector files were removed here (every data file is live): delta-rs's vacuum, which
    # records VACUUM START/END, deletes data files only, so this vacuum commits nothing.
    assert done.log_versions == []
    assert _vector_files(uri) == live
    assert _delta_spark_would_delete(spark, uri) == set()
    assert _every_reader(spark, uri) == expected
    assert DeltaSink(uri).vacuum(retention=None) == []


def test_remove_orphan_files_deletes_orphan_vectors_and_keeps_every_referenced_one(
    delta_spark, tmp_path
):
    """Unlike VACUUM, it keeps the replaced vectors (a tombstone still names them: time travel
    reads them) and deletes only what no action names."""
    spark = delta_spark
    uri = str(tmp_path / "t")
    _dv_table(spark, uri, rows=300, files=1)
    _upsert(uri).write(spark.createDataFrame([(0, "0", 1.5, "U"), (1, "1", 0.0, "D")], CHANGES))
    before = DeltaTable(uri).version() - 1
    expected_before = sorted(
        spark.read.format("delta").option("versionAsOf", before).load(uri).collect()
    )
    expected = _every_reader(spark, uri)
    _age_everything(uri, 2 * DAY)
    stale = _orphan_vector(uri, 2 * DAY)
    referenced = _vector_files(uri) - {stale}

    location = TableLocation.of(uri)
    assert remove_orphan_files(location, retention_seconds=DAY) == [stale]
    assert _vector_files(uri) == referenced
    assert _every_reader(spark, uri) == expected
    travelled = spark.read.format("delta").option("versionAsOf", before).load(uri).collect()
    assert sorted(travelled) == expected_before
