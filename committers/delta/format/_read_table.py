"""Reading a Delta table into a Spark DataFrame: :func:`register` and :func:`read_table`.

:func:`read_table` resolves the snapshot with delta-rs on the driver and, where it can, hands
the snapshot's files to Spark's own Parquet reader, so rows never cross into Python workers.
A file's partition values are the ones its add action in the log gives; Delta promises no
directory layout, so Spark never takes them from directory names it has not been checked
against:

* files whose last directories spell exactly their log values, in a way Spark parses back to
  the same values (``day=2026-11-21/``; strings, integers, booleans, dates), whatever lies
  above them (the sink's ``batch-<n>-<run>/`` run directories, the table root), are one scan
  with Hive partition discovery from the table root; Spark prunes their partitions itself
  (``PartitionFilters`` in the plan);
* all other files (timestamp, float or decimal partition columns, other layouts, a directory
  that names another value) are one scan of their data columns, joined by file path
  (``_metadata.file_path``) to a broadcast table of each file's partition values from the
  log. Filters on partition columns are evaluated after the join there: those files are not
  pruned, but their number of partitions does not matter.

The two scans are unioned when a table has both kinds of files. Otherwise (column mapping,
storage options Spark's Hadoop layer does not see, a scheme it has no file system for, Spark
Connect, file names Spark's listing hides, ...) it reads through the ``"deltalake"`` Python
data source. Which path ran is logged at INFO on ``committers.delta`` and visible in
``df.explain()``: ``FileScan parquet`` (native) or ``BatchScan deltalake`` (Python).

Spark's file index is handed each file's size and modification time from the log, so it lists
nothing (:func:`~framework.spark.connector.parquet_files` with ``statuses``), and what the log
says of a version (files, their spellings, their deleted rows) is kept for the last few versions
read (:mod:`committers.delta.format._file_plan`), as delta-spark keeps its snapshots.

Deletion vectors are applied by both: each file's vector is read and checked on the driver
and its rows dropped from Spark's scan by file path and ``_metadata.row_index``
(:mod:`committers.delta.spark._deleted_rows`), or by the Python reader with the bitmap. Tables
neither path reads correctly (unknown reader features) are refused by both with
:class:`~committers.delta.UnsupportedTableFeatureError`.
"""

from __future__ import annotations

import datetime as dt
import logging
import string
import unicodedata
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from committers.delta.format._file_plan import FilePlan, file_plan
from committers.delta.format._format import DeltaDataSource, spark_schema
from committers.delta.read._source import DataFile, spell_partition_value
from committers.delta.spark._deleted_rows import drop_deleted_rows, without_deleted_rows
from committers.delta.spark._spark_staging import hadoop_has_filesystem, spark_uri
from committers.delta.storage._storage import TableLocation
from committers.delta.table._delta_schema import quote, spark_type
from committers.delta.table._snapshot import Snapshot, SnapshotSpec, open_snapshot
from framework.spark.connector import parquet_files, register_data_source

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["read_table", "register"]

log = logging.getLogger("committers.delta")

# Types whose Hive directory spelling Spark parses back to the value delta-rs read.
_HIVE_SAFE_TYPES = frozenset({"string", "long", "integer", "short", "byte", "boolean", "date"})
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_GLOB_CHARACTERS = frozenset("{}[]*?\\")
# Characters java.net.URI leaves unquoted in a path (unreserved, punct, "/" and "@"); "other"
# characters (non-ASCII, neither control nor space) are left as they are too.
_URI_PATH_SAFE = frozenset(string.ascii_letters + string.digits + "-_.!~*'()" + ",;:$&+=/@")
_KEY = "__read_table_file"
_MATCHED = "__read_table_matched"
_ROW_INDEX = "__read_table_row_index"


