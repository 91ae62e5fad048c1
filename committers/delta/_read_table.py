"""Reading a Delta table into a Spark DataFrame: :func:`register` and :func:`read_table`.

:func:`read_table` resolves the snapshot with delta-rs on the driver and, where it can, hands
the snapshot's files to Spark's own Parquet reader, so rows never cross into Python workers:

* partition values come from the Hive-style directories (``day=2026-11-21/``) when every file
  lies in the directory its partition values spell, in a way Spark parses back to exactly
  those values (strings, integers, booleans, dates); Spark then prunes partitions
  itself (``PartitionFilters`` in the plan);
* otherwise they are typed literal columns of one scan per distinct partition (a union, at most
  :data:`MAX_UNION_PARTITIONS` of them), which Spark's optimizer drops when a filter rules
  their literal out.

Otherwise (column mapping, storage options Spark's Hadoop layer does not see, a scheme it has
no file system for, Spark Connect, ...) it reads through the ``"deltalake"`` Python data
source. Which path ran is logged at INFO on ``committers.delta`` and visible in
``df.explain()``: ``FileScan parquet`` (native) or ``BatchScan deltalake`` (Python).

Tables neither path reads correctly (deletion vectors, unknown reader features) are refused
by both with :class:`~committers.delta.UnsupportedTableFeatureError`.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from committers.delta._delta_schema import quote, spark_type
from committers.delta._snapshot import Snapshot, SnapshotSpec, open_snapshot
from committers.delta._source import DataFile, list_data_files, spell_partition_value
from committers.delta._spark_staging import hadoop_has_filesystem, spark_uri
from committers.delta._storage import TableLocation
from framework.spark._files import parquet_files

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["MAX_UNION_PARTITIONS", "read_table", "register"]

log = logging.getLogger("committers.delta")

#: Most distinct partitions :func:`read_table` reads natively as a union of scans.
MAX_UNION_PARTITIONS = 256
# Types whose Hive directory spelling Spark parses back to the value delta-rs read.
_HIVE_SAFE_TYPES = frozenset({"string", "long", "integer", "short", "byte", "boolean", "date"})
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_GLOB_CHARACTERS = frozenset("{}[]*?\\")


def register(spark: SparkSession) -> None:
    """Register the ``"deltalake"`` format with ``spark``:
    ``spark.read.format("deltalake").load(uri)``, with options ``versionAsOf``,
    ``timestampAsOf``, ``maxSplitBytes``, ``filterPushdown`` and the table's storage options
    (see ``docs/reading.md``). The session's configuration is not changed; reads with
    ``filterPushdown`` need ``spark.sql.python.filterPushdown.enabled=true``.
    """
    from committers.delta._format import DeltaDataSource
    from framework.spark._source import register_data_source

    register_data_source(spark, DeltaDataSource, filter_pushdown=False)


def read_table(
    spark: SparkSession,
    uri: str,
    *,
    version: int | None = None,
    timestamp: dt.datetime | str | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> DataFrame:
    """One snapshot of the Delta table at ``uri`` as a DataFrame, read natively where possible.

    Args:
        spark: the session.
        uri: the table's root (local path, ``file://`` or ``s3://`` URL, ...).
        version: read this version (``versionAsOf``).
        timestamp: read the newest version committed at or before this instant
            (``timestampAsOf``; a naive datetime or a string without offset is UTC).
        storage_options: delta-rs style options of the location (see ``docs/s3.md``).

    Returns:
        The rows of the snapshot, in the table's column order; see the module docstring for
        which scan produces them. The version is resolved now: later commits do not change
        what the DataFrame reads.

    Raises:
        NotATableError: no Delta table at ``uri``.
        ConfigurationError: both ``version`` and ``timestamp``; a version that does not exist
            or log cleanup removed; a timestamp before the first or after the latest commit;
            a bad storage option.
        UnsupportedTableFeatureError: the table needs a reader feature neither path honours
            (deletion vectors, ...).
        UnsupportedTypeError: a column type that cannot be read.
    """
    location = TableLocation.of(uri, storage_options)
    table, snapshot = open_snapshot(location, SnapshotSpec.of(version, timestamp))
    reason = _python_only_reason(spark, snapshot, bool(storage_options))
    if reason is None:
        files = list_data_files(table, snapshot)
        hive = _hive_layout(files, snapshot)
        reason = _unreadable_paths(files, snapshot) or _too_many_partitions(files, snapshot, hive)
        if reason is None:
            return _native(spark, snapshot, files, hive)
    log.info(
        "read_table %s version %d: Python data source %r, because %s",
        location.uri,
        snapshot.version,
        "deltalake",
        reason,
    )
    register(spark)
    reader = spark.read.format("deltalake").option("versionAsOf", snapshot.version)
    for name, value in (storage_options or {}).items():
        reader = reader.option(str(name), str(value))
    return reader.load(location.uri)


def _python_only_reason(spark: SparkSession, snapshot: Snapshot, has_options: bool) -> str | None:
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        return "a Spark Connect session cannot check what the server's file systems read"
    if snapshot.column_mapping_mode != "none":
        return (
            f"the table uses column mapping (mode {snapshot.column_mapping_mode}): its files "
            "name columns by physical names"
        )
    location = snapshot.location
    if location.is_local:
        return None
    if has_options:
        return (
            "storage options reach delta-rs and fsspec, not Spark's Hadoop file systems, which "
            "would read the files with their own configuration"
        )
    if not hadoop_has_filesystem(spark, location.scheme):
        return f"Spark's Hadoop layer has no file system for {location.scheme}://"
    return None


def _unreadable_paths(files: Sequence[DataFile], snapshot: Snapshot) -> str | None:
    for file in files:
        uri = file.uri(snapshot)
        if _GLOB_CHARACTERS & set(uri):
            return f"the file path {uri!r} holds characters Spark reads as a glob pattern"
        if any(part.startswith(("_", ".")) for part in file.path.split("/") if part):
            return f"Spark's file index ignores paths with '_' or '.' names, such as {uri!r}"
    return None


def _spark_unescape(text: str) -> str:
    """Spark's ``ExternalCatalogUtils.unescapePathName``: each ``%XX`` is one character."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "%" and i + 2 < len(text):
            try:
                out.append(chr(int(text[i + 1 : i + 3], 16)))
                i += 3
                continue
            except ValueError:
                pass
        out.append(text[i])
        i += 1
    return "".join(out)


