"""A streaming job run as its own process, so a test can kill the whole driver.

Usage: python -m committers.tests._streaming_driver SOURCE TABLE CHECKPOINT [KILL_AT_EPOCH]

With KILL_AT_EPOCH, the process group (Python driver, JVM, Python workers) is SIGKILLed after
that epoch's files are staged and before its commit: the crash a real driver can suffer.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    source, table, checkpoint = sys.argv[1:4]
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from committers.delta import DeltaGlobalCommitter, DeltaSink
    from committers.tests._spark_helpers import file_stream, run_available_now
    from framework import TwoPhaseSink

    if kill_at is not None:
        original_commit = DeltaGlobalCommitter.commit

        def commit_or_die(self, global_committables):
            if any(c.epoch.epoch_id == kill_at for c in global_committables):
                sys.stdout.write("KILLING DRIVER BEFORE COMMIT\n")
                sys.stdout.flush()
                os.killpg(os.getpgid(0), signal.SIGKILL)
            return original_commit(self, global_committables)

        DeltaGlobalCommitter.commit = commit_or_die

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sink = TwoPhaseSink(DeltaSink(table, app_id="killed-driver", partition_by=["day"]))
    run_available_now(sink, file_stream(spark, source), checkpoint)
    print("BATCHES", [(b.batch_id, b.status) for b in sink.batches])
    spark.stop()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # deltalake's runtime can abort at interpreter exit; the work is done
