"""The sink against delta-spark (Delta's reference writer on the JVM), side by side in one
SparkSession (delta-spark's extensions on, its jars from `make jars`), on the same data.

Scenarios (each its own sub-command; ``all`` runs them in turn):

* ``append``: a bounded append of ROWS rows (default 3,000,000; ``_common.rows_df``):
  ``TwoPhaseSink(DeltaSink(t)).write(df)`` vs ``df.write.format("delta").mode("append")``.
* ``stream``: the same file source (BATCHES Parquet files of ROWS/BATCHES rows, one per
  micro-batch, ``availableNow``) into our ``write_stream`` vs delta-spark's streaming sink:
  the whole run (throughput) and the median ``triggerExecution`` of a micro-batch (latency).
* ``upsert``: CHANGES (default 100,000) changes, 80 % updates of ids in 5 % of the files and
  20 % inserts, into tables of each of SIZES rows (default 1M,10M,30M; ``--sizes``):
  ``DeltaSink(mode="upsert", keys=["id"])`` vs ``MERGE INTO ... UPDATE SET * / INSERT *``
  with deletion vectors off and on: ours copy-on-write on the copy without them, and
  merge-on-read on the copy with them (``delta.enableDeletionVectors``: the replaced rows
  marked in vectors, as delta-spark's ``MERGE`` there). Every side must end with the same
  rows (count, sums of id and k).
* ``compact``: FILES small files (default 200) of ROWS rows in all: ``DeltaSink.compact``
  (Python tasks, and ``staging="spark"``) vs ``OPTIMIZE``.
* ``scan``: a full scan of ROWS rows (noop sink): ``read_table`` and
  ``format("deltalake")`` vs ``spark.read.format("delta")``.
* ``scan_dv``: the same after delta-spark's ``DELETE`` of a tenth of the rows (``id % 10 =
  3``: every file) left deletion vectors.
* ``s3``: the append of ROWS rows into a table on the test suite's S3 server: ours with
  Spark's writer through ``s3a://``, ours with the Python writers (``staging="arrow"``), and
  delta-spark through ``s3a://``. delta-spark on S3 commits through its single-driver log
  store (``S3SingleDriverLogStore``): two drivers writing one table at once can lose commits;
  our commits are conditional PUTs (``If-None-Match``) from any number of drivers.

Each side runs a warm-up, then REPEATS times into fresh copies, alternating the order of the
sides. Printed: medians and runs per side, then the ratios delta-spark time / our time (above
1.0: ours is faster). A loaded machine flattens the ratio towards the side with more threads:
ratios are printed only when the 1-minute load average is at most 0.5 when the scenario starts
(``--force`` prints them anyway, marked); otherwise a warning says so and nothing is to be
recorded.

Usage: python benchmarks/vs_delta_spark.py SCENARIO [--rows N] [--repeats N] [--sizes A,B,C]
       [--changes N] [--files N] [--batches N] [--force]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import (
    QUIET_LOAD,
    median,
    print_sides,
    quiet_enough,
    rows_df,
    spark_session,
    wait_for_quiet,
)

from committers.delta import DeltaSink, read_table, register
from committers.tests._jars import DELTA_SPARK_CONFIGS, fetched_jars, local_jar_configs
from framework import TwoPhaseSink

Side = Callable[[str], object]  # one run into the given fresh location


def delta_spark_session(app_name: str):  # type: ignore[no-untyped-def]
    """The benchmarks' local[2] session with delta-spark (and hadoop-aws) beside the sink."""
    jars, missing = fetched_jars()
    if missing:
        raise SystemExit(f"delta-spark is not available: {missing}")
    extra = {**local_jar_configs(jars), **DELTA_SPARK_CONFIGS}
    return spark_session(app_name, extra)