def register(spark: SparkSession) -> None:
    """Register the ``"deltalake"`` format with ``spark``:
    ``spark.read.format("deltalake").load(uri)``, with options ``versionAsOf``,
    ``timestampAsOf``, ``maxSplitBytes``, ``filterPushdown``, ``readChangeFeed`` (with its
    range options) and the table's storage options (see ``docs/reading.md``). The session's
    configuration is not changed; reads with ``filterPushdown`` need
    ``spark.sql.python.filterPushdown.enabled=true``.
    """
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
        The rows of the snapshot, in the table's column order, each with the partition
        values its file has in the log; see the module docstring for which scan produces
        them. The version is resolved now: later commits do not change what the DataFrame
        reads.

    Raises:
        NotATableError: no Delta table at ``uri``.
        ConfigurationError: both ``version`` and ``timestamp``; a version that does not exist
            or log cleanup removed; a timestamp before the first or after the latest commit;
            a bad storage option.
        UnsupportedTableFeatureError: the table needs a reader feature neither path honours
            (type widening, ...).
        DeletionVectorError: a file's deletion vector is missing or damaged (nothing read).
        UnsupportedTypeError: a column type that cannot be read.
    """
    location = TableLocation.of(uri, storage_options)
    table, snapshot = open_snapshot(location, SnapshotSpec.of(version, timestamp))
    reason = _python_only_reason(spark, snapshot, bool(storage_options))
    if reason is None:
        plan = file_plan(spark, table, snapshot, storage_options, _file_keys)
        reason = _unreadable_paths(plan.files, snapshot)
        if reason is None:
            df, how = _native(spark, snapshot, plan)
            reason = _files_spark_dropped(df, plan.files)
            if reason is None:
                log.info("read_table %s version %d: native %s", uri, snapshot.version, how)
                return df
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
        if file.path.rsplit("/", 1)[-1].startswith(("_", ".")):
            return f"Spark's file index ignores file names starting with '_' or '.': {uri!r}"
    return None


def _files_spark_dropped(df: DataFrame, files: Sequence[DataFile]) -> str | None:
    """Why ``df`` does not read every file (Spark's listing left some out), or None."""
    listed = len(df._jdf.inputFiles()) if files else 0
    if listed == len(files):
        return None
    return f"Spark's file index lists {listed} of the snapshot's {len(files)} files"


# -- Hive directories -----------------------------------------------------------------------


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


def _spells_its_values(file: DataFile, columns: Sequence[str], types: Sequence[str]) -> bool:
    """Whether Spark's partition discovery, given the table root as ``basePath``, finds in
    ``file``'s directories exactly its log partition values: its last directories are
    ``column=value`` in the table's column order, each parsing back to the log's value, and
    the directories above them end Spark's parsing without adding a column."""
    if "://" in file.path or file.path.startswith("/"):
        return False
    directories = file.path.split("/")[:-1]
    if len(directories) < len(columns):
        return False
    above, own = directories[: -len(columns)], directories[-len(columns) :]
    # A key=value directory above would be parsed as one more column; a "_temporary" one
    # makes Spark drop the file.
    if any("=" in d for d in above) or (above and above[-1].lower() == "_temporary"):
        return False
    for directory, column, delta_type in zip(own, columns, types, strict=True):
        name, sep, raw = directory.partition("=")
        if not sep or not raw or _spark_unescape(name) != column:
            return False
        value = file.partition_values.get(column)
        if value is None:
            if raw != _HIVE_NULL:
                return False
        elif raw == _HIVE_NULL:  # Spark reads this directory as null, whatever the log says
            return False
        elif delta_type == "string":
            if _spark_unescape(raw) != value:
                return False
        elif raw != spell_partition_value(value):  # other types: Spark parses the raw text
            return False
    return True


def _split_by_layout(
    files: Sequence[DataFile], snapshot: Snapshot
) -> tuple[list[DataFile], list[DataFile]]:
    """(files whose directories spell their partition values for Spark, the others)."""
    shape = snapshot.shape
    columns = list(shape.partition_by)
    types = [t for t in (shape.schema.field(c).type for c in columns) if isinstance(t, str)]
    if len(types) != len(columns) or not set(types) <= _HIVE_SAFE_TYPES:
        return [], list(files)
    hive: list[DataFile] = []
    other: list[DataFile] = []
    for file in files:
        (hive if _spells_its_values(file, columns, types) else other).append(file)
    return hive, other


# -- partition values joined by file path -----------------------------------------------------


def _java_uri_path(text: str) -> str:
    """``text`` quoted as a path component of ``java.net.URI`` (its multi-argument
    constructors): how Spark spells a file's path in ``_metadata.file_path``."""
    out: list[str] = []
    for ch in text:
        if ch in _URI_PATH_SAFE or (ord(ch) > 0x7F and not _java_control_or_space(ch)):
            out.append(ch)
        else:
            out.extend(f"%{byte:02X}" for byte in ch.encode("utf-8"))
    return "".join(out)


def _java_control_or_space(ch: str) -> bool:
    """Java's ``Character.isISOControl(ch) || Character.isSpaceChar(ch)``."""
    code = ord(ch)
    return code <= 0x1F or 0x7F <= code <= 0x9F or unicodedata.category(ch) in {"Zs", "Zl", "Zp"}


def _file_path_spelling(spark: SparkSession, uri: str) -> str:
    """``uri`` as Spark spells a file's ``_metadata.file_path``: ``new Path(path.toString())
    .toUri().toString()`` (``file:/tmp/a%20b``, ``s3a://bucket/key``)."""
    session: Any = spark
    hadoop_path = session._jvm.org.apache.hadoop.fs.Path
    return str(hadoop_path(hadoop_path(spark_uri(uri)).toString()).toUri().toString())


def _file_keys(
    spark: SparkSession, snapshot: Snapshot, files: Sequence[DataFile]
) -> dict[str, str]:
    """Each file's path (as the log names it) -> its ``_metadata.file_path`` as Spark will
    spell it (one call into the JVM per file: only for the files that need it)."""
    root = _file_path_spelling(spark, snapshot.location.uri).rstrip("/")
    return {
        f.path: _file_path_spelling(spark, f.path)
        if "://" in f.path or f.path.startswith("/")
        else f"{root}/{_java_uri_path(f.path)}"
        for f in files
    }


def _value_text(value: Any, delta_type: Any) -> str | None:
    """A partition value as text :func:`_typed` turns back into it in Spark."""
    if value is None:
        return None
    if delta_type == "timestamp_ntz":
        return str(value.isoformat(sep=" ", timespec="microseconds"))
    return spell_partition_value(value)  # timestamps: microseconds since the epoch


def _typed(column: Column, delta_type: Any) -> Column:
    """A string column of :func:`_value_text` spellings, as the partition column's type."""
    from pyspark.sql import functions as F

    if delta_type == "timestamp":  # microseconds since the epoch: no time zone involved
        return F.timestamp_micros(column.cast("long"))
    return column.cast(spark_type(delta_type, physical=False))


def _joined_scan(
    spark: SparkSession,
    snapshot: Snapshot,
    files: Sequence[DataFile],
    names: Sequence[str],
    vectors: Mapping[str, np.ndarray],
    keys: Mapping[str, str],
) -> DataFrame:
    """One scan of ``files``' data columns, with each file's partition values from the log
    joined by its path. A row whose file has no entry (a path Spark spells differently than
    expected) fails the query when a partition column is read, never gets wrong values."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    shape = snapshot.shape
    partition_by = list(shape.partition_by)
    types = {c: shape.schema.field(c).type for c in partition_by}
    schema = spark_schema(snapshot)
    data_schema = type(schema)([f for f in schema.fields if f.name not in types])
    uris = [spark_uri(f.uri(snapshot)) for f in files]
    scan = parquet_files(spark, uris, schema=data_schema, statuses=_statuses(files))
    metadata = scan.metadataColumn("_metadata")
    rows = scan.select(
        *[F.col(quote(f.name)) for f in data_schema.fields],
        metadata.getField("file_path").alias(_KEY),
        metadata.getField("row_index").alias(_ROW_INDEX),
    )
    every_file = [keys[f.path] for f in files]
    rows = drop_deleted_rows(spark, rows, _KEY, _ROW_INDEX, vectors, every_file=every_file)
    values = pa.table(
        {
            _KEY: pa.array([keys[f.path] for f in files], pa.string()),
            **{
                column: pa.array(
                    [_value_text(f.partition_values.get(column), t) for f in files], pa.string()
                )
                for column, t in types.items()
            },
        }
    )
    mapping = spark.createDataFrame(values).select(
        F.col(_KEY),
        *[_typed(F.col(quote(c)), t).alias(c) for c, t in types.items()],
        F.lit(True).alias(_MATCHED),
    )
    joined = rows.join(F.broadcast(mapping), on=_KEY, how="left")
    missing = F.raise_error(
        F.concat(F.lit("read_table: no partition values for the file "), F.col(_KEY))
    )
    return joined.select(
        *[
            F.when(F.col(_MATCHED).isNull(), missing).otherwise(F.col(quote(n))).alias(n)
            if n in types
            else F.col(quote(n))
            for n in names
        ]
    )


# -- the native DataFrame -----------------------------------------------------------------------


def _native(spark: SparkSession, snapshot: Snapshot, plan: FilePlan) -> tuple[DataFrame, str]:
    """The snapshot's rows read by Spark's Parquet reader, and how (for the log line)."""
    from pyspark.sql import functions as F

    shape = snapshot.shape
    schema = spark_schema(snapshot)
    names = [f.name for f in shape.schema.fields]
    columns = [F.col(quote(name)) for name in names]
    files, keys, vectors = plan.files, plan.keys, plan.vectors
    if not files:
        return spark.createDataFrame([], schema).select(*columns), "no files: an empty relation"
    if not shape.partition_by:
        uris = [spark_uri(f.uri(snapshot)) for f in files]
        scan = parquet_files(spark, uris, schema=schema, statuses=_statuses(files))
        every_file = [keys[f.path] for f in files] if vectors else []
        scan = without_deleted_rows(spark, scan, vectors, every_file)
        how = f"Parquet scan of {len(files)} files{_dv_note(vectors)}"
        return scan.select(*columns), how
    hive, other = _split_by_layout(files, snapshot)
    scans, parts = [], []
    if hive:
        scan = parquet_files(
            spark,
            [spark_uri(f.uri(snapshot)) for f in hive],
            schema=schema,
            base_path=spark_uri(snapshot.location.uri),
            # The directories above the partition ones may differ from file to file (one run
            # directory per batch); each file's own were checked against the log.
            options={"ignoreInvalidPartitionPaths": "true"},
            statuses=_statuses(hive),
        )
        every_file = [keys[f.path] for f in hive] if vectors else []
        scans.append(without_deleted_rows(spark, scan, vectors, every_file).select(*columns))
        parts.append(f"{len(hive)} files, partition values from the Hive directories")
    if other:
        other_keys = keys or _file_keys(spark, snapshot, other)
        scans.append(_joined_scan(spark, snapshot, other, names, vectors, other_keys))
        parts.append(f"{len(other)} files, partition values from the log joined by file path")
    df = scans[0] if len(scans) == 1 else scans[0].union(scans[1])
    return df, "Parquet scan of " + "; ".join(parts) + _dv_note(vectors)


def _statuses(files: Sequence[DataFile]) -> list[tuple[int, int]]:
    """Each file's size and modification time as the log records them: Spark lists nothing."""
    return [(f.size_bytes, f.modification_time) for f in files]


def _dv_note(vectors: Mapping[str, np.ndarray]) -> str:
    if not vectors:
        return ""
    rows = sum(len(deleted) for deleted in vectors.values())
    return f", {rows} rows of {len(vectors)} files dropped by their deletion vectors"
