"""Delta to Delta, exactly once, with no JVM Delta jars: a streaming job reads one table through
the "deltalake" source, transforms it and writes another through the "deltalake" sink, and
survives being killed.

Run with `python examples/delta_to_delta.py`. What it shows:

1. An `orders` table made by delta-rs (not by this project): partitioned by day, a few appends.
2. A streaming query, all in Spark's Python Data Source API:
       spark.readStream.format("deltalake").option("maxFilesPerTrigger", 2).load(orders)
         .where("status <> 'cancelled'").withColumn("amount_cents", ...)
         .writeStream.format("deltalake").option("checkpointLocation", ...).start(paid)
   The source's offsets are (table version, file index); each micro-batch is one Delta commit
   of `paid` carrying txn(query id, batch id).
3. Run 1 runs as a process of its own and is SIGKILLed, driver, JVM and Python workers at
   once, right after Spark wrote the offsets of its first batch to the checkpoint, before
   anything is committed (`SPARKSINK_CRASH_AT=offsets_written`). More orders arrive, and the
   source table is compacted by delta-rs (a commit that only rewrites files: nothing new to
   read). Run 2, again a process of its own, replays the first batch (it must read the files
   that batch's offsets name, not the table's newer snapshot), goes on and is SIGKILLed after
   it staged a later batch and before its commit (`SPARKSINK_CRASH_AT=before_commit@<batch>`).
   Run 3 restarts from the same checkpoint and finishes.
4. `paid` is read back with delta-rs and DuckDB and must hold exactly the expected rows, each
   once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _orders import spark_session  # noqa: E402  (the examples' shared session settings)

OUT = Path(os.environ.get("DEMO_OUTPUT", REPO_ROOT / "demo-output")) / "delta_to_delta"
ORDERS_PER_APPEND = 40
FIRST_APPENDS, LATER_APPENDS = 2, 2
KILLED_BATCH = 2  # run 2 commits batches 0 (the replay) and 1 (two files per batch)
COLUMNS = ["order_id", "day", "amount_cents"]


def orders(append: int) -> list[dict[str, Any]]:
    """The orders of one append: every fifth one cancelled, amounts with cents."""
    first = append * ORDERS_PER_APPEND
    return [
        {
            "order_id": i,
            "day": f"2026-11-{21 + i % 2}",
            "amount": round(i * 1.37 % 300, 2),
            "status": "cancelled" if i % 5 == 0 else "paid",
        }
        for i in range(first, first + ORDERS_PER_APPEND)
    ]


def expected_rows(appends: int) -> list[tuple[Any, ...]]:
    """What `paid` must hold after the source got ``appends`` appends, in plain Python."""
    return sorted(
        (o["order_id"], o["day"], round(o["amount"] * 100))
        for a in range(appends)
        for o in orders(a)
        if o["status"] != "cancelled"
    )


def append_orders(table: str, append: int) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(
        table, pa.Table.from_pylist(orders(append)), partition_by=["day"], mode="append"
    )


def run_query(spark, source: str, target: str, checkpoint: Path) -> None:
    """Copy every order available now, then stop."""
    from pyspark.sql import functions as F

    from committers.delta import register

    register(spark)
    paid = (
        spark.readStream.format("deltalake")
        .option("maxFilesPerTrigger", 2)
        .load(source)
        .where("status <> 'cancelled'")
        .select(
            "order_id", "day", F.round(F.col("amount") * 100).cast("long").alias("amount_cents")
        )
    )
    query = (
        paid.writeStream.format("deltalake")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(target)
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise query.exception()


def run_killed(source: str, target: str, checkpoint: Path, crash_at: str) -> int:
    """Run the query as a process of its own, SIGKILLed at the crash point ``crash_at``
    (``step`` or ``step@batch``); returns its exit code (``-SIGKILL`` when it was reached)."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--driver",
            source,
            target,
            str(checkpoint),
        ],
        env={**os.environ, "PYTHONPATH": path, "SPARKSINK_CRASH_AT": crash_at},
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

    killed_exit_codes: list[int] = field(default_factory=list)  # of runs 1 and 2
    expected: list[tuple[Any, ...]] = field(default_factory=list)
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    duckdb_rows: list[tuple[Any, ...]] = field(default_factory=list)
    txn_version: int | None = None  # the newest batch id `paid` records for the query

    @property
    def exact(self) -> bool:
        return self.rows == self.expected == self.duckdb_rows


