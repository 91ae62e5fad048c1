"""CDC upserts: a change feed of inserts, updates and deletes applied to a Delta table by key,
exactly once, through a driver that is killed and restarted.

Run with `python examples/cdc_upsert.py`. What it shows:

1. A generated change feed (a seeded random one): each file is one micro-batch of changes to
   customers, each change carrying its key (`id`), a sequence (`ts`) and an operation (`op`:
   I, U or D). Files mix new customers, updates, deletes, deletes followed by a re-insert, two
   updates of one customer arriving out of order, deletes of customers that never existed, and
   late changes: an update or a delete stamped before the customer's stored version, arriving
   in a later file (it must change nothing). Deletes carry only the key, `ts` and `op`.
2. A streaming query applies them with
   `DeltaSink(uri, mode="upsert", keys=["id"], sequence_by="ts", delete_when="op = 'D'")`:
   every micro-batch is reduced to the newest change per key, each compared with the stored
   row's `ts`, and applied as ONE Delta transaction, rewriting only the files that hold the
   rows it changes.
3. Run 1 applies the first files. Run 2 runs as a process of its own and is SIGKILLed, driver,
   JVM and workers at once, after it staged the next batch and before its commit (the crash
   point `SPARKSINK_CRASH_AT=before_commit@<batch>`). Run 3 restarts from the same checkpoint:
   the batch is computed again and committed once, then the rest follows.
4. The table is read back with delta-rs (no Spark) and must equal, row for row, the state
   computed from the feed in plain Python with the same rules (the highest `ts` per key wins;
   on a tie, a change that is not a delete; it applies unless the stored row's `ts` is higher,
   or equal for a delete).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
OUT = Path(os.environ.get("DEMO_OUTPUT", REPO_ROOT / "demo-output")) / "cdc"
SEED = 7
FIRST_RUN_FILES, LATER_FILES = 2, 2  # run 1 applies the first files; run 2 dies on the next
CUSTOMERS_PER_FILE = 30
APP_ID = "customers-cdc"
CHANGE_SCHEMA = "id LONG, name STRING, tier STRING, ts LONG, op STRING"
COLUMNS = ["id", "name", "tier", "ts"]  # what the table holds: op is what delete_when reads
TS = COLUMNS.index("ts")


def change_feed(files: int, seed: int = SEED) -> list[list[dict[str, Any]]]:
    """``files`` batches of changes (dicts of ``CHANGE_SCHEMA``), deterministic for a seed."""
    rng = random.Random(seed)
    live: list[int] = []
    stamped: dict[int, int] = {}  # each live customer's newest ts, as of the files before
    next_id, ts = 1, 0
    feed: list[list[dict[str, Any]]] = []

    def change(key: int, op: str, name: str | None = None, at: int | None = None) -> None:
        nonlocal ts
        ts += 1
        tier = None if op == "D" else rng.choice(["bronze", "silver", "gold"])
        stamp = ts if at is None else at
        feed[-1].append({"id": key, "name": name, "tier": tier, "ts": stamp, "op": op})

    for _ in range(files):
        feed.append([])
        for key in rng.sample(live, min(len(live), CUSTOMERS_PER_FILE // 3)):
            roll = rng.random()
            if roll < 0.4:  # an update (which may move the row to another tier)
                change(key, "U", f"customer-{key}-v{ts}")
            elif roll < 0.55:  # two updates in one batch: the higher ts wins, wherever it is
                change(key, "U", f"customer-{key}-older")
                change(key, "U", f"customer-{key}-newer")
            elif roll < 0.65:  # late: stamped before the stored version, it changes nothing
                change(key, "U", f"customer-{key}-late", at=stamped[key] - 1)
            elif roll < 0.7:  # a late delete: the same
                change(key, "D", at=stamped[key] - 1)
            elif roll < 0.9:
                change(key, "D")
                live.remove(key)
            else:  # deleted, then inserted again
                change(key, "D")
                change(key, "I", f"customer-{key}-again")
        for _ in range(CUSTOMERS_PER_FILE // 2):  # new customers
            change(next_id, "I", f"customer-{next_id}")
            live.append(next_id)
            next_id += 1
        change(1_000_000 + ts, "D")  # a customer that never existed
        for c in feed[-1]:
            stamped[c["id"]] = max(stamped.get(c["id"], 0), c["ts"])
        rng.shuffle(feed[-1])  # a file's order is not the order of its changes
    return feed


def expected_state(feed: list[list[dict[str, Any]]]) -> list[tuple[Any, ...]]:
    """The table the feed should leave, computed in plain Python with the sink's rules."""
    state: dict[int, tuple[Any, ...]] = {}
    for batch in feed:
        latest: dict[int, dict[str, Any]] = {}
        for c in batch:
            held = latest.get(c["id"])
            if held is None or (c["ts"], c["op"] != "D") > (held["ts"], held["op"] != "D"):
                latest[c["id"]] = c
        for key, c in latest.items():
            stored = state.get(key)  # ranks as a change that is not a delete, at its ts
            if stored is not None and (stored[TS], True) > (c["ts"], c["op"] != "D"):
                continue  # stale: the stored row is newer (and a delete loses a tie to it)
            if c["op"] == "D":
                state.pop(key, None)
            else:
                state[key] = tuple(c[name] for name in COLUMNS)
    return sorted(state.values())


