"""The job the Spark cluster tests submit (``spark-submit`` in the driver's container, with the
packed virtualenv in ``--archives``): JSON files in S3, read through s3a, streamed with
``availableNow`` into a Delta table in S3 by ``TwoPhaseSink(DeltaSink(...))``.

Usage: cluster_job.py TABLE_URI SOURCE_URI CHECKPOINT STAGING [STALL_NOTE_URI]

The S3 endpoint and keys come from the environment (``S3_ENDPOINT``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``). With ``STALL_NOTE_URI``, the first attempt of partition 0 of the
first batch stalls half-way through its rows, after writing the note (its host name: the
container) at that URI, so that the test can kill or freeze that container mid-stage; a frozen
attempt that thaws finishes its rows and its staging late, as a zombie executor does. Prints
``BATCHES <n> ROWS <n>`` when the query ends.
"""

from __future__ import annotations

import os
import socket
import sys
import time

STALL_AFTER_ROWS = 100
STALL_SECONDS = 45.0


def _stall_first_attempt(note_uri: str, options: dict[str, str]):  # type: ignore[no-untyped-def]
    def stall(batches):  # type: ignore[no-untyped-def]
        import fsspec
        from pyspark import TaskContext

        task = TaskContext.get()
        fs, path = fsspec.core.url_to_fs(note_uri, **options)
        stalls = task.partitionId() == 0 and task.attemptNumber() == 0 and not fs.exists(path)
        seen = 0
        for batch in batches:
            seen += batch.num_rows
            if stalls and seen >= STALL_AFTER_ROWS:
                stalls = False  # once in the whole job: the note stays
                with fs.open(path, "w") as note:
                    note.write(socket.gethostname())
                time.sleep(STALL_SECONDS)  # killed or frozen meanwhile
            yield batch

    return stall


def main() -> None:
    table_uri, source_uri, checkpoint, staging, *stall = sys.argv[1:]
    from pyspark.sql import SparkSession

    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    options = {
        "AWS_ENDPOINT_URL": os.environ["S3_ENDPOINT"],
        "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }
    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    rows = (
        spark.readStream.schema("id long, day string")
        .option("maxFilesPerTrigger", 2)
        .json(source_uri.replace("s3://", "s3a://", 1))
    )
    if stall:
        fs_options = {
            "key": options["AWS_ACCESS_KEY_ID"],
            "secret": options["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": options["AWS_ENDPOINT_URL"]},
        }
        rows = rows.mapInArrow(_stall_first_attempt(stall[0], fs_options), rows.schema)
    sink = TwoPhaseSink(
        DeltaSink(
            table_uri,
            app_id="cluster",
            partition_by=["day"],
            staging=staging,  # type: ignore[arg-type]
            storage_options=options,
        )
    )
    query = sink.write_stream(rows, checkpoint_location=checkpoint, trigger={"availableNow": True})
    query.awaitTermination()
    batches = [b for b in sink.batches if b.status == "committed"]
    print(f"BATCHES {len(batches)} ROWS {sum(b.rows for b in batches)}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
