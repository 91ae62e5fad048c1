"""Reading Delta tables with delta-spark (running in the session's JVM) and with the delta-rs
based readers, in one comparable form."""

from __future__ import annotations

import datetime
import os
from pathlib import Path

from deltalake import DeltaTable

from committers.tests._readers import duckdb_rows

UTC = datetime.timezone.utc


def comparable(rows: list[dict]) -> list[dict]:
    """Rows in one form for every reader: UTC spelled one way, sorted by their repr (NaN
    compares unequal to itself, so compare the results' repr too)."""
    return sorted((_utc(row) for row in rows), key=repr)


def _utc(value):
    if isinstance(value, dict):
        return {k: _utc(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utc(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_utc(v) for v in value)
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        assert value.utcoffset() == datetime.timedelta(0)
        return value.replace(tzinfo=UTC)
    return value


def spark_rows(spark, uri: str, where: str | None = None, **options) -> list[dict]:
    """The rows delta-spark reads (``spark.read.format("delta")``, with ``options`` such as
    ``versionAsOf``), through Arrow so that types compare with delta-rs's."""
    reader = spark.read.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    df = reader.load(uri)
    if where is not None:
        df = df.where(where)
    return comparable(df.toArrow().to_pylist())


def delta_rs_rows(uri: str, version: int | None = None) -> list[dict]:
    """The rows deltalake's pyarrow dataset reads (at ``version``)."""
    table = DeltaTable(uri, version=version)
    return comparable(table.to_pyarrow_table().to_pylist())


def assert_all_read(spark, uri: str, duckdb: bool = True) -> list[dict]:
    """delta-spark, deltalake and (unless ``duckdb=False``) DuckDB read the same rows at the
    table's latest version; returns them."""
    by_spark = spark_rows(spark, uri)
    assert repr(by_spark) == repr(delta_rs_rows(uri))
    if duckdb:
        assert repr(by_spark) == repr(comparable(duckdb_rows(uri)))
    return by_spark


def data_files(uri: str) -> set[str]:
    """Parquet files under a local table's root (relative paths), hidden directories aside."""
    root = Path(uri)
    found = set()
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(("_", "."))]
        for name in files:
            if name.endswith(".parquet"):
                found.add(Path(directory, name).relative_to(root).as_posix())
    return found


def live_files(uri: str) -> set[str]:
    """The files the table's latest version references (relative, decoded paths)."""
    root = os.path.abspath(uri)
    return {os.path.relpath(u.replace("file://", ""), root) for u in DeltaTable(uri).file_uris()}
