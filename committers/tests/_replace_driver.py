"""An overwrite with a ``replace_where`` on a data column, run as its own process (so a test can
kill it).

Usage: python -m committers.tests._replace_driver TABLE

Writes ids 10 and 12 (even) with ``DeltaSink(TABLE, app_id="evens", mode="overwrite",
replace_where="is_even = true")`` as epoch 1. ``SPARKSINK_CRASH_AT`` (see ``framework._crash``)
decides where the process dies; prints ``STATUS <status>`` when it ends on its own.
"""

from __future__ import annotations

APP_ID = "evens"
REPLACE_WHERE = "is_even = true"
NEW_IDS = (10, 12)


def overwrite_evens(spark, table: str):  # type: ignore[no-untyped-def]
    """Epoch 1 of the overwrite; its ``BatchMetrics``."""
    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    rows = spark.createDataFrame(
        [(i, i % 2 == 0, f"new{i}") for i in NEW_IDS], "id long, is_even boolean, s string"
    )
    sink = DeltaSink(table, app_id=APP_ID, mode="overwrite", replace_where=REPLACE_WHERE)
    return TwoPhaseSink(sink).write(rows, epoch_id=1)


if __name__ == "__main__":
    from committers.tests._spark_helpers import run_bounded_driver

    run_bounded_driver(overwrite_evens)
