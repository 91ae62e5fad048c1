"""A streaming job against S3 run as its own process, so a test can kill the whole driver.

Usage: python -m integration_tests._s3_driver SOURCE TABLE_URI CHECKPOINT [KILL_AT_EPOCH]

Storage options come as JSON in ``SINK_TEST_STORAGE_OPTIONS`` (never on the command line).
With KILL_AT_EPOCH the process group (Python driver, JVM, Python workers) is SIGKILLed after
that epoch's files are staged and before its commit.
"""

from __future__ import annotations

import json
import os
import signal
import sys


def main() -> None:
    source, table, checkpoint = sys.argv[1:4]
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    options = json.loads(os.environ["SINK_TEST_STORAGE_OPTIONS"])
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from committers.delta import DeltaGlobalCommitter, DeltaSink
    from committers.tests._spark_helpers import file_stream, run_available_now
    from framework import TwoPhaseSink

    if kill_at is not None:
        original_commit = DeltaGlobalCommitter.commit

        def commit_or_die(self, global_committables):  # type: ignore[no-untyped-def]
            if any(c.epoch.epoch_id == kill_at for c in global_committables):
                sys.stdout.write("KILLING DRIVER BEFORE COMMIT\n")
                sys.stdout.flush()
                os.killpg(os.getpgid(0), signal.SIGKILL)
            return original_commit(self, global_committables)

        DeltaGlobalCommitter.commit = commit_or_die  # type: ignore[method-assign]

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sink = TwoPhaseSink(
        DeltaSink(table, app_id="killed-driver", partition_by=["day"], storage_options=options)
    )
    run_available_now(sink, file_stream(spark, source), checkpoint)
    print("BATCHES", [(b.batch_id, b.status) for b in sink.batches])
    spark.stop()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # deltalake's runtime can abort at interpreter exit; the work is done
