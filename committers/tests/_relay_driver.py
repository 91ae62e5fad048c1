"""A Delta-to-Delta relay run as its own process (group), until it is killed.

Usage: python -m committers.tests._relay_driver SOURCE TARGET CHECKPOINT

Streams table SOURCE into table TARGET through the ``"deltalake"`` format on both sides
(:func:`relay`), four source files per micro-batch, with a processing-time trigger: it never
ends by itself. ``SPARKSINK_CRASH_AT`` (see ``framework._crash``) decides where it dies, or the
parent kills its process group.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Source files per micro-batch: the first batch takes part of the starting snapshot.
FILES_PER_BATCH = 4


def relay(spark, source: str, target: str, checkpoint: Path, *, available_now: bool):  # type: ignore[no-untyped-def]
    """Start the query; with ``available_now`` it reads what is committed now and stops."""
    from committers.delta import register

    register(spark)
    stream = (
        spark.readStream.format("deltalake")
        .option("maxFilesPerTrigger", FILES_PER_BATCH)
        .load(source)
    )
    writer = stream.writeStream.format("deltalake").option("checkpointLocation", str(checkpoint))
    trigger = {"availableNow": True} if available_now else {"processingTime": "200 milliseconds"}
    return writer.trigger(**trigger).start(target)


def main() -> None:
    source, target, checkpoint = sys.argv[1:4]
    from committers.tests._spark_helpers import driver_session
    from framework._crash import DRIVER_GROUP_VARIABLE

    os.environ[DRIVER_GROUP_VARIABLE] = str(os.getpgid(0))  # a worker's crash kills us all
    spark = driver_session()
    query = relay(spark, source, target, Path(checkpoint), available_now=False)
    query.awaitTermination()
    raise SystemExit(f"the relay ended without being killed: {query.exception()}")


if __name__ == "__main__":
    main()
