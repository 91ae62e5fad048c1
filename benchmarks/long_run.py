"""Long run: 1,000 micro-batches of a streaming query into one Delta table, to show that
nothing grows without bound, with and without auto-compaction.

Usage: python benchmarks/long_run.py [BATCHES] [--trigger-ms N] [--log-retention DURATION]
    [--auto-compact on|off|both] [--min-files N] [--window N]

A rate source (200 rows/s) feeds ``TwoPhaseSink(DeltaSink(...)).write_stream`` with a short
processing-time trigger, once per auto-compaction setting asked (``both``: with it, then
without, each into its own table). Per window of 100 batches it prints the commit latency
(p50/p99 of ``BatchMetrics.commit_ms``), the time after the commits (p50/max of
``BatchMetrics.upkeep_ms``: staging clean-up and auto-compactions), the table's live files
and the compactions so far, the size of ``_delta_log`` and how many log checkpoints it holds,
and the resident memory of the Python driver and of the driver JVM. The figures are timings:
take them on a quiet machine (the 1-minute load average is printed).
"""

from __future__ import annotations

import argparse
import logging
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


def live_files(table: Path) -> int:
    from deltalake import DeltaTable

    return len(DeltaTable(str(table)).file_uris())


class CompactionCounter(logging.Handler):
    """Counts the auto-compactions the sink starts (its INFO line), whatever the log keeps:
    with a short ``delta.logRetentionDuration`` their commits are soon cleaned up."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += record.getMessage().startswith("auto-compaction of ")


def run_stream(spark, workdir: Path, args: argparse.Namespace, auto_compact: bool) -> None:  # type: ignore[no-untyped-def]
    from committers.delta import DeltaSink
    from committers.delta.write import AutoCompact
    from framework import TwoPhaseSink

    label = "with" if auto_compact else "without"
    table = workdir / f"table-{label}-auto-compaction"
    jvm = driver_jvm_pid()
    compactions = CompactionCounter()
    sink_log = logging.getLogger("committers.delta")
    sink_log.addHandler(compactions)
    sink_log.setLevel(logging.INFO)  # no handler prints INFO: the counter alone sees it
    commit_ms: list[float] = []
    upkeep_ms: list[float] = []
    rows: list[int] = []
    done = threading.Event()
    print(f"\n{label} auto-compaction (min_num_files={args.min_files}): {table}")
    print(
        "batches    commit p50 ms  p99 ms  upkeep p50 ms  max ms  live files  compactions"
        "  log KiB  commits  checkpoints  python MiB  jvm MiB"
    )

    def on_batch(metrics) -> None:  # type: ignore[no-untyped-def]
        commit_ms.append(metrics.commit_ms)
        upkeep_ms.append(metrics.upkeep_ms)
        rows.append(metrics.rows)
        count = len(commit_ms)
        if count % args.window == 0 or count == args.batches:
            window, upkeep = commit_ms[-args.window :], upkeep_ms[-args.window :]
            size, commits, checkpoints = log_figures(table)
            print(
                f"{max(1, count - args.window + 1):>4}-{count:<5} "
                f"{statistics.median(window):>12.1f}  {percentile(window, 0.99):>6.1f}"
                f"  {statistics.median(upkeep):>13.1f}  {max(upkeep):>6.0f}"
                f"  {live_files(table):>10}  {compactions.count:>11}  {size:>7.0f}"
                f"  {commits:>7}  {checkpoints:>11}  {rss_mib(os.getpid()):>10.0f}"
                f"  {rss_mib(jvm):>7.0f}",
                flush=True,
            )
        if count >= args.batches:
            done.set()

    stream = spark.readStream.format("rate").option("rowsPerSecond", 200).load()
    configuration = {"delta.logRetentionDuration": args.log_retention} if args.log_retention else {}
    delta_sink = DeltaSink(
        str(table),
        app_id=f"long-run-{label}",
        table_configuration=configuration,
        auto_compact=AutoCompact(enabled=auto_compact, min_num_files=args.min_files),
    )
    sink = TwoPhaseSink(delta_sink, on_batch=on_batch)
    started = time.monotonic()
    query = sink.write_stream(
        stream.selectExpr("value AS id", "timestamp AS ts"),
        checkpoint_location=str(workdir / f"checkpoint-{label}"),
        trigger={"processingTime": f"{args.trigger_ms} milliseconds"},
    )
    done.wait()
    query.stop()
    sink_log.removeHandler(compactions)
    elapsed = time.monotonic() - started
    print(
        f"{len(commit_ms)} batches, {sum(rows)} rows in {elapsed:.0f} s; "
        f"load average now {os.getloadavg()[0]:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("batches", type=int, nargs="?", default=1000)
    parser.add_argument("--trigger-ms", type=int, default=200)
    parser.add_argument(
        "--log-retention",
        default=None,
        help="delta.logRetentionDuration of the table, e.g. 'interval 1 minute' (default 30 days)",
    )
    parser.add_argument("--auto-compact", choices=("on", "off", "both"), default="both")
    parser.add_argument(
        "--min-files", type=int, default=50, help="AutoCompact(min_num_files=...) (default 50)"
    )
    parser.add_argument("--window", type=int, default=WINDOW, help="batches per printed line")
    args = parser.parse_args()

    print(f"machine: {machine()}; load average at start {os.getloadavg()[0]:.2f}")
    spark = spark_session("long-run")
    workdir = Path(tempfile.mkdtemp(prefix="long-run-"))
    settings = {"on": [True], "off": [False], "both": [True, False]}[args.auto_compact]
    for auto_compact in settings:
        run_stream(spark, workdir, args, auto_compact)
    spark.stop()


if __name__ == "__main__":
    main()
