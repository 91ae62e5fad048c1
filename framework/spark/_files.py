"""DataFrames over an explicit list of Parquet files, without Spark's per-file listing job.

Given more than ``spark.sql.sources.parallelPartitionDiscovery.threshold`` (32) paths, Spark
checks and lists them with a job of one task per path, up to
``spark.sql.sources.parallelPartitionDiscovery.parallelism`` (10,000) tasks. For the file lists
of a Delta snapshot that is one tiny task per file: 2,000 files took about 10 s of task
overhead in ``local[2]``, against 0.5 s with the job capped at the cluster's parallelism
(each task then lists a share of the files; remote stores keep their parallel listing).

Where the caller knows each file's size and modification time (a table's log records them),
Spark lists nothing at all: a small Java file-status cache (:data:`_KNOWN_FILES`, compiled
once per SparkContext) hands Spark's file index those statuses, as delta-spark's own file
index does from its log. On a local disk that takes the planning of 200 files from about
0.2 s to a few milliseconds; on S3 it saves a request per file.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from framework.spark._janino import compiled_class, new_instance

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["LISTING_PARALLELISM_CONF", "parquet_files"]

LISTING_PARALLELISM_CONF = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
_conf_lock = threading.Lock()

_KNOWN_FILES = "sparksink.jvm.KnownFiles"
_KNOWN_FILES_SOURCE = """
package sparksink.jvm;

/** The statuses of a scan's files as the caller knows them, so that Spark's file index lists
    none of them. A path it does not know (none, unless the index is refreshed) Spark lists. */
public final class KnownFiles extends org.apache.spark.sql.execution.datasources.FileStatusCache {
    private final java.util.HashMap statuses = new java.util.HashMap();
    private final java.util.ArrayList paths = new java.util.ArrayList();

    /** packed: per file, the UTF-8 length and bytes of its path, then its size and
        modification time in milliseconds (big-endian). */
    public KnownFiles(byte[] packed, org.apache.hadoop.conf.Configuration conf)
            throws java.io.IOException {
        java.nio.ByteBuffer in = java.nio.ByteBuffer.wrap(packed);
        while (in.hasRemaining()) {
            byte[] name = new byte[in.getInt()];
            in.get(name);
            long size = in.getLong();
            long modified = in.getLong();
            org.apache.hadoop.fs.Path path = new org.apache.hadoop.fs.Path(
                new String(name, java.nio.charset.StandardCharsets.UTF_8));
            org.apache.hadoop.fs.FileSystem fs = path.getFileSystem(conf);
            path = fs.makeQualified(path);
            org.apache.hadoop.fs.FileStatus[] status = new org.apache.hadoop.fs.FileStatus[] {
                new org.apache.hadoop.fs.FileStatus(
                    size, false, 1, fs.getDefaultBlockSize(path), modified, path)};
            statuses.put(path, status);
            paths.add(path);
        }
    }

    /** The qualified paths, in the order given. */
    public java.util.List rootPaths() {
        return paths;
    }

    public scala.Option getLeafFiles(org.apache.hadoop.fs.Path path) {
        return scala.Option.apply(statuses.get(path));
    }

    public void putLeafFiles(
            org.apache.hadoop.fs.Path path, org.apache.hadoop.fs.FileStatus[] files) {
        statuses.put(path, files);
    }