def _duckdb_rows(table: str) -> list[tuple[Any, ...]]:
    import glob

    import duckdb
    import duckdb_extension_delta

    base = os.path.dirname(duckdb_extension_delta.__file__)
    (extension,) = glob.glob(f"{base}/extensions/*/delta.duckdb_extension")
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        con.execute(f"LOAD '{extension}'")
        query = f"SELECT {', '.join(COLUMNS)} FROM delta_scan(?)"
        return sorted(tuple(r) for r in con.execute(query, [table]).fetchall())
    finally:
        con.close()


def run(spark, workdir: Path) -> Outcome:
    """Runs 1 to 3 (see the module docstring) in ``workdir``; reads the target back."""
    from deltalake import DeltaTable

    source, target = str(workdir / "orders"), str(workdir / "paid")
    checkpoint = workdir / "checkpoint"
    appends = FIRST_APPENDS + LATER_APPENDS
    outcome = Outcome(expected=expected_rows(appends))
    for append in range(FIRST_APPENDS):
        append_orders(source, append)
    print(f"\n== run 1: copy {source} into {target}, killed once offsets/0 is written")
    outcome.killed_exit_codes.append(run_killed(source, target, checkpoint, "offsets_written"))
    for append in range(FIRST_APPENDS, appends):
        append_orders(source, append)
    DeltaTable(source).optimize.compact()  # rewrites files only: the stream reads nothing new
    print(f"== run 2: its own process, killed before the commit of batch {KILLED_BATCH}")
    outcome.killed_exit_codes.append(
        run_killed(source, target, checkpoint, f"before_commit@{KILLED_BATCH}")
    )
    print("== run 3: restarted from the same checkpoint")
    run_query(spark, source, target, checkpoint)
    table = DeltaTable(target)
    outcome.rows = sorted(
        tuple(r[c] for c in COLUMNS) for r in table.to_pyarrow_table(columns=COLUMNS).to_pylist()
    )
    outcome.duckdb_rows = _duckdb_rows(target)
    # The sink's app id is the query id Spark keeps in the checkpoint.
    query_id = json.loads((checkpoint / "metadata").read_text().splitlines()[0])["id"]
    outcome.txn_version = table.transaction_version(query_id)
    return outcome


def report(outcome: Outcome) -> bool:
    killed = outcome.killed_exit_codes == [-signal.SIGKILL] * 2
    planned = ("once offsets/0 was written", "before its commit")
    for run, (code, where) in enumerate(zip(outcome.killed_exit_codes, planned, strict=False), 1):
        print(f"   run {run}: {f'killed {where}' if code == -signal.SIGKILL else code}")
    print("\n== result (read back with delta-rs and DuckDB)")
    print(f"   rows expected:        {len(outcome.expected)}")
    print(f"   rows (delta-rs):      {len(outcome.rows)}")
    print(f"   rows (DuckDB):        {len(outcome.duckdb_rows)}")
    print(f"   newest batch id:      {outcome.txn_version}")
    ok = outcome.exact and killed
    print("\nOK: every paid order exactly once" if ok else "\nFAILED")
    return ok


def main() -> int:
    if sys.argv[1:2] == ["--driver"]:  # runs 1 and 2: the processes that are killed
        from framework.connector import crash_with_workers

        crash_with_workers()  # a crash point reached in a Python worker kills us all
        source, target, checkpoint = sys.argv[2:5]
        spark = spark_session("delta-to-delta")
        run_query(spark, source, target, Path(checkpoint))
        spark.stop()
        return 0
    shutil.rmtree(OUT, ignore_errors=True)
    spark = spark_session("delta-to-delta")
    try:
        outcome = run(spark, OUT)
    finally:
        spark.stop()
    return 0 if report(outcome) else 1


if __name__ == "__main__":
    sys.exit(main())
