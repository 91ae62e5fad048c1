"""A bounded job on ``local-cluster[2,1,1024]`` that loses an executor while it stages.

Usage: python -m committers.tests._executor_loss_driver TABLE STAGING WORKDIR

Partition 0's first attempt stops on its 1,500th row (after some of its rows were written) and
leaves a note with its process ids; this driver then SIGKILLs that executor's JVM and its
Python workers, as a lost machine would end them. Spark reschedules the partition elsewhere.
Prints ``ROWS <n> FILES <n>`` of the committed batch.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

ROWS, PARTITIONS, STOP_AT = 8_000, 4, 1_500


def _parent_of(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1])


def _stop_first_attempt(note: str):  # type: ignore[no-untyped-def]
    from pyspark import TaskContext

    seen = 0

    def stop(ids):  # type: ignore[no-untyped-def]
        nonlocal seen
        task = TaskContext.get()
        if task.partitionId() == 0 and task.attemptNumber() == 0:
            seen += len(ids)
            if seen >= STOP_AT:
                daemon = os.getppid()  # PySpark's worker daemon; its parent is the executor JVM
                Path(note).write_text(f"{_parent_of(daemon)} {os.getpgid(daemon)}")
                time.sleep(600)  # killed long before
        return ids

    return stop


def _kill_executor_when_noted(note: Path) -> None:
    while not note.exists() or not note.read_text():
        time.sleep(0.1)
    jvm, workers = (int(part) for part in note.read_text().split())
    os.kill(jvm, signal.SIGKILL)
    os.killpg(workers, signal.SIGKILL)
    print(f"KILLED EXECUTOR {jvm}", flush=True)


def main() -> None:
    table, staging, workdir = sys.argv[1:4]
    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, pandas_udf

    from committers.delta import DeltaSink
    from committers.tests._spark_helpers import DRIVER_JVM_OPTIONS, TEST_JVM_OPTIONS
    from framework import TwoPhaseSink

    os.environ["SPARK_HOME"] = os.path.dirname(pyspark.__file__)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    note = Path(workdir) / "stopped-attempt"
    spark = (
        SparkSession.builder.master("local-cluster[2,1,1024]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.task.maxFailures", "4")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "250")
        .config("spark.driver.extraJavaOptions", DRIVER_JVM_OPTIONS)
        .config("spark.executor.extraJavaOptions", TEST_JVM_OPTIONS)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    stop = pandas_udf(_stop_first_attempt(str(note)), "long")  # type: ignore[call-overload]
    df = spark.range(0, ROWS, numPartitions=PARTITIONS).select(
        stop("id").alias("id"), (col("id") % 3).cast("string").alias("day")
    )
    threading.Thread(target=_kill_executor_when_noted, args=(note,), daemon=True).start()
    sink = DeltaSink(table, app_id="executor-loss", staging=staging)  # type: ignore[arg-type]
    metrics = TwoPhaseSink(sink).write(df)
    print(f"ROWS {metrics.rows} FILES {metrics.files}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
