"""Long run: 1,000 micro-batches of a streaming query into one Delta table, to show that
nothing grows without bound.

Usage: python benchmarks/long_run.py [BATCHES] [--trigger-ms N] [--log-retention DURATION]

A rate source (200 rows/s) feeds ``TwoPhaseSink(DeltaSink(...)).write_stream`` with a short
processing-time trigger. Per window of 100 batches it prints the commit latency (p50/p99 of
``BatchMetrics.commit_ms``), the size of ``_delta_log`` and how many log checkpoints it holds,
and the resident memory of the Python driver and of the driver JVM. The figures are
timings: take them on a quiet machine (the 1-minute load average is printed).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _common import machine, spark_session

WINDOW = 100


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def driver_jvm_pid() -> int:
    """The JVM this Python driver started (its child running java)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if parent == os.getpid() and b"java" in command:
            return int(entry.name)
    raise RuntimeError("no driver JVM found among this process's children")


def log_figures(table: Path) -> tuple[float, int, int]:
    """(_delta_log size in KiB, commit files, checkpoint files)."""
    files = list((table / "_delta_log").iterdir())
    size = sum(f.stat().st_size for f in files if f.is_file()) / 1024
    commits = sum(1 for f in files if f.name.endswith(".json") and f.name[:20].isdigit())
    checkpoints = sum(1 for f in files if ".checkpoint." in f.name)
    return size, commits, checkpoints


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("batches", type=int, nargs="?", default=1000)
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument(
        "--log-retention",
        default=None,
        help="delta.logRetentionDuration of the table, e.g. 'interval 1 minute' (default 30 days)",
    )
    args = parser.parse_args()
    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    print(f"machine: {machine()}; load average at start {os.getloadavg()[0]:.2f}")
    spark = spark_session("long-run")
    jvm = driver_jvm_pid()
    workdir = Path(tempfile.mkdtemp(prefix="long-run-"))
    table = workdir / "table"
    commit_ms: list[float] = []
    rows: list[int] = []
    done = threading.Event()
    header = "batches    commit p50 ms  p99 ms  log KiB  commits  checkpoints  python MiB  jvm MiB"
    print(header)

    def on_batch(metrics) -> None:  # type: ignore[no-untyped-def]
        commit_ms.append(metrics.commit_ms)
        rows.append(metrics.rows)
        count = len(commit_ms)
        if count % WINDOW == 0:
            window = commit_ms[-WINDOW:]
            size, commits, checkpoints = log_figures(table)
            print(
                f"{count - WINDOW + 1:>4}-{count:<5} {statistics.median(window):>12.1f}"
                f"  {percentile(window, 0.99):>6.1f}  {size:>7.0f}  {commits:>7}"
                f"  {checkpoints:>11}  {rss_mib(os.getpid()):>10.0f}  {rss_mib(jvm):>7.0f}",
                flush=True,
            )
        if count >= args.batches:
            done.set()

    stream = spark.readStream.format("rate").option("rowsPerSecond", 200).load()
    configuration = {"delta.logRetentionDuration": args.log_retention} if args.log_retention else {}
    delta_sink = DeltaSink(str(table), app_id="long-run", table_configuration=configuration)
    sink = TwoPhaseSink(delta_sink, on_batch=on_batch)
    started = time.monotonic()
    query = sink.write_stream(
        stream.selectExpr("value AS id", "timestamp AS ts"),
        checkpoint_location=str(workdir / "checkpoint"),
        trigger={"processingTime": f"{args.trigger_ms} milliseconds"},
    )
    done.wait()
    query.stop()
    elapsed = time.monotonic() - started
    print(
        f"{len(commit_ms)} batches, {sum(rows)} rows in {elapsed:.0f} s; "
        f"load average at end {os.getloadavg()[0]:.2f}; table {table}"
    )
    spark.stop()


if __name__ == "__main__":
    main()
