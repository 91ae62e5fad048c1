"""Upserts: ``DeltaSink(mode="upsert")`` (Spark computes the changes and writes the new rows,
Python tasks rewrite the files holding the keys, one delta-rs commit) against delta-rs's own
``DeltaTable.merge(...)``, side by side, on copies of the same table and the same changes.

The table: N rows (id, k, s, ts of ``_common.rows_df``), ids 0..N-1 sorted into FILES files by
range, written once by the sink itself. The changes: CHANGES rows, 80% updates of existing ids
drawn from 5% of the files (new k, s and ts), 20% inserts of new ids. Both sides apply them as
"update the row with the same id, insert the others":

* ours: ``TwoPhaseSink(DeltaSink(copy, mode="upsert", keys=["id"])).write(changes_df)``;
* delta-rs: ``DeltaTable(copy).merge(changes, predicate="t.id = s.id", ...)
  .when_matched_update_all().when_not_matched_insert_all().execute()``.

Two more sides, not in the ratio: ours with ``staging="spark"`` (Spark's reader and writer
rewrite the touched files too), and the floor of an all-Spark copy-on-write: one job that
shuffles the changes by id and writes them, together with every row of the files the upsert
rewrites, with Spark's own Parquet writer (no dedupe, no join, no commit).

Each repeat copies the pristine table for each side and runs them one after the other, ours
and delta-rs alternating which goes first; the upserted copies must then hold the same rows
(count, sums of id and k, and the changed rows themselves). Medians after a warm-up round.
The ratio printed is delta-rs time / our time (above 1.0: ours is faster). A loaded machine
flatters the side with more threads, so the ratio is only printed when the 1-minute load
average is at most 0.5 when the script starts, unless ``--force``.

Usage: python benchmarks/upsert.py [N] [FILES] [CHANGES] [REPEATS] [--force]
(defaults: 10,000,000 rows, 200 files, 100,000 changes, 3 repeats)
"""

from __future__ import annotations

import bisect
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa
import pyarrow.compute as pc
from _common import median, print_sides, quiet_enough, rows_df, spark_session
from deltalake import DeltaTable

from committers.delta import DeltaSink
from framework import TwoPhaseSink

UPDATE_SHARE, UPDATED_FILES_SHARE = 0.8, 0.05
SEED = 11


def changes_table(rows: int, files: int, changes: int) -> pa.Table:
    """The changes, as Arrow (same columns and types as the table)."""
    rng = random.Random(SEED)
    per_file = rows // files
    updates = int(changes * UPDATE_SHARE)
    chosen = rng.sample(range(files), max(1, int(files * UPDATED_FILES_SHARE)))
    pool = [f * per_file + i for f in chosen for i in range(per_file)]
    ids = rng.sample(pool, min(updates, len(pool)))
    ids += range(rows, rows + changes - len(ids))  # inserts
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "k": pa.array([rng.randrange(1000) for _ in ids], pa.int32()),
            "s": pa.array([f"changed-{rng.randrange(10**6)}" for _ in ids], pa.string()),
            "ts": pa.array([1_800_000_000_000_000] * len(ids), pa.timestamp("us", "UTC")),
        }
    )


def fingerprint(uri: str, changed: pa.Array) -> tuple[int, int, int, list[tuple]]:
    """(rows, sum of id, sum of k, the changed rows sorted) of the table at ``uri``."""
    dataset = DeltaTable(uri).to_pyarrow_dataset()
    data = dataset.to_table(columns=["id", "k"])
    rows = dataset.to_table(columns=["id", "k", "s"], filter=pc.field("id").isin(changed))
    return (
        data.num_rows,
        pc.sum(data.column("id")).as_py(),
        pc.sum(data.column("k")).as_py(),
        sorted(zip(*[rows.column(c).to_pylist() for c in ("id", "k", "s")], strict=True)),
    )


