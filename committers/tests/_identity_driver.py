"""A bounded append into a table with an identity column, run as its own process so a test can
kill it between staging and commit.

Usage: python -m committers.tests._identity_driver TABLE

Appends ``v`` = 100..106 (three partitions) to ``TABLE`` as epoch 0 of app id ``ingest``;
``SPARKSINK_CRASH_AT`` (see ``framework._crash``) decides where the process dies.
"""

from __future__ import annotations

import sys

APP_ID = "ingest"


def identity_batch(spark):  # type: ignore[no-untyped-def]
    """The rows the driver appends (the identity column left to the table)."""
    return spark.range(100, 107, numPartitions=3).selectExpr("CAST(id AS INT) AS v")


def main(table: str) -> None:
    from committers.delta import DeltaSink
    from committers.tests._spark_helpers import driver_session
    from framework import TwoPhaseSink

    spark = driver_session()
    TwoPhaseSink(DeltaSink(table, app_id=APP_ID)).write(identity_batch(spark), epoch_id=0)


if __name__ == "__main__":
    main(sys.argv[1])