    public void invalidateAll() {
        statuses.clear();
    }
}
"""


def parquet_files(
    spark: SparkSession,
    paths: Sequence[str],
    *,
    schema: StructType | str,
    base_path: str | None = None,
    options: Mapping[str, str] | None = None,
    statuses: Sequence[tuple[int, int]] | None = None,
) -> DataFrame:
    """A DataFrame reading exactly ``paths`` with ``schema`` (a StructType or Spark DDL);
    ``base_path`` and ``options`` are Spark's file source options.

    With ``statuses`` (each path's size in bytes and modification time in milliseconds, as a
    table's log records them), Spark trusts them and lists nothing: a file that is not there
    (or not of that size) fails the query that reads it, not this call. That needs the
    session's JVM (not Spark Connect); without it, or without ``statuses``, Spark lists the
    files while the DataFrame is created, with the session's listing parallelism capped at
    ``spark.sparkContext.defaultParallelism`` (never raised) and then restored. The setting
    only sizes the listing job, so another thread's query planned meanwhile reads the same
    files either way.

    Raises:
        ValueError: ``statuses`` does not give one status per path.
        Exception: Spark's own error when a path it lists does not exist or is not Parquet.
    """
    options = {**({"basePath": base_path} if base_path is not None else {}), **(options or {})}
    if statuses is not None:
        if len(statuses) != len(paths):
            raise ValueError(f"{len(statuses)} statuses for {len(paths)} paths")
        known = _known_files_scan(spark, paths, statuses, schema, options)
        if known is not None:
            return known
    reader = spark.read.schema(schema)
    for name, value in options.items():
        reader = reader.option(name, value)
    with _conf_lock:
        before = spark.conf.get(LISTING_PARALLELISM_CONF)
        cap = max(1, spark.sparkContext.defaultParallelism)
        if before is not None and before.isdigit() and int(before) <= cap:
            return reader.parquet(*paths)
        spark.conf.set(LISTING_PARALLELISM_CONF, str(cap))
        try:
            return reader.parquet(*paths)
        finally:
            if before is None:
                spark.conf.unset(LISTING_PARALLELISM_CONF)
            else:
                spark.conf.set(LISTING_PARALLELISM_CONF, before)


def _known_files_scan(
    spark: SparkSession,
    paths: Sequence[str],
    statuses: Sequence[tuple[int, int]],
    schema: StructType | str,
    options: Mapping[str, str],
) -> DataFrame | None:
    """The relation ``spark.read.parquet`` would build, over a file index whose statuses are
    given (Spark's ``HadoopFsRelation`` over an ``InMemoryFileIndex``); ``None`` where the
    Java class is not to be had."""
    cls = compiled_class(spark, _KNOWN_FILES, _KNOWN_FILES_SOURCE, executors=False)
    if cls is None:
        return None
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    session: Any = spark
    jvm, jspark = session._jvm, session._jsparkSession
    sources = jvm.org.apache.spark.sql.execution.datasources
    case_insensitive = getattr(jvm.org.apache.spark.sql.catalyst.util, "CaseInsensitiveMap$")
    parameters = getattr(case_insensitive, "MODULE$").apply(
        jvm.PythonUtils.toScalaMap(dict(options))
    )
    known = new_instance(
        spark,
        cls,
        _packed(paths, statuses),
        jspark.sessionState().newHadoopConfWithOptions(parameters),
    )
    if not isinstance(schema, StructType):
        ddl = jvm.org.apache.spark.sql.types.StructType.fromDDL(schema)
        schema = StructType.fromJson(json.loads(ddl.json()))
    none = jvm.scala.Option.empty()
    index = sources.InMemoryFileIndex(
        jspark,
        jvm.PythonUtils.toSeq(known.rootPaths()),
        parameters,
        jvm.scala.Some(jspark.parseDataType(schema.json())),
        known,
        none,
        none,
    )
    partition_schema = index.partitionSchema()
    # The data columns: the rest, as Spark's DataSource takes them (its resolver's equality).
    fold = (lambda n: n) if spark.conf.get("spark.sql.caseSensitive") == "true" else str.lower
    partitions = {fold(name) for name in partition_schema.fieldNames()}
    data_schema = StructType([f for f in schema.fields if fold(f.name) not in partitions])
    relation = sources.HadoopFsRelation(
        index,
        partition_schema,
        jspark.parseDataType(data_schema.json()),
        none,
        sources.parquet.ParquetFileFormat(),
        parameters,
        jspark,
    )
    return DataFrame(jspark.baseRelationToDataFrame(relation), spark)


def _packed(paths: Sequence[str], statuses: Sequence[tuple[int, int]]) -> bytes:
    """Per path: its UTF-8 length and bytes, its size and modification time (big-endian)."""
    packed = bytearray()
    for path, (size, modified) in zip(paths, statuses, strict=True):
        name = path.encode("utf-8")
        packed += struct.pack(">i", len(name)) + name + struct.pack(">qq", size, modified)
    return bytes(packed)
