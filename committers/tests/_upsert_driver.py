"""A CDC upsert stream, run in the test process or as its own process (so a test can kill it).

Usage: python -m committers.tests._upsert_driver SOURCE TABLE CHECKPOINT [GO_FILE]

Reads change files (``id, name, day, ts, op``; one file per micro-batch) into ``DeltaSink(TABLE,
mode="upsert", keys=["id"], sequence_by="ts", delete_when="op = 'D'", partition_by=["day"])``.
``SPARKSINK_CRASH_AT`` (see ``framework._crash``) decides where the process dies. Logs each
batch's line (``framework.spark`` at INFO, on stderr) and prints ``BATCHES [(batch id,
status), ...]`` when it ends on its own. With GO_FILE, it starts Spark first and waits for that
file to exist before it starts the query (so a test overlaps the start-up with its own work).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

CHANGE_SCHEMA = "id LONG, name STRING, day STRING, ts LONG, op STRING"
APP_ID = "cdc"


def cdc_sink(table: str):  # type: ignore[no-untyped-def]
    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    return TwoPhaseSink(
        DeltaSink(
            table,
            app_id=APP_ID,
            partition_by=["day"],
            mode="upsert",
            keys=["id"],
            sequence_by="ts",
            delete_when="op = 'D'",
        )
    )


def run_cdc_stream(spark, source: str, table: str, checkpoint: str):  # type: ignore[no-untyped-def]
    """Process every change file available now; returns the sink (its ``batches``)."""
    from committers.tests._spark_helpers import run_available_now

    stream = spark.readStream.schema(CHANGE_SCHEMA).option("maxFilesPerTrigger", 1).json(source)
    sink = cdc_sink(table)
    run_available_now(sink, stream, Path(checkpoint))
    return sink


def write_changes(directory: Path, order: int, changes: list[tuple]) -> None:
    """The change file ``part-<order>.json``, JSON lines of ``(id, name, day, ts, op)``, written
    atomically. Its modification time is ``order`` seconds after the first file's: Spark's
    file source takes files in that order (files written within one clock tick could come in
    any order)."""
    directory.mkdir(parents=True, exist_ok=True)
    keys = ("id", "name", "day", "ts", "op")
    tmp = directory / f".part-{order}.tmp"
    tmp.write_text("".join(json.dumps(dict(zip(keys, c, strict=True))) + "\n" for c in changes))
    first = min((p.stat().st_mtime for p in directory.glob("part-*.json")), default=time.time())
    moment = first + order
    os.utime(tmp, (moment, moment))
    tmp.rename(directory / f"part-{order}.json")


@dataclass(frozen=True)
class KilledRun:
    """What :func:`run_then_kill_a_replay` saw: the batches run in the test process, and the
    driver process's exit code and output."""

    first_batches: list[tuple[int, str]]
    returncode: int | None
    stdout: str
    stderr: str


def run_then_kill_a_replay(spark, source: Path, table: str, checkpoint: Path, batches) -> KilledRun:  # type: ignore[no-untyped-def]
    """Batches 0 and 1 of ``batches`` run here; the checkpoint then forgets that batch 1
    finished. The stream restarts as its own process (this module's ``main``): batch 1 is a
    replay, and the process is SIGKILLed after staging batch 2, before its commit."""
    from committers.tests._spark_helpers import forget_newest_commit
    from framework._crash import CRASH_VARIABLE

    work = checkpoint.parent
    go, out, err = work / "go", work / "driver.out", work / "driver.err"
    root = Path(__file__).resolve().parents[2]
    arguments = [str(source), table, str(checkpoint), str(go)]
    with out.open("w") as stdout_file, err.open("w") as stderr_file:
        process = subprocess.Popen(  # starts Spark now, runs the stream once `go` exists
            [sys.executable, "-m", "committers.tests._upsert_driver", *arguments],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root), CRASH_VARIABLE: "before_commit@2"},
            stdout=stdout_file,
            stderr=stderr_file,
            start_new_session=True,  # the crash kills its own process group, not the caller's
        )
    try:
        for index in (0, 1):
            write_changes(source, index, batches[index])
        first = run_cdc_stream(spark, str(source), table, str(checkpoint))
        assert forget_newest_commit(checkpoint) == 1
        write_changes(source, 2, batches[2])
        go.touch()
        process.wait(timeout=300)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return KilledRun(
        [(b.batch_id, b.status) for b in first.batches],
        process.returncode,
        out.read_text(),
        err.read_text(),
    )


def main() -> None:
    source, table, checkpoint = sys.argv[1:4]
    logging.getLogger("framework.spark").setLevel(logging.INFO)  # a line per batch, on stderr
    from committers.tests._spark_helpers import driver_session

    spark = driver_session()
    if len(sys.argv) > 4:
        go = Path(sys.argv[4])
        while not go.exists():
            time.sleep(0.05)
    sink = run_cdc_stream(spark, source, table, checkpoint)
    print("BATCHES", [(b.batch_id, b.status) for b in sink.batches], flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
