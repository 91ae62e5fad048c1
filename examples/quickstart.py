"""Quickstart: an exactly-once streaming job into a local Delta table, interrupted and restarted.

Run with `make demo`. What it shows:

1. A streaming query reads order files and writes them through TwoPhaseSink(DeltaSink(...)):
   every micro-batch becomes ONE Delta transaction keyed by (app id, batch id).
2. The job stops, and we make things worse: the checkpoint "forgets" that its newest batch was
   finished, exactly what happens when a driver dies after the sink committed but before Spark
   recorded the batch. (The test suite also SIGKILLs a real driver between staging and commit.)
3. More files arrive and the query restarts from its checkpoint: Spark replays the forgotten
   batch, the sink finds its transaction already in the table and skips it before writing any
   file, and the new files are written.
4. The table is read back with delta-rs (no Spark, no JVM Delta jars) and checked: every order
   exactly once.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from _orders import quiet_logging, report, run_demo, spark_session

FILES, ORDERS_PER_FILE = 6, 1000
OUT = Path(os.environ.get("DEMO_OUTPUT", Path(__file__).resolve().parent.parent / "demo-output"))


def main() -> int:
    quiet_logging()
    shutil.rmtree(OUT, ignore_errors=True)
    table = OUT / "orders-delta"
    spark = spark_session("quickstart")
    try:
        run_demo(
            spark, uri=str(table), options=None, work=OUT, files=FILES, per_file=ORDERS_PER_FILE
        )
    finally:
        spark.stop()
    return 0 if report(str(table), None, FILES * ORDERS_PER_FILE) else 1


if __name__ == "__main__":
    sys.exit(main())