def race(
    sides: dict[str, Side], fresh: Callable[[str, int], str], repeats: int
) -> dict[str, list[float]]:
    """Each side's run times (warm-up dropped); ``fresh(side, run)`` gives its location."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for run in range(repeats + 1):
        order = list(sides.items())
        if run % 2:
            order.reverse()
        for name, side in order:
            target = fresh(name, run)
            start = time.perf_counter()
            side(target)
            elapsed = time.perf_counter() - start
            if run:
                times[name].append(elapsed)
    return times


def report(
    title: str,
    times: dict[str, list[float]],
    ratios: list[tuple[str, str]],
    load_before: float,
    force: bool,
) -> None:
    """Medians and runs, then ``theirs / ours`` for each pair, if the machine was quiet."""
    print(f"\n== {title}")
    print_sides(times, None, "", load_before)
    if not quiet_enough(load_before, force):
        print("WARNING: these times are not to be recorded.")
        return
    marked = " (forced on a loaded machine: do not record)" if load_before >= QUIET_LOAD else ""
    for theirs, ours in ratios:
        ratio = median(times[theirs]) / median(times[ours])
        print(f"ratio {theirs} / {ours}: {ratio:.2f}{marked}")


class Bench:
    def __init__(self, args: argparse.Namespace, spark, work: Path) -> None:  # type: ignore[no-untyped-def]
        self.args, self.spark, self.work = args, spark, work

    def fresh(self, side: str, run: int) -> str:
        return str(self.work / f"{side.split()[0]}-{run}-{uuid.uuid4().hex[:6]}")

    def copies_of(
        self, pristine: str, prepare: dict[str, Callable[[str], object]] | None = None
    ) -> Callable[[str, int], str]:
        """Fresh copies of ``pristine``, each first prepared (untimed) by ``prepare[side]``."""

        def fresh(side: str, run: int) -> str:
            target = self.fresh(side, run)
            shutil.copytree(pristine, target)
            if prepare and side in prepare:
                prepare[side](target)
            return target

        return fresh

    def append(self) -> None:
        load = wait_for_quiet()
        df = rows_df(self.spark, self.args.rows).cache()
        df.count()
        sides: dict[str, Side] = {
            "ours (DeltaSink.write)": lambda t: TwoPhaseSink(DeltaSink(t)).write(df),
            "delta-spark (format delta)": lambda t: df.write.format("delta").mode("append").save(t),
        }
        times = race(sides, self.fresh, self.args.repeats)
        df.unpersist()
        pairs = [("delta-spark (format delta)", "ours (DeltaSink.write)")]
        report(f"bounded append, {self.args.rows} rows", times, pairs, load, self.args.force)

    def stream(self) -> None:
        load = wait_for_quiet()
        source = str(self.work / "stream-source")
        per_batch = max(1, self.args.rows // self.args.batches)
        for _ in range(self.args.batches):
            rows = rows_df(self.spark, per_batch).coalesce(1)
            rows.write.mode("append").parquet(source)
        schema = self.spark.read.parquet(source).schema
        latencies: dict[str, list[float]] = {}

        def stream():  # type: ignore[no-untyped-def]
            return (
                self.spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(source)
            )

        def finish(name: str, query) -> None:  # type: ignore[no-untyped-def]
            query.awaitTermination()
            batches = [p.durationMs["triggerExecution"] / 1000 for p in query.recentProgress]
            latencies.setdefault(name, []).append(median(batches))

        def ours(target: str) -> None:
            sink = TwoPhaseSink(DeltaSink(target, app_id="bench-stream"))
            query = sink.write_stream(
                stream(), checkpoint_location=target + "-chk", trigger={"availableNow": True}
            )
            finish("ours (write_stream)", query)

        def theirs(target: str) -> None:
            query = (
                stream()
                .writeStream.format("delta")
                .option("checkpointLocation", target + "-chk")
                .trigger(availableNow=True)
                .start(target)
            )
            finish("delta-spark (writeStream delta)", query)

        sides = {"ours (write_stream)": ours, "delta-spark (writeStream delta)": theirs}
        times = race(sides, self.fresh, self.args.repeats)
        title = f"streaming, {self.args.batches} micro-batches of {per_batch} rows (availableNow)"
        pairs = [("delta-spark (writeStream delta)", "ours (write_stream)")]
        report(title + ": whole run", times, pairs, load, self.args.force)
        batch_times = {name: values[1:] for name, values in latencies.items()}  # no warm-up
        report(title + ": median micro-batch", batch_times, pairs, load, self.args.force)

    def upsert(self) -> None:
        for size in self.args.sizes:
            self._upsert_into(size)

    def _upsert_into(self, size: int) -> None:
        from upsert import changes_table

        load = wait_for_quiet()
        files = max(2, size // 50_000)
        pristine = str(self.work / f"pristine-{size}")
        TwoPhaseSink(DeltaSink(pristine, app_id="bench", staging="spark")).write(
            rows_df(self.spark, size).repartitionByRange(files, "id")
        )
        changes = self.spark.createDataFrame(
            changes_table(size, files, min(self.args.changes, size))
        ).cache()
        changes.count()
        changes.createOrReplaceTempView("bench_changes")

        def ours(target: str) -> None:
            sink = DeltaSink(target, app_id="bench-upsert", mode="upsert", keys=["id"])
            TwoPhaseSink(sink).write(changes)

        def merge(target: str) -> None:
            self.spark.sql(
                f"MERGE INTO delta.`{target}` t USING bench_changes s ON t.id = s.id "
                "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
            )

        def deletion_vectors(on: bool) -> Callable[[str], object]:
            return lambda target: self.spark.sql(
                f"ALTER TABLE delta.`{target}` SET TBLPROPERTIES "
                f"('delta.enableDeletionVectors' = '{str(on).lower()}')"
            )

        results: dict[str, tuple] = {}
        sides = {
            "ours (upsert)": self._checked(results, ours),
            "ours (upsert, DV on: merge-on-read)": self._checked(results, ours),
            "delta-spark MERGE, DV off": self._checked(results, merge),
            "delta-spark MERGE, DV on": self._checked(results, merge),
        }
        prepare = {
            "ours (upsert, DV on: merge-on-read)": deletion_vectors(True),
            "delta-spark MERGE, DV off": deletion_vectors(False),
            "delta-spark MERGE, DV on": deletion_vectors(True),
        }
        times = race(sides, self.copies_of(pristine, prepare), self.args.repeats)
        self._check_same(results, "upserted")
        changes.unpersist()
        pairs = [
            ("delta-spark MERGE, DV off", "ours (upsert)"),
            ("delta-spark MERGE, DV on", "ours (upsert, DV on: merge-on-read)"),
            ("ours (upsert)", "ours (upsert, DV on: merge-on-read)"),
        ]
        title = f"upsert of {self.args.changes} changes into {size} rows ({files} files)"
        report(title, times, pairs, load, self.args.force)

    def _checked(self, results: dict[str, tuple], side: Side) -> Side:
        """``side``, then the fingerprint of the table it left into ``results``."""

        def run(target: str) -> None:
            side(target)
            results[target] = self._fingerprint(target)

        return run

    @staticmethod
    def _check_same(results: dict[str, tuple], what: str) -> None:
        if len(set(results.values())) != 1:
            raise SystemExit(f"the {what} tables differ: {results}")

    def _fingerprint(self, target: str) -> tuple:
        row = (
            self.spark.read.format("delta")
            .load(target)
            .selectExpr("count(*)", "sum(id)", "sum(k)", "sum(hash(s))")
            .first()
        )
        return tuple(row)

    def compact(self) -> None:
        load = wait_for_quiet()
        pristine = str(self.work / "small-files")
        df = rows_df(self.spark, self.args.rows).repartition(self.args.files)
        TwoPhaseSink(DeltaSink(pristine, app_id="bench", staging="spark")).write(df)
        results: dict[str, tuple] = {}
        sides = {
            "ours (compact, Python tasks)": self._checked(
                results, lambda t: DeltaSink(t).compact(self.spark)
            ),
            "ours (compact, staging=spark)": self._checked(
                results, lambda t: DeltaSink(t, staging="spark").compact(self.spark)
            ),
            "delta-spark OPTIMIZE": self._checked(
                results, lambda t: self.spark.sql(f"OPTIMIZE delta.`{t}`").collect()
            ),
        }
        times = race(sides, self.copies_of(pristine), self.args.repeats)
        self._check_same(results, "compacted")
        pairs = [
            ("delta-spark OPTIMIZE", "ours (compact, Python tasks)"),
            ("delta-spark OPTIMIZE", "ours (compact, staging=spark)"),
        ]
        title = f"compaction of {self.args.files} files, {self.args.rows} rows"
        report(title, times, pairs, load, self.args.force)

    def scan(self) -> None:
        self._scan(deleted=False)

    def scan_dv(self) -> None:
        self._scan(deleted=True)

    def _scan(self, *, deleted: bool) -> None:
        load = wait_for_quiet()
        table = str(self.work / "scan")
        TwoPhaseSink(DeltaSink(table, app_id="bench", staging="spark")).write(
            rows_df(self.spark, self.args.rows).repartitionByRange(max(1, self.args.files), "id")
        )
        what = f"full scan of {self.args.rows} rows"
        if deleted:  # a tenth of the rows, spread over every file, deleted by vectors
            self.spark.sql(
                f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES "
                "('delta.enableDeletionVectors' = 'true')"
            )
            self.spark.sql(f"DELETE FROM delta.`{table}` WHERE id % 10 = 3")
            what += ", a tenth deleted by deletion vectors"
        register(self.spark)
        readers = {
            "ours (read_table)": lambda: read_table(self.spark, table),
            "ours (format deltalake)": lambda: self.spark.read.format("deltalake").load(table),
            "delta-spark (format delta)": lambda: self.spark.read.format("delta").load(table),
        }
        counts = {name: make().count() for name, make in readers.items()}
        if len(set(counts.values())) != 1:
            raise SystemExit(f"the readers disagree: {counts}")

        # delta-spark refuses the noop sink over a table with vectors ("non-pinned table
        # snapshot"): there, every side folds all its columns into one hash instead.
        def consume(df) -> None:  # type: ignore[no-untyped-def]
            if deleted:
                df.selectExpr("sum(hash(*))").collect()
            else:
                df.write.format("noop").mode("overwrite").save()

        sides: dict[str, Side] = {
            name: (lambda _t, make=make: consume(make())) for name, make in readers.items()
        }
        times = race(sides, self.fresh, self.args.repeats)
        pairs = [
            ("delta-spark (format delta)", "ours (read_table)"),
            ("delta-spark (format delta)", "ours (format deltalake)"),
        ]
        report(what, times, pairs, load, self.args.force)

    def s3(self) -> None:
        from committers.delta.spark._s3a import prepare_s3a
        from committers.delta.storage._storage import TableLocation
        from integration_tests._s3server import s3_server

        with s3_server() as server:
            load = wait_for_quiet()
            bucket = server.create_bucket()
            options = server.storage_options()
            problem = prepare_s3a(self.spark, TableLocation.of(f"s3://{bucket}/x", options))
            if problem:
                raise SystemExit(f"Spark cannot write through s3a here: {problem}")
            df = rows_df(self.spark, self.args.rows).cache()
            df.count()

            def ours(staging: str) -> Side:
                return lambda t: TwoPhaseSink(
                    DeltaSink(t, storage_options=options, staging=staging)  # type: ignore[arg-type]
                ).write(df)

            sides: dict[str, Side] = {
                "ours, Spark's writer (s3a)": ours("spark"),
                "ours, Python writers (arrow)": ours("arrow"),
                "delta-spark (s3a)": lambda t: (
                    df.write.format("delta").mode("append").save("s3a://" + t[len("s3://") :])
                ),
            }

            def fresh(side: str, run: int) -> str:
                return f"s3://{bucket}/{side.split()[0].strip(',')}-{run}-{uuid.uuid4().hex[:6]}"

            times = race(sides, fresh, self.args.repeats)
            df.unpersist()
            pairs = [
                ("delta-spark (s3a)", "ours, Spark's writer (s3a)"),
                ("delta-spark (s3a)", "ours, Python writers (arrow)"),
            ]
            title = f"append of {self.args.rows} rows on S3 ({server.kind} at {server.endpoint})"
            report(title, times, pairs, load, self.args.force)
            print(
                "note: delta-spark commits on S3 through S3SingleDriverLogStore (one writing "
                "driver per table at a time); the sink's commits are conditional PUTs."
            )


SCENARIOS = ("append", "stream", "upsert", "compact", "scan", "scan_dv", "s3")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenario", choices=(*SCENARIOS, "all"))
    parser.add_argument("--rows", type=int, default=3_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--sizes",
        type=lambda text: [int(size) for size in text.split(",")],
        default=[1_000_000, 10_000_000, 30_000_000],
        help="table sizes of the upsert scenario, comma-separated",
    )
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--force", action="store_true", help="print ratios on a loaded machine")
    args = parser.parse_args(argv)
    spark = delta_spark_session("vs-delta-spark")
    work = Path(tempfile.mkdtemp(prefix="vs-delta-spark-"))
    try:
        bench = Bench(args, spark, work)
        for scenario in SCENARIOS if args.scenario == "all" else (args.scenario,):
            getattr(bench, scenario)()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
