"""A streaming job run as its own process, so a test can kill the whole driver.

Usage: python -m committers.tests._streaming_driver SOURCE TABLE CHECKPOINT [KILL_AT_EPOCH]

With KILL_AT_EPOCH, the process group (Python driver, JVM, Python workers) is SIGKILLed after
that epoch's files are staged and before its commit: the crash a real driver can suffer.
:func:`run_job` is also the body of ``integration_tests._s3_driver`` (the same job on S3).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

STAGING_VARIABLE = "DELTA_SINK_TEST_STAGING"  # set by the each_staging fixture


def run_job(
    source: str,
    table: str,
    checkpoint: str,
    kill_at: int | None = None,
    storage_options: dict[str, str] | None = None,
    batch_pause: float = 0.0,
) -> None:
    """Run the job: ``DeltaSink(table, app_id="killed-driver", partition_by=["day"])`` fed one
    source file per micro-batch, sleeping ``batch_pause`` seconds after each; prints
    ``BATCHES [(batch id, status), ...]`` at the end."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from committers.delta import DeltaGlobalCommitter, DeltaSink
    from committers.tests._spark_helpers import driver_session, file_stream, run_available_now
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

    spark = driver_session()
    sink = TwoPhaseSink(
        DeltaSink(
            table,
            app_id="killed-driver",
            partition_by=["day"],
            storage_options=storage_options,
            staging=os.environ.get(STAGING_VARIABLE, "auto"),  # type: ignore[arg-type]
        ),
        on_batch=(lambda _metrics: time.sleep(batch_pause)) if batch_pause else None,
    )
    run_available_now(sink, file_stream(spark, Path(source)), Path(checkpoint))
    print("BATCHES", [(b.batch_id, b.status) for b in sink.batches])
    spark.stop()


def main() -> None:
    source, table, checkpoint = sys.argv[1:4]
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    run_job(source, table, checkpoint, kill_at)


if __name__ == "__main__":
    main()
