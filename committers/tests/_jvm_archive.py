"""A class-data-sharing archive of the classes a test driver's JVM loads, made once per machine.

The suite starts well over a hundred Spark drivers (every crash test restarts one, often
several times), and a local Spark driver with delta-spark's jars spends most of its start
loading and verifying the same ten thousand classes. Java 17 can dump the classes a run loaded
into an archive (``-XX:ArchiveClassesAtExit``) and map them back in at the next start
(``-XX:SharedArchiveFile``): measured here, a driver's start and first job fell from 11.5-12.5 s
to 6.5-6.9 s.

``python -m committers.tests._jvm_archive`` (``make jvm-archive``, run by ``make test`` and
``make check``) makes the archive by running a small job of each kind the tests run, and makes
it again when the JVM, pyspark or the fetched jars change (a stamp beside it names them). The
JVM checks the archive itself at every start: one made for another class path or JVM is not
used, silently (``-Xlog:cds*=off``), and the driver starts as it would without it. So a stale
or missing archive costs time, never a result.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from committers.tests._jars import fetched_jars, tool

#: The variable that makes :func:`archive_options` dump the classes at exit into its value.
DUMP_VARIABLE = "SPARKSINK_JVM_ARCHIVE_DUMP"


def archive_path() -> Path:
    """Where the archive is kept: beside the fetched jars, in the project's cache."""
    return tool("jars").cache_root() / "jvm" / "test-driver.jsa"


def archive_options() -> str:
    """The JVM options that use the archive (or, while it is made, dump it); empty when there
    is none."""
    dump = os.environ.get(DUMP_VARIABLE)
    if dump:
        return f"-XX:ArchiveClassesAtExit={dump} -Xlog:cds*=off"
    archive = archive_path()
    return f"-XX:SharedArchiveFile={archive} -Xlog:cds*=off" if archive.is_file() else ""


def _stamp() -> str:
    """What the archive was made for: the JVM, pyspark's jars and the fetched jars (names,
    sizes and times)."""
    java = shutil.which("java") or "java"
    version = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    import pyspark

    jars = sorted(Path(pyspark.__file__).parent.joinpath("jars").glob("*.jar"))
    jars += [Path(jar) for jar in fetched_jars()[0]]
    listing = [f"{jar.name} {jar.stat().st_size} {jar.stat().st_mtime_ns}" for jar in jars]
    text = "\n".join([os.path.realpath(java), version, *listing])
    return hashlib.sha256(text.encode()).hexdigest()


def _workload() -> None:
    """The kinds of job the tests run, so that their classes are in the archive: a Delta
    table written, merged and read by delta-spark (when its jars are there), Parquet through
    Arrow, a Python UDF and a streaming query with foreachBatch."""
    from committers.tests._jars import DELTA_SPARK_CONFIGS
    from committers.tests._spark_helpers import driver_session

    delta = bool(fetched_jars()[0])
    spark = driver_session(DELTA_SPARK_CONFIGS if delta else None)
    jvm = spark.sparkContext._gateway.proc  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as scratch:
        df = spark.range(100).selectExpr("id", "cast(id % 3 AS string) AS day")
        df.write.partitionBy("day").parquet(f"{scratch}/p")
        spark.read.parquet(f"{scratch}/p").toArrow()
        df.write.json(f"{scratch}/j")
        spark.range(10).selectExpr("id").rdd.map(lambda row: row[0] * 2).sum()
        if delta:
            table = f"delta.`{scratch}/d`"
            df.write.format("delta").save(f"{scratch}/d")
            spark.sql(
                f"MERGE INTO {table} t USING (SELECT 1L AS id, 'x' AS day) s ON t.id = s.id "
                "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
            )
            spark.read.format("delta").load(f"{scratch}/d").toArrow()
        stream = spark.readStream.schema("id LONG, day STRING").json(f"{scratch}/j")
        query = (
            stream.writeStream.foreachBatch(lambda batch, _: batch.count())
            .option("checkpointLocation", f"{scratch}/checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    spark.stop()
    # The JVM writes the archive as it exits, which it does when its stdin closes: wait for it.
    jvm.stdin.close()
    jvm.wait(timeout=300)


def main() -> int:
    archive = archive_path()
    stamp = archive.with_suffix(".stamp")
    wanted = _stamp()
    if archive.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        print(f"JVM class archive up to date: {archive}")
        return 0
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.partial")
    env = {**os.environ, DUMP_VARIABLE: str(partial)}
    print(f"Making the JVM class archive of the test drivers: {archive}")
    workload = [sys.executable, "-m", __spec__.name, "--workload"]  # type: ignore[name-defined]
    done = subprocess.run(workload, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        # Not fatal: the tests run as they would without it, only slower.
        print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
        print("Could not make the JVM class archive; the tests start their JVMs without it.")
        return 0
    os.replace(partial, archive)
    stamp.write_text(wanted)
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--workload"]:
        _workload()
    else:
        sys.exit(main())