def _hive_layout(files: Sequence[DataFile], snapshot: Snapshot) -> bool:
    """Whether the table is partitioned and Spark's partition discovery, given the table root
    as ``basePath``, finds in every file's directories exactly the partition values the log
    gives it (the last directories of each file's path; those above must not look like
    partitions)."""
    shape = snapshot.shape
    columns = shape.partition_by
    if not columns or any(shape.schema.field(c).type not in _HIVE_SAFE_TYPES for c in columns):
        return False
    for file in files:
        if "://" in file.path or file.path.startswith("/"):
            return False
        directories = file.path.split("/")[:-1]
        # Directories above the partition ones (the sink's Spark staging writes
        # batch-<n>-<run>/day=.../) end Spark's partition parsing, if they are not key=value.
        above, directories = directories[: -len(columns)], directories[-len(columns) :]
        if len(directories) != len(columns) or any("=" in d for d in above):
            return False
        for directory, column in zip(directories, columns, strict=True):
            name, sep, raw = directory.partition("=")
            if not sep or name != column:
                return False
            value = file.partition_values.get(column)
            expected = _HIVE_NULL if value is None else spell_partition_value(value)
            if _spark_unescape(raw) != expected:
                return False
    return True


def _literal(value: Any, delta_type: Any) -> Column:
    from pyspark.sql import functions as F

    target = spark_type(delta_type, physical=False)
    if value is None:
        return F.lit(None).cast(target)
    if delta_type == "timestamp":  # microseconds since the epoch: no time zone involved
        return F.timestamp_micros(F.lit(int(spell_partition_value(value) or 0)))
    if delta_type == "timestamp_ntz":
        return F.lit(value.isoformat(sep=" ", timespec="microseconds")).cast(target)
    if isinstance(value, float):
        return F.lit(value).cast(target)
    return F.lit(spell_partition_value(value)).cast(target)


def _native(
    spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile], hive: bool
) -> DataFrame:
    from pyspark.sql import functions as F

    from committers.delta._format import spark_schema

    shape = snapshot.shape
    schema = spark_schema(snapshot)
    names = [f.name for f in shape.schema.fields]
    columns = [F.col(quote(name)) for name in names]
    uri = snapshot.location.uri
    if not files:
        how = "no files: an empty relation"
        df = spark.createDataFrame([], schema)
    elif not shape.partition_by:
        how = f"Parquet scan of {len(files)} files"
        df = parquet_files(spark, [spark_uri(f.uri(snapshot)) for f in files], schema=schema)
    elif hive:
        how = f"Parquet scan of {len(files)} files, partition values from the Hive directories"
        df = parquet_files(
            spark,
            [spark_uri(f.uri(snapshot)) for f in files],
            schema=schema,
            base_path=spark_uri(uri),
        )
    else:
        groups = _by_partition(files, shape.partition_by)
        how = (
            f"Parquet scans of {len(files)} files, one per partition ({len(groups)}), with the "
            "partition values as literals"
        )
        data_schema = type(schema)([f for f in schema.fields if f.name not in shape.partition_by])
        scans = []
        for key, group in groups.items():
            values = dict(zip(shape.partition_by, key, strict=True))
            scan = parquet_files(
                spark, [spark_uri(f.uri(snapshot)) for f in group], schema=data_schema
            )
            scans.append(
                scan.select(
                    *(
                        _literal(values[name], shape.schema.field(name).type).alias(name)
                        if name in values
                        else F.col(quote(name))
                        for name in names
                    )
                )
            )
        df = functools.reduce(lambda a, b: a.union(b), scans)
    log.info("read_table %s version %d: native %s", uri, snapshot.version, how)
    return df.select(*columns)


def _by_partition(
    files: Sequence[DataFile], partition_by: Sequence[str]
) -> dict[tuple[Any, ...], list[DataFile]]:
    groups: dict[tuple[Any, ...], list[DataFile]] = {}
    for file in files:
        key = tuple(file.partition_values.get(c) for c in partition_by)
        groups.setdefault(key, []).append(file)
    return groups


def _too_many_partitions(files: Sequence[DataFile], snapshot: Snapshot, hive: bool) -> str | None:
    partition_by = snapshot.shape.partition_by
    if not partition_by or not files or hive:
        return None
    count = len(_by_partition(files, partition_by))
    if count <= MAX_UNION_PARTITIONS:
        return None
    return (
        f"its files are not in Hive-style partition directories Spark would parse to the same "
        f"values, and {count} partitions are more than {MAX_UNION_PARTITIONS} scans to union"
    )
