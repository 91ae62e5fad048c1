"""The Java filter of deleted rows (``_jvm_deleted_rows``) against the join it replaces: the
same live rows from a scan of many files with odd paths, a row of a file it does not hold
failing the query by name, and the join taking over where the filter cannot be built."""

from __future__ import annotations

import numpy as np
import pytest

from committers.delta.spark import _deleted_rows, _jvm_deleted_rows
from committers.delta.spark._deleted_rows import drop_deleted_rows

pytestmark = pytest.mark.spark

_PATH = "__path__"
_ROW = "__row__"


def _scan(spark, tmp_path):
    """Twelve Parquet files of 1,000 rows under directories with odd names, each row with
    its ``_metadata`` file path and row index; and the paths as Spark spells them."""
    for number, name in enumerate(["a b", "100%", "ü€𠮷", "k=v"]):
        spark.range(number * 3000, (number + 1) * 3000, numPartitions=3).write.parquet(
            str(tmp_path / name)
        )
    scan = spark.read.parquet(*[str(p) for p in tmp_path.iterdir()])
    metadata = scan.metadataColumn("_metadata")
    rows = scan.select(
        "id",
        metadata.getField("file_path").alias(_PATH),
        metadata.getField("row_index").alias(_ROW),
    )
    paths = sorted(r[0] for r in rows.select(_PATH).distinct().collect())
    assert len(paths) == 12
    return rows, paths


def _deleted(paths):
    """Vectors on every other file: rows 0, 7, 14, ... and the last row."""
    return {p: np.array([*range(0, 999, 7), 999], np.uint64) for p in paths[::2]}


def _ids(frame) -> list[int]:
    return sorted(r[0] for r in frame.select("id").collect())


def _columns():
    from pyspark.sql import functions as F

    return F.col(_PATH), F.col(_ROW)


def test_the_jvm_filter_keeps_what_the_join_keeps(spark, tmp_path, monkeypatch) -> None:
    rows, paths = _scan(spark, tmp_path)
    vectors = _deleted(paths)
    assert _jvm_deleted_rows.keep_live_rows(spark, *_columns(), vectors, paths) is not None
    by_jvm = _ids(drop_deleted_rows(spark, rows, _PATH, _ROW, vectors, every_file=paths))
    monkeypatch.setattr(_deleted_rows, "keep_live_rows", lambda *args: None)
    by_join = _ids(drop_deleted_rows(spark, rows, _PATH, _ROW, vectors, every_file=paths))
    assert by_jvm == by_join
    assert len(by_jvm) == 12_000 - 6 * 144  # 143 multiples of 7 below 999, and row 999
    # Without every_file (compaction), the rows of files without a vector are kept as well.
    assert _ids(drop_deleted_rows(spark, rows, _PATH, _ROW, vectors)) == by_jvm


def test_a_row_of_a_file_the_filter_does_not_hold_fails_the_query(spark, tmp_path) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    rows, paths = _scan(spark, tmp_path)
    kept = drop_deleted_rows(spark, rows, _PATH, _ROW, _deleted(paths), every_file=paths[:-1])
    with pytest.raises((Py4JJavaError, PySparkException), match="no file of the snapshot is"):
        kept.count()


def test_paths_the_filter_cannot_tell_apart_fall_back_to_the_join(
    spark, tmp_path, monkeypatch
) -> None:
    """Two paths hashing alike (here: one path given twice) make the Java constructor refuse;
    the rows then come from the join, the same."""
    rows, paths = _scan(spark, tmp_path)
    vectors = _deleted(paths)
    expected = _ids(drop_deleted_rows(spark, rows, _PATH, _ROW, vectors, every_file=paths))
    packed = _jvm_deleted_rows._packed
    monkeypatch.setattr(
        _jvm_deleted_rows, "_packed", lambda names, deleted: packed([*names, paths[0]], deleted)
    )
    assert _jvm_deleted_rows.keep_live_rows(spark, *_columns(), vectors, paths) is None
    assert _ids(drop_deleted_rows(spark, rows, _PATH, _ROW, vectors, every_file=paths)) == expected