def holding(uri: str, ids: pa.Array) -> list[str]:
    """The data files of the table at ``uri`` whose id range holds one of ``ids``."""
    actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True))
    wanted = sorted(ids.to_pylist())
    found = []
    for path, lo, hi in zip(
        actions.column("path").to_pylist(),
        actions.column("min.id").to_pylist(),
        actions.column("max.id").to_pylist(),
        strict=True,
    ):
        at = bisect.bisect_left(wanted, lo)
        if at < len(wanted) and wanted[at] <= hi:
            found.append(str(Path(uri) / path))
    return found


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    force = "--force" in sys.argv
    rows = int(args[0]) if args else 10_000_000
    files = int(args[1]) if len(args) > 1 else 200
    changes = int(args[2]) if len(args) > 2 else 100_000
    repeats = int(args[3]) if len(args) > 3 else 3
    load_before = os.getloadavg()[0]
    spark = spark_session("upsert-benchmark")
    from pyspark.sql import functions as F

    work = Path(tempfile.mkdtemp(prefix="sink-upsert-bench-"))
    try:
        pristine = str(work / "pristine")
        table_df = rows_df(spark, rows).repartitionByRange(files, F.col("id"))
        TwoPhaseSink(DeltaSink(pristine, app_id="bench", staging="spark")).write(table_df)
        live = len(DeltaTable(pristine).file_uris())
        size = sum(p.stat().st_size for p in Path(pristine).rglob("*.parquet"))
        print(f"table: {rows} rows, {live} files, {size} bytes")
        data = changes_table(rows, files, changes)
        updates = int(changes * UPDATE_SHARE)
        print(
            f"changes: {data.num_rows} ({updates} updates in {UPDATED_FILES_SHARE:.0%} of the "
            f"files, {data.num_rows - updates} inserts)"
        )
        changes_df = spark.createDataFrame(data).cache()
        changes_df.count()

        def ours(uri: str, staging: str = "auto") -> int:
            sink = DeltaSink(uri, app_id="upsert", mode="upsert", keys=["id"], staging=staging)
            TwoPhaseSink(sink).write(changes_df)
            info = DeltaTable(uri).history(1)[0]
            return int(info["operationMetrics"]["numRemovedFiles"])

        def ours_all_spark(uri: str) -> int:
            return ours(uri, staging="spark")

        def delta_rs(uri: str) -> int:
            metrics = (
                DeltaTable(uri)
                .merge(source=data, predicate="t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_update_all()
                .when_not_matched_insert_all()
                .execute()
            )
            return int(metrics["num_target_files_removed"])

        def spark_floor(uri: str) -> int:
            rewritten = holding(uri, data.column("id"))
            kept = spark.read.parquet(*rewritten)
            shuffled = changes_df.repartition(spark.sparkContext.defaultParallelism, "id")
            kept.unionByName(shuffled).write.parquet(str(Path(uri) / "floor"))
            return len(rewritten)

        sides = {
            "ours (DeltaSink upsert)": ours,
            "delta-rs merge": delta_rs,
            "ours, staging='spark'": ours_all_spark,
            "floor: Spark rewrite": spark_floor,
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        removed: dict[str, int] = {}
        changed = data.column("id")
        for round_number in range(repeats + 1):  # round 0 is the warm-up
            order = [("ours (DeltaSink upsert)", ours), ("delta-rs merge", delta_rs)]
            if round_number % 2:
                order.reverse()
            order.append(("ours, staging='spark'", ours_all_spark))
            order.append(("floor: Spark rewrite", spark_floor))  # last: it is not compared
            prints = []
            for name, run in order:
                copy = str(work / f"copy-{round_number}-{name.split()[0]}")
                shutil.copytree(pristine, copy)
                start = time.perf_counter()
                removed[name] = run(copy)
                elapsed = time.perf_counter() - start
                if not name.startswith("floor"):
                    prints.append(fingerprint(copy, changed))
                if round_number:
                    times[name].append(elapsed)
                shutil.rmtree(copy)
            if len(set(map(repr, prints))) != 1:  # (the floor's copy is not an upsert)
                raise SystemExit(f"the sides left different tables in round {round_number}")

        notes = {name: str(n) for name, n in removed.items()}
        print_sides(times, notes, "files rewritten", load_before)
        if not quiet_enough(load_before, force):
            return 0
        ratio = median(times["delta-rs merge"]) / median(times["ours (DeltaSink upsert)"])
        print(f"\nratio delta-rs time / our time: {ratio:.2f}")
        floor = median(times["delta-rs merge"]) / median(times["floor: Spark rewrite"])
        print(f"ratio delta-rs time / floor time: {floor:.2f} (no Spark copy-on-write can beat)")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())
