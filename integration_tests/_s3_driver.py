"""A streaming job against S3 run as its own process, so a test can kill the whole driver.

Usage: python -m integration_tests._s3_driver SOURCE TABLE_URI CHECKPOINT [KILL_AT_EPOCH]

The job of ``committers.tests._streaming_driver`` (SIGKILL of the process group after epoch
KILL_AT_EPOCH is staged and before its commit), with storage options taken as JSON from
``SINK_TEST_STORAGE_OPTIONS`` (never from the command line) and an optional pause after each
batch from ``SINK_TEST_BATCH_PAUSE`` (seconds).
"""

from __future__ import annotations

import json
import os
import sys

from committers.tests._streaming_driver import run_job


def main() -> None:
    source, table, checkpoint = sys.argv[1:4]
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    options = json.loads(os.environ["SINK_TEST_STORAGE_OPTIONS"])
    pause = float(os.environ.get("SINK_TEST_BATCH_PAUSE", "0"))
    run_job(source, table, checkpoint, kill_at, storage_options=options, batch_pause=pause)


if __name__ == "__main__":
    main()
