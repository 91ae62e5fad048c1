"""A streaming job against S3 run as its own process, so a test can kill the whole driver.

Usage: python -m integration_tests._s3_driver SOURCE TABLE_URI CHECKPOINT [KILL_AT_EPOCH]

The job of ``committers.tests._streaming_driver`` (SIGKILL of the process group after epoch
KILL_AT_EPOCH is staged and before its commit), with storage options taken as JSON from
``SINK_TEST_STORAGE_OPTIONS`` (never from the command line) and an optional pause after each
batch from ``SINK_TEST_BATCH_PAUSE`` (seconds).

With ``SINK_TEST_LOSE_CLEAN_UP=1`` the background staging clean-up never gets an answer (its
worker blocks, as on a store that stopped responding) and, once the stream has finished, the
process group is SIGKILLed: a driver lost after its batches returned and before their staging
was cleaned up.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

from committers.tests._streaming_driver import run_job


def main() -> None:
    source, table, checkpoint = sys.argv[1:4]
    kill_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    options = json.loads(os.environ["SINK_TEST_STORAGE_OPTIONS"])
    pause = float(os.environ.get("SINK_TEST_BATCH_PAUSE", "0"))
    lose_clean_up = os.environ.get("SINK_TEST_LOSE_CLEAN_UP") == "1"
    if lose_clean_up:
        from committers.delta.commit._staging_cleanup import StagingCleaner

        StagingCleaner._clean = lambda self, job: threading.Event().wait()  # type: ignore[method-assign]
    run_job(source, table, checkpoint, kill_at, storage_options=options, batch_pause=pause)
    if lose_clean_up:
        sys.stdout.write("KILLING DRIVER BEFORE ITS CLEAN-UP\n")
        sys.stdout.flush()
        os.killpg(os.getpgid(0), signal.SIGKILL)


if __name__ == "__main__":
    main()
