"""Helpers for Spark-driven sink tests: file sources, queries, crash-injecting sinks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from committers.delta import DeltaSink
from committers.delta.write._writer import DeltaStagingWriter
from committers.tests._jvm_archive import archive_options

SOURCE_SCHEMA = "id LONG, day STRING"

#: JVM options of every JVM the tests start (drivers, executors, standalone master and
#: workers): they run many small jobs on little data, where the C1 compiler alone and the
#: serial collector spend far less CPU on JIT compilation and GC threads than the defaults,
#: which only pay off on long, large jobs. On 2 cores a test driver starts and runs its job in
#: about two thirds of the time; the session's own JVM cut the CPU of the table and read tests
#: by 17 %.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

#: The options of a local-mode driver's JVM (its executors run in it): the above, and the class
#: archive of `make jvm-archive` where there is one (:mod:`committers.tests._jvm_archive`).
DRIVER_JVM_OPTIONS = f"{TEST_JVM_OPTIONS} {archive_options()}".strip()


def driver_session(configs: dict[str, str] | None = None):
    """The local[2] SparkSession of a test driver run as its own process (its Python workers
    run this interpreter, its JVM binds the loopback); with the jars of `make jars`
    (hadoop-aws: Spark's staging on S3) when they were fetched, and ``configs``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from committers.tests._jars import fetched_jars, local_jar_configs

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.extraJavaOptions", DRIVER_JVM_OPTIONS)
    )
    jars, _ = fetched_jars()
    for key, value in {**local_jar_configs(jars), **(configs or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_bounded_driver(write) -> None:  # type: ignore[no-untyped-def]
    """The ``main`` of a driver of one bounded write, run as ``python -m DRIVER TABLE``:
    ``write(spark, table)`` returns its ``BatchMetrics``; prints ``STATUS <status>`` when the
    process ends on its own (``SPARKSINK_CRASH_AT`` may kill it before)."""
    (table,) = sys.argv[1:2]
    spark = driver_session()
    print("STATUS", write(spark, table).status, flush=True)
    spark.stop()


def write_source_file(directory: Path, name: str, ids) -> None:
    """One JSON-lines file of the streaming source (written atomically via rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{name}.tmp"
    tmp.write_text("".join(json.dumps({"id": i, "day": f"d{i % 3}"}) + "\n" for i in ids))
    tmp.rename(directory / f"{name}.json")


def make_source(
    tmp_path: Path, files: int, per_file: int = 10, start: int = 0, name: str = "src"
) -> Path:
    """A source directory ``tmp_path / name`` of ``files`` files holding consecutive ids from
    ``start``, ``per_file`` ids each (file ``part-000`` first)."""
    directory = tmp_path / name
    for f in range(files):
        first = start + f * per_file
        write_source_file(directory, f"part-{f:03d}", range(first, first + per_file))
    return directory


def file_stream(spark, directory: Path):
    """A streaming DataFrame reading one source file per micro-batch."""
    return (
        spark.readStream.schema(SOURCE_SCHEMA).option("maxFilesPerTrigger", 1).json(str(directory))
    )


#: Spark waits a fixed 10 s (PythonWorkerFactory.createSimpleWorker, not configurable) for a
#: new Python worker to connect back; on a busy 2-core machine the Spark Connect server's
#: foreachBatch worker sometimes takes longer to import pyspark's Connect client. The query
#: has not started then (nothing ran, nothing was written), so starting it again is safe.
_WORKER_START_TIMEOUT = "Python worker failed to connect back"


def run_available_now(sink, df, checkpoint: Path):
    """Process everything available, then stop; re-raises the query's failure. A query whose
    Python worker did not start in Spark's fixed 10 s is started again (twice at most)."""
    for attempt in range(3):
        try:
            query = sink.write_stream(
                df, checkpoint_location=str(checkpoint), trigger={"availableNow": True}
            )
            break
        except Exception as err:
            if _WORKER_START_TIMEOUT not in str(err) or attempt == 2:
                raise
    query.awaitTermination()
    return query


def drain_available_now(df, checkpoint: Path, collect) -> None:
    """Run the streaming ``df`` into ``collect(batch_df, batch_id)`` (``foreachBatch``) with
    ``availableNow`` from ``checkpoint``; re-raises the query's failure."""
    query = (
        df.writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    if query.exception() is not None:
        raise query.exception()


def forget_newest_commit(checkpoint: Path) -> int:
    """Delete the newest entry of the checkpoint's commits/ (and its checksum) so Spark runs
    that batch again on restart; returns its batch id."""
    commits = checkpoint / "commits"
    newest = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(newest)).unlink()
    (commits / f".{newest}.crc").unlink(missing_ok=True)
    return newest


class _CrashingWriter(DeltaStagingWriter):
    """Stages its files completely, then kills its own Python worker on the first attempt."""

    def __init__(self, *args, crash_record: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._crash_record = crash_record

    def prepare_commit(self, flush: bool):
        files = super().prepare_commit(flush)
        if self._context.attempt_number == 0 and self._context.partition_id == 0:
            with open(self._crash_record, "a") as out:
                out.writelines(f.path + "\n" for f in files)
            os._exit(1)  # a hard crash: no abort(), no cleanup, the worker process is gone
        return files


class CrashingFirstAttemptSink(DeltaSink):
    """A DeltaSink whose task for partition 0 dies after staging, on its first attempt."""

    def __init__(self, *args, crash_record: str, **kwargs) -> None:
        super().__init__(*args, staging="arrow", **kwargs)  # the crash is in Python writers
        self.crash_record = crash_record

    def create_writer(self, context):
        _, plan = self._prepared()
        return _CrashingWriter(
            context, self.location, plan.layout, self.options, crash_record=self.crash_record
        )
