"""An overwrite that replaces the table's schema and partitioning, run as its own process (so a
test can kill it).

Usage: python -m committers.tests._schema_overwrite_driver TABLE

Writes ``NEW_ROWS`` with ``DeltaSink(TABLE, app_id=APP_ID, mode="overwrite",
schema_mode="overwrite", partition_by=["day"])`` as epoch 1. ``SPARKSINK_CRASH_AT`` (see
``framework._crash``) decides where the process dies; prints ``STATUS <status>`` when it ends
on its own.
"""

from __future__ import annotations

APP_ID = "reshape"
#: (id, name, day, score)
NEW_ROWS = [
    (10, "ten", "2026-11-01", 1.5),
    (11, "", "2026-11-01", float("nan")),
    (12, "野🇯🇵", "2026-11-02", None),
]


def overwrite_schema(spark, table: str):  # type: ignore[no-untyped-def]
    """Epoch 1 of the overwrite; its ``BatchMetrics``."""
    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    rows = spark.createDataFrame(NEW_ROWS, "id long, name string, day string, score double")
    sink = DeltaSink(
        table, app_id=APP_ID, mode="overwrite", schema_mode="overwrite", partition_by=["day"]
    )
    return TwoPhaseSink(sink).write(rows, epoch_id=1)


if __name__ == "__main__":
    from committers.tests._spark_helpers import run_bounded_driver

    run_bounded_driver(overwrite_schema)
