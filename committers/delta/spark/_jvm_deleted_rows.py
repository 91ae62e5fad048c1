"""The rows deletion vectors delete, dropped inside the JVM: a Java function over each row's
file and position, compiled when first needed.

Matching each row's file to its vector with DataFrame joins costs a hash join per row (a
broadcast join of every row's path string, then an anti join of its key): about twice the
scan itself. delta-spark filters inside its Parquet reader instead. Here a small Java class
(:data:`_SOURCE`), compiled with Janino (which every Spark ships for its own code generation)
and given to the executors as a jar (``SparkContext.addJar``), holds every file of the scan by
the ``xxhash64`` of its path (Spark's function, seed 42) and, for those with a vector, the sorted
deleted positions; each row asks it with the hash of its path and its ``_metadata.row_index``.
A row of a file the function does not hold gets ``NULL``, which the caller turns into a failed
query (never a row returned with its deleted rows). No string crosses from a row into Java.

Two files of one scan whose paths hash alike cannot be told apart: the function then refuses
to be built and the caller joins instead, as it does on Spark Connect (no JVM here) or when
compiling fails; :func:`keep_live_rows` returns ``None`` in all those cases.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from framework.spark.connector import compiled_class, new_instance

if TYPE_CHECKING:
    from pyspark.sql import Column, SparkSession

__all__ = ["keep_live_rows"]

log = logging.getLogger("committers.delta")

_CLASS = "sparksink.jvm.LiveRows"
# Janino compiles Java without generics: the UDF2 method is the erased one.
_SOURCE = """
package sparksink.jvm;

/** Whether a row of a Delta scan is live: (xxhash64 of its file's path, its row index). */
public final class LiveRows implements org.apache.spark.sql.api.java.UDF2, java.io.Serializable {
    private static final long serialVersionUID = 1L;
    /** xxhash64 of a path -> the file's deleted row indexes, sorted (empty: none). */
    private final java.util.HashMap deleted = new java.util.HashMap();

    /** packed: per file, the UTF-8 length and bytes of its path, the number of its deleted
        rows and those (little-endian). Throws when two paths hash alike. */
    public LiveRows(byte[] packed) {
        java.nio.ByteBuffer in = java.nio.ByteBuffer.wrap(packed)
            .order(java.nio.ByteOrder.LITTLE_ENDIAN);
        while (in.hasRemaining()) {
            byte[] path = new byte[in.getInt()];
            in.get(path);
            long[] rows = new long[in.getInt()];
            in.asLongBuffer().get(rows);
            in.position(in.position() + 8 * rows.length);
            Long key = Long.valueOf(org.apache.spark.sql.catalyst.expressions.XXH64.hashUnsafeBytes(
                path, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET, path.length, 42L));
            if (deleted.put(key, rows) != null) {
                throw new IllegalArgumentException("two files of the scan hash alike");
            }
        }
    }

    /** TRUE: live; FALSE: deleted; NULL: no file of the scan has this hash. */
    public Object call(Object pathHash, Object rowIndex) {
        long[] rows = (long[]) deleted.get(pathHash);
        if (rows == null) {
            return null;
        }
        if (rows.length == 0) {
            return Boolean.TRUE;
        }
        long row = ((Long) rowIndex).longValue();
        return Boolean.valueOf(java.util.Arrays.binarySearch(rows, row) < 0);
    }
}
"""


def keep_live_rows(
    spark: SparkSession,
    file_path: Column,
    row_index: Column,
    vectors: Mapping[str, np.ndarray],
    files: Sequence[str],
) -> Column | None:
    """A boolean column over ``file_path`` (a string) and ``row_index``: TRUE for a live row,
    FALSE for one ``vectors`` (path -> sorted deleted row indexes) delete, NULL for a row of a
    file not among ``files`` (the distinct paths ``file_path`` may hold, those of ``vectors``
    among them; a vector of another path is never applied, as in the join).
    ``None`` when the JVM cannot filter here (see the module docstring): join instead."""
    from pyspark.sql import functions as F

    live_rows = compiled_class(spark, _CLASS, _SOURCE, executors=True)
    if live_rows is None:
        return None
    try:
        function = new_instance(spark, live_rows, _packed(files, vectors))
    except Exception as err:  # (two paths hashing alike: py4j's error, its cause inside)
        log.debug("deletion vectors: the JVM filter refused this scan (%s); joining", err)
        return None
    jvm: Any = spark._jvm
    udf = _java_udf2(spark, function, jvm.org.apache.spark.sql.types.DataTypes.BooleanType)
    arguments = jvm.PythonUtils.toSeq([F.xxhash64(file_path)._jc, row_index._jc])
    return _column(udf.apply(arguments))


def _java_udf2(spark: SparkSession, function: Any, return_type: Any) -> Any:
    """``functions.udf(UDF2, DataType)``, the Java UDF API, called by reflection. Through
    py4j, ``functions.udf(function, type)`` matches ``udf(UDF2, DataType)`` and the untyped
    Scala ``udf(Object, DataType)`` alike and takes whichever the JVM lists first: with a
    class-data-sharing archive it listed the Scala one, which Spark refuses
    (UNTYPED_SCALA_UDF)."""
    session: Any = spark
    gateway, jvm = session.sparkContext._gateway, session._jvm
    forName = jvm.java.lang.Class.forName
    parameters = gateway.new_array(jvm.java.lang.Class, 2)
    parameters[0] = forName("org.apache.spark.sql.api.java.UDF2")
    parameters[1] = forName("org.apache.spark.sql.types.DataType")
    method = forName("org.apache.spark.sql.functions").getMethod("udf", parameters)
    arguments = gateway.new_array(jvm.java.lang.Object, 2)
    arguments[0], arguments[1] = function, return_type
    return method.invoke(None, arguments)


def _packed(paths: Iterable[str], vectors: Mapping[str, np.ndarray]) -> bytes:
    """The constructor's argument: per path, its UTF-8 length and bytes, then the number of its
    deleted rows and those (little-endian)."""
    packed = bytearray()
    for path in paths:
        name = path.encode("utf-8")
        deleted = vectors.get(path, np.empty(0, np.uint64)).astype("<i8", copy=False)
        packed += struct.pack("<i", len(name)) + name + struct.pack("<i", len(deleted))
        packed += deleted.tobytes()
    return bytes(packed)


def _column(java_column: Any) -> Column:
    from pyspark.sql.classic.column import Column as ClassicColumn

    return ClassicColumn(java_column)