def write_feed_file(directory: Path, index: int, changes: list[dict[str, Any]]) -> None:
    """One change file, JSON lines, written atomically; its modification time orders it after
    the earlier ones (Spark's file source takes files in that order)."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".changes-{index:03d}.tmp"
    tmp.write_text("".join(json.dumps(c) + "\n" for c in changes))
    first = min((p.stat().st_mtime for p in directory.glob("*.json")), default=None)
    moment = tmp.stat().st_mtime if first is None else first + index
    os.utime(tmp, (moment, moment))
    tmp.rename(directory / f"changes-{index:03d}.json")


def spark_session():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("cdc-upsert")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_query(spark, source: Path, table: str, checkpoint: Path) -> list[tuple[int, str]]:
    """Apply every change file available now, then stop; returns (batch id, status) pairs."""
    from committers.delta import DeltaSink
    from framework import TwoPhaseSink

    changes = (
        spark.readStream.schema(CHANGE_SCHEMA).option("maxFilesPerTrigger", 1).json(str(source))
    )
    sink = TwoPhaseSink(
        DeltaSink(
            table,
            app_id=APP_ID,
            mode="upsert",
            keys=["id"],
            sequence_by="ts",
            delete_when="op = 'D'",
            partition_by=["tier"],
        )
    )
    query = sink.write_stream(
        changes, checkpoint_location=str(checkpoint), trigger={"availableNow": True}
    )
    query.awaitTermination()
    return [(b.batch_id, b.status) for b in sink.batches]


def run_killed(source: Path, table: str, checkpoint: Path, batch: int) -> int:
    """Run the query as a process of its own, SIGKILLed before the commit of ``batch``;
    returns its exit code (``-SIGKILL`` when the crash point was reached)."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    command = [sys.executable, str(Path(__file__).resolve()), "--driver"]
    result = subprocess.run(
        [*command, str(source), table, str(checkpoint)],
        env={**os.environ, "PYTHONPATH": path, "SPARKSINK_CRASH_AT": f"before_commit@{batch}"},
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,  # the kill takes its whole process group, and only that
    )
    if result.returncode != -signal.SIGKILL:
        sys.stderr.write(result.stderr[-4000:])
    return result.returncode


@dataclass
class Outcome:
    """What the example did and found."""

    runs: list[list[tuple[int, str]]] = field(default_factory=list)
    killed_exit_code: int | None = None
    expected: list[tuple[Any, ...]] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    txn_version: int | None = None

    @property
    def exact(self) -> bool:
        return self.rows == self.expected


def run(spark, workdir: Path) -> Outcome:
    """Runs 1 to 3 (see the module docstring) in ``workdir``; reads the table back."""
    from deltalake import DeltaTable

    source, table, checkpoint = workdir / "changes", str(workdir / "customers"), workdir / "chk"
    feed = change_feed(FIRST_RUN_FILES + LATER_FILES)
    outcome = Outcome(expected=expected_state(feed))
    for index in range(FIRST_RUN_FILES):
        write_feed_file(source, index, feed[index])
    print(f"\n== run 1: {FIRST_RUN_FILES} change files into {table} (one file per batch)")
    outcome.runs.append(run_query(spark, source, table, checkpoint))
    for index in range(FIRST_RUN_FILES, len(feed)):
        write_feed_file(source, index, feed[index])
    print(f"== run 2: its own process, killed after staging batch {FIRST_RUN_FILES}")
    outcome.killed_exit_code = run_killed(source, table, checkpoint, FIRST_RUN_FILES)
    print("== run 3: restarted from the same checkpoint")
    outcome.runs.append(run_query(spark, source, table, checkpoint))
    delta = DeltaTable(table)
    data = delta.to_pyarrow_table(columns=COLUMNS).to_pylist()
    outcome.rows = sorted(tuple(r[name] for name in COLUMNS) for r in data)
    outcome.txn_version = delta.transaction_version(APP_ID)
    return outcome


def report(outcome: Outcome) -> bool:
    for number, batches in zip((1, 3), outcome.runs, strict=True):
        print(f"   run {number}: " + ", ".join(f"batch {b} {status}" for b, status in batches))
    killed = outcome.killed_exit_code == -signal.SIGKILL
    print(f"   run 2: {'killed before its commit' if killed else outcome.killed_exit_code}")
    print("\n== result (read back with delta-rs)")
    print(f"   rows expected from the feed: {len(outcome.expected)}")
    print(f"   rows in the table:           {len(outcome.rows)}")
    print(f"   txn({APP_ID}):        {outcome.txn_version}")
    ok = outcome.exact and killed
    print("\nOK: the table is exactly the feed's final state" if ok else "\nFAILED")
    return ok


def main() -> int:
    if sys.argv[1:2] == ["--driver"]:  # run 2: the process that is killed
        source, table, checkpoint = sys.argv[2:5]
        spark = spark_session()
        run_query(spark, Path(source), table, Path(checkpoint))
        spark.stop()
        return 0
    shutil.rmtree(OUT, ignore_errors=True)
    spark = spark_session()
    try:
        outcome = run(spark, OUT)
    finally:
        spark.stop()
    return 0 if report(outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
