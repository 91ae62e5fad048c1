"""The crash-point campaign: a streaming job into a Delta table, killed (SIGKILL of the whole
driver process tree) at every named step of the commit protocol and at random moments, then
restarted from its checkpoint; at the end the table is checked against its source.

Usage (``make campaign`` runs it)::

    python -m committers.tests._campaign --seed 7 --cycles 40 [--staging auto|spark|arrow|mixed]
        [--source json|delta|changes|kafka|kafka-changes] [--workdir DIR] [--json REPORT.json]

Each cycle adds source files of fresh unique ids, then runs the job with one kill planned: a
named step (``SPARKSINK_CRASH_AT``, see ``framework._crash``) or, for ``random``, a timer in
this process. On ``schema_merge``'s turn the source gains a column, so the run merges the
schema and the kill falls between that metadata commit and the data commit. A first run
without a kill creates the table; a last one drains the source. The check reads the table
with deltalake and with DuckDB's delta extension: duplicates, lost and unexpected ids, staged
files left after ``remove_orphan_files``, and whether it reads at all.

The source is a directory of JSON files (``json``, Spark's file source) or a Delta table that
delta-rs appends to, one commit per file, read through the ``"deltalake"`` format
(``delta``). With a Delta source the campaign also kills at ``offsets_written`` (the source
plans a batch whose offsets Spark just wrote): the very first run is killed there, right after
``offsets/0``, before anything is committed, and the source is compacted while the job is down
(then, and before a third of the cycles, seeded).

The ``changes`` source is a directory of JSON files of *changes* (inserts of new ids, updates
and deletes of live ones, re-inserts of deleted ones, each with a global sequence number),
upserted by key into a table that enables deletion vectors and the change data feed: each
batch marks the rows it replaces in vectors (merge-on-read) and writes change files. The check
compares the table with the changes applied in order, and its change feed (read by delta-rs)
with the changes: every insert and update exactly once, every delete of a live row exactly
once, nothing else.

The ``kafka`` source is a topic on a local broker started for the campaign, read by Spark's
Kafka source (``committers/tests/_campaign_kafka.py``); the check also asks that each record
produced is in the table once by its (partition, offset). ``kafka-changes`` is the
``changes`` source as Debezium-style change events in a topic, checked as ``changes``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from framework._crash import CRASH_STEPS, CRASH_VARIABLE, LOG_VARIABLE

STORAGE_OPTIONS_VARIABLE = "SPARKSINK_CAMPAIGN_STORAGE_OPTIONS"  # JSON, for the driver
AUTO_COMPACT_VARIABLE = "SPARKSINK_CAMPAIGN_AUTO_COMPACT"  # set: the driver's sink compacts
COMPACTION_STEPS = ("compaction_commit", "compaction_committed")

REPO_ROOT = Path(__file__).resolve().parents[2]
RANDOM = "random"
KINDS = (*CRASH_STEPS, RANDOM)
#: Only a source of this framework (the "deltalake" format) reaches ``offsets_written``.
JSON_KINDS = tuple(kind for kind in KINDS if kind != "offsets_written")
SOURCES = ("json", "delta", "changes", "kafka", "kafka-changes")
#: The steps an upsert stream passes (no schema merges, no blind appends, no compactions).
CHANGE_KINDS = (
    "replay_check",
    "staging",
    "before_commit",
    "commit_write",
    "after_commit",
    "clean_up",
    "checkpoint_started",
    RANDOM,
)
IDS_PER_FILE = 20
RUN_TIMEOUT_SECONDS = 300
#: The last, unkilled run drains every batch the killed runs left (their backlog grows with
#: the cycles); a drain run that is still busy after RUN_TIMEOUT_SECONDS is killed and run
#: again (one more crash), up to this many times.
DRAIN_RUNS = 8
RANDOM_KILL_WINDOW = (1.0, 15.0)  # seconds after start: Spark's start-up, batches, shutdown


@dataclass
class CampaignReport:
    """The campaign's figures (what docs/reliability.md publishes)."""

    seed: int
    staging: str
    source: str = "json"  # or "delta"
    cycles: int = 0
    kills: dict[str, int] = field(default_factory=dict)  # per step: runs that really died there
    not_reached: dict[str, int] = field(default_factory=dict)  # planned kill, run ended first
    source_files: int = 0
    source_compactions: int = 0  # of a Delta source, while the job was down
    rows_expected: int = 0
    rows_deltalake: int = 0
    rows_duckdb: int | None = None  # None: not read (DuckDB's delta extension has no S3 here)
    duplicates: int = 0
    lost: int = 0
    unexpected: int = 0
    orphans_removed: int = 0  # staged files of killed runs that remove_orphan_files deleted
    wrong_values: int = 0  # (changes source) rows whose value is not the latest change's
    feed_changes: int = 0  # (changes source) rows of the change feed
    feed_wrong: int = 0  # (changes source) changes missing from the feed, or there twice
    orphans_left: int = 0  # files on disk the table does not reference, after that
    drain_runs: int = 0  # runs the final drain took (each but the last killed at the timeout)
    table_version: int = -1
    readable: bool = False
    seconds: float = 0.0
    table: str = "file"  # or "s3"
    s3_faults: dict[str, int] = field(default_factory=dict)  # injected by the proxy, per kind
    s3_requests: int = 0  # requests the proxy saw

    @property
    def exact(self) -> bool:
        return (
            self.readable
            and self.duplicates == self.lost == self.unexpected == self.orphans_left == 0
            and self.rows_deltalake == self.rows_expected
            and self.rows_duckdb in (None, self.rows_expected)
            and self.wrong_values == self.feed_wrong == 0
        )


class JobHung(RuntimeError):
    """A run without a random kill did not end within RUN_TIMEOUT_SECONDS (it was killed)."""


class _Source:
    """Files of consecutive unique ids, with ``notes`` extra columns: JSON-lines files in a
    directory (``kind`` json) or commits of a Delta table (``kind`` delta, one file each)."""

    def __init__(self, directory: Path, kind: str = "json") -> None:
        self.directory = directory
        self.kind = kind
        self.next_id = 0
        self.files = 0
        self.notes = 0
        self.compactions = 0
        self.auto_compact = False  # the job's sink compacts between batches (see the driver)
        if kind == "json":
            directory.mkdir(parents=True, exist_ok=True)

    def location(self) -> str:
        """What the driver reads (its SOURCE argument)."""
        return str(self.directory)

    def _rows(self) -> list[dict[str, object]]:
        rows = []
        for i in range(self.next_id, self.next_id + IDS_PER_FILE):
            row: dict[str, object] = {"id": i, "day": f"d{i % 3}"}
            for n in range(1, self.notes + 1):
                row[f"note{n}"] = f"{n}-{i}"
            rows.append(row)
        return rows

    def add_file(self) -> None:
        if self.kind == "delta":
            import pyarrow as pa
            from deltalake import write_deltalake

            table = pa.Table.from_pylist(self._rows()).cast(
                pa.schema(
                    [("id", pa.int64()), ("day", pa.string())]
                    + [(f"note{n}", pa.string()) for n in range(1, self.notes + 1)]
                )
            )
            write_deltalake(str(self.directory), table, mode="append", schema_mode="merge")
        else:
            temporary = self.directory / f".part-{self.files:05d}.tmp"
            temporary.write_text("".join(json.dumps(row) + "\n" for row in self._rows()))
            temporary.rename(self.directory / f"part-{self.files:05d}.json")  # atomic for Spark
        self.next_id += IDS_PER_FILE
        self.files += 1

    def compact(self) -> None:
        """Compact a Delta source (a commit that only rewrites files)."""
        from deltalake import DeltaTable

        DeltaTable(str(self.directory)).optimize.compact()
        self.compactions += 1


class _ChangeSource(_Source):
    """JSON files of changes by key (``id``, ``day`` = its partition, ``v``, a global
    ``seq``, ``op`` I/U/D), and what applying them in order gives: the live rows, the changes
    the table's feed must report once each."""

    def __init__(self, directory: Path, rng: random.Random) -> None:
        super().__init__(directory, "json")
        self.kind = "changes"  # (what the driver reads them as)
        self.modified = 0  # nanoseconds: the newest file's modification time
        self.rng = rng
        self.seq = 0
        self.live: dict[int, tuple[str, int]] = {}  # id -> (v, seq of the row)
        self.deleted: list[int] = []
        self.written: Counter[tuple[int, int]] = Counter()  # (id, seq): inserts and updates
        self.removed: Counter[tuple[int, int]] = Counter()  # (id, seq of the row deleted)

    def add_file(self) -> None:
        rows: list[dict[str, object]] = []
        used: set[int] = set()
        for _ in range(IDS_PER_FILE):
            self.seq += 1
            draw = self.rng.random()
            live = [i for i in self.live if i not in used]
            dead = [i for i in self.deleted if i not in used and i not in self.live]
            if live and draw < 0.3:
                id_, op = self.rng.choice(live), "U"
            elif live and draw < 0.5:
                id_, op = self.rng.choice(live), "D"
            elif dead and draw < 0.6:
                id_, op = self.rng.choice(dead), self.rng.choice("ID")  # (a D deletes nothing)
            else:
                id_, op = self.next_id, "I"
                self.next_id += 1
            used.add(id_)
            value = f"{id_}@{self.seq}"
            rows.append({"id": id_, "day": f"d{id_ % 3}", "v": value, "seq": self.seq, "op": op})
            if op == "D":
                if id_ in self.live:
                    self.removed[(id_, self.live.pop(id_)[1])] += 1
                    self.deleted.append(id_)
            else:
                self.live[id_] = (value, self.seq)
                self.written[(id_, self.seq)] += 1
        self._write(rows)
        self.files += 1

    def _write(self, rows: list[dict[str, object]]) -> None:
        temporary = self.directory / f".part-{self.files:05d}.tmp"
        temporary.write_text("".join(json.dumps(row) + "\n" for row in rows))
        # Spark's file source takes files in the order of their modification times (ties in
        # any order): a millisecond apart each, the batches apply the changes in order.
        self.modified = max(time.time_ns(), self.modified + 1_000_000)
        os.utime(temporary, ns=(self.modified, self.modified))
        temporary.rename(self.directory / f"part-{self.files:05d}.json")  # atomic for Spark

    def create_table(self, table: _Target) -> None:
        """The target: partitioned by ``day``, deletion vectors and the change feed on, a
        checkpoint every two versions."""
        import pyarrow as pa
        from deltalake import DeltaTable

        schema = pa.schema(
            [("id", pa.int64()), ("day", pa.string()), ("v", pa.string()), ("seq", pa.int64())]
        )
        DeltaTable.create(
            table.uri,
            schema,
            partition_by=["day"],
            storage_options=table.check_options,
            configuration={
                "delta.enableDeletionVectors": "true",
                "delta.enableChangeDataFeed": "true",
                "delta.checkpointInterval": "2",
            },
        )


@dataclass(frozen=True)
class _Target:
    """Where the table lives: what the job writes through (``options``, on S3 through the
    fault proxy) and what the check reads with (``check_options``, straight to the store)."""

    uri: str
    options: dict[str, str] | None = None
    check_options: dict[str, str] | None = None


def start_driver(
    module: str,
    args: list[str],
    *,
    crash_log: Path,
    crash_at: str | None,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Start ``python -m module args`` from the repository as a process group of its own (so
    one kill takes the driver, its JVM and its workers), killed at the crash point
    ``crash_at`` (``SPARKSINK_CRASH_AT``), which it then notes in ``crash_log`` (emptied
    first); stdout and stderr are piped."""
    crash_log.unlink(missing_ok=True)
    environment = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        LOG_VARIABLE: str(crash_log),
        **(env or {}),
    }
    environment.pop(CRASH_VARIABLE, None)
    if crash_at is not None:
        environment[CRASH_VARIABLE] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=REPO_ROOT,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the kill takes all of it
    )


def _run_job(
    source: _Source,
    target: _Target,
    checkpoint: Path,
    staging: str,
    kind: str | None,
    rng: random.Random,
) -> str:
    """Run the job once; returns ``"killed"``, ``"finished"`` or raises on another failure."""
    crash_log = checkpoint.parent / "crashes.log"
    process = start_driver(
        "committers.tests._campaign_driver",
        [
            source.location(),
            target.uri,
            str(checkpoint),
            staging,
            str(source.notes),
            source.kind,
        ],
        crash_log=crash_log,
        crash_at=None if kind == RANDOM else kind,
        env={
            STORAGE_OPTIONS_VARIABLE: json.dumps(target.options or {}),
            AUTO_COMPACT_VARIABLE: "1" if source.auto_compact else "",
        },
    )
    timeout = RUN_TIMEOUT_SECONDS
    if kind == RANDOM:
        timeout = rng.uniform(*RANDOM_KILL_WINDOW)
    try:
        _stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        if kind != RANDOM:
            os.killpg(process.pid, signal.SIGKILL)
            raise JobHung(f"the job hung for {RUN_TIMEOUT_SECONDS}s") from None
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return "killed"
    if process.returncode == -signal.SIGKILL and crash_log.exists():
        return "killed"
    if process.returncode != 0:
        raise RuntimeError(f"the job failed ({process.returncode}):\n{stderr[-4000:]}")
    return "finished"


def _staging_of(staging: str, cycle: int, source: str = "json") -> str:
    """``mixed``: the cycles alternate between Spark's writer and the Python writers, so one
    table holds batches of both and each crash lands on a run of either (an upsert's: Spark
    only, or Python tasks for kept rows)."""
    if staging != "mixed":
        return staging
    upsert = source in ("changes", "kafka-changes")
    return (("auto", "spark") if upsert else ("spark", "arrow"))[cycle % 2]


def run_campaign(
    seed: int,
    cycles: int,
    workdir: Path,
    staging: str = "auto",
    kinds: tuple[str, ...] | None = None,
    s3_fault_rate: float | None = None,
    source: str = "json",
) -> CampaignReport:
    """Run ``cycles`` killed runs (planned kills drawn from ``kinds``, by default every step
    the ``source`` reaches) and a final clean one; return the checked figures. With
    ``s3_fault_rate``, the table lives on a local S3 server and the job reaches it through the
    fault proxy at that rate (503 SlowDown, 500, connections dropped before and after the
    server got the request)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if kinds is None:
        kinds = {"delta": KINDS, "changes": CHANGE_KINDS, "kafka-changes": CHANGE_KINDS}.get(
            source, JSON_KINDS
        )
    if source in ("changes", "kafka-changes") and staging == "arrow":
        raise ValueError(
            "an upsert stream writes its new rows with Spark: staging 'arrow' is not one"
        )
    if s3_fault_rate is None:
        return _campaign(
            seed, cycles, workdir, staging, kinds, _Target(str(workdir / "table")), source
        )
    from integration_tests._fault_proxy import FAULT_KINDS, fault_proxy
    from integration_tests._s3server import s3_server

    with s3_server() as server:
        bucket = server.create_bucket()
        with fault_proxy(
            server.endpoint,
            fault_rate=s3_fault_rate,
            seed=seed,
            methods=("PUT", "POST", "GET", "HEAD", "DELETE"),
            kinds=FAULT_KINDS,
        ) as proxy:
            target = _Target(
                f"s3://{bucket}/campaign",
                server.storage_options(AWS_ENDPOINT_URL=proxy.endpoint),
                server.storage_options(),
            )
            report = _campaign(seed, cycles, workdir, staging, kinds, target, source)
            report.s3_faults = dict(proxy.faults)
            report.s3_requests = sum(proxy.requests.values())
        return report


def _campaign(
    seed: int,
    cycles: int,
    workdir: Path,
    staging: str,
    kinds: tuple[str, ...],
    table: _Target,
    source_kind: str = "json",
) -> CampaignReport:
    kind_of_store = "s3" if table.uri.startswith("s3://") else "file"
    report = CampaignReport(seed=seed, staging=staging, source=source_kind, table=kind_of_store)
    if source_kind in ("kafka", "kafka-changes"):
        from committers.tests._campaign_kafka import kafka_source, start_broker

        broker = start_broker(workdir / "broker")
        try:
            source = kafka_source(source_kind, broker, random.Random(seed + 1), table)
            return _run_cycles(seed, cycles, workdir, staging, kinds, table, source, report)
        finally:
            broker.stop()
    if source_kind == "changes":
        source: _Source = _ChangeSource(workdir / "source", random.Random(seed + 1))
        source.create_table(table)  # type: ignore[attr-defined]
    else:
        source = _Source(workdir / "source", source_kind)
    return _run_cycles(seed, cycles, workdir, staging, kinds, table, source, report)


def _run_cycles(
    seed: int,
    cycles: int,
    workdir: Path,
    staging: str,
    kinds: tuple[str, ...],
    table: _Target,
    source: _Source,
    report: CampaignReport,
) -> CampaignReport:
    started = time.monotonic()
    rng = random.Random(seed)
    source_kind = source.kind
    source.auto_compact = any(kind in COMPACTION_STEPS for kind in kinds)
    checkpoint = workdir / "checkpoint"
    # Every step once per round, in a seeded order; the schema grows on schema_merge's turn.
    plan: list[str] = []
    while len(plan) < cycles:
        round_ = list(kinds)
        rng.shuffle(round_)
        plan.extend(round_)
    plan = plan[:cycles]
    for _ in range(2 if source_kind == "delta" else 1):
        source.add_file()
    first = _staging_of(staging, 0, source_kind)
    if source_kind == "delta":
        _kill_before_the_first_commit(source, table, checkpoint, first, rng, report)
    _run_job(source, table, checkpoint, first, None, rng)  # the table exists from here on
    for cycle, kind in enumerate(plan):
        for _ in range(rng.randint(1, 3)):
            source.add_file()
        if source_kind == "delta" and rng.random() < 1 / 3:
            source.compact()  # while the job is down
        if kind == "schema_merge":
            source.notes += 1  # this run's first batch adds a column
            source.add_file()
        cycle_staging = _staging_of(staging, cycle, source_kind)
        outcome = _run_job(source, table, checkpoint, cycle_staging, kind, rng)
        tally = report.kills if outcome == "killed" else report.not_reached
        tally[kind] = tally.get(kind, 0) + 1
        report.cycles += 1
        # The tally as it goes, so a harness that dies still leaves its figures behind.
        print(f"cycle {cycle + 1}/{cycles}: {kind}: {outcome}", file=sys.stderr, flush=True)
    report.drain_runs = _drain(source, table, checkpoint, first, rng)
    report.source_files = source.files
    report.source_compactions = source.compactions
    if isinstance(source, _ChangeSource):
        report.rows_expected = len(source.live)
        _check(report, table, expected=set(source.live))
        _check_changes(report, table, source)
    else:
        report.rows_expected = source.next_id
        _check(report, table, expected=set(range(source.next_id)))
    if source_kind == "kafka":
        from committers.tests._campaign_kafka import check_positions

        check_positions(report, table, source)  # type: ignore[arg-type]
    report.seconds = round(time.monotonic() - started, 1)
    return report


def _kill_before_the_first_commit(
    source: _Source,
    table: _Target,
    checkpoint: Path,
    staging: str,
    rng: random.Random,
    report: CampaignReport,
) -> None:
    """The job's very first run, killed right after Spark wrote ``offsets/0``; then the source
    moves on (a new commit, a compaction), so the restart replays batch 0 from an initial
    offset that now names a later snapshot."""
    step = "offsets_written"
    outcome = _run_job(source, table, checkpoint, staging, step, rng)
    if outcome != "killed" or not (checkpoint / "offsets" / "0").exists():
        raise RuntimeError(f"the first run was not killed after offsets/0 ({outcome})")
    if (checkpoint / "commits" / "0").exists():
        raise RuntimeError("the first run committed batch 0 before its kill")
    report.kills[step] = report.kills.get(step, 0) + 1
    source.add_file()
    source.compact()


def _drain(
    source: _Source, table: _Target, checkpoint: Path, staging: str, rng: random.Random
) -> int:
    """Run the job without a planned kill until it has processed everything; returns the
    number of runs it took."""
    for run in range(1, DRAIN_RUNS + 1):
        try:
            _run_job(source, table, checkpoint, staging, None, rng)
            return run
        except JobHung:
            print(
                f"drain run {run} still busy after {RUN_TIMEOUT_SECONDS}s: killed, run again",
                file=sys.stderr,
                flush=True,
            )
    raise JobHung(f"the drain did not finish in {DRAIN_RUNS} runs of {RUN_TIMEOUT_SECONDS}s")


def _check(report: CampaignReport, table: _Target, expected: set[int]) -> None:
    """Read the table straight from the store (no faults) and count what is wrong."""
    from deltalake import DeltaTable

    from committers.delta.storage._staging import STAGING_DIR
    from committers.delta.storage._storage import TableLocation
    from committers.delta.table._table import referenced_paths, remove_orphan_files
    from committers.tests._readers import duckdb_rows

    location = TableLocation.of(table.uri, table.check_options)
    dt = DeltaTable(location.uri, storage_options=location.delta_storage_options())
    report.orphans_removed = len(
        remove_orphan_files(location, retention_seconds=0, unsafe_allow_short_retention=True)
    )
    report.table_version = dt.version()
    by_deltalake = [row["id"] for row in _deltalake_rows(dt, "id")]
    readers = [by_deltalake]
    if location.is_local:  # DuckDB's delta extension here has no S3 (no httpfs)
        readers.append([row["id"] for row in duckdb_rows(table.uri)])
        report.rows_duckdb = len(readers[-1])
    report.rows_deltalake = len(by_deltalake)
    report.readable = True
    for ids in readers:
        counts = Counter(ids)
        report.duplicates = max(report.duplicates, sum(n - 1 for n in counts.values()))
        report.lost = max(report.lost, len(expected - set(counts)))
        report.unexpected = max(report.unexpected, len(set(counts) - expected))
    # Files the log references: live ones (with their vectors' files), and those an upsert or
    # compaction replaced (kept for time travel until VACUUM).
    committed = referenced_paths(location)
    on_store = [location.relative(path) for path in location.filesystem().find(location.path())]
    stray = {
        path
        for path in on_store
        if path.endswith((".parquet", ".bin"))
        and not path.startswith(("_delta_log/", STAGING_DIR + "/"))
    } - committed
    staged = [path for path in on_store if path.startswith(STAGING_DIR + "/")]
    report.orphans_left = len(stray) + len(staged)


def _deltalake_rows(dt: Any, columns: str) -> list[dict[str, Any]]:
    """``columns`` of every row, read by deltalake (its DataFusion reader: its pyarrow
    dataset refuses tables with deletion vectors)."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    rows = QueryBuilder().register("t", dt).execute(f"SELECT {columns} FROM t").read_all()
    found: list[dict[str, Any]] = pa.table(rows).to_pylist()
    return found


def _check_changes(report: CampaignReport, table: _Target, source: _ChangeSource) -> None:
    """The table holds each live id's latest value; its change feed (delta-rs) reports every
    insert and update once, every delete of a live row once, and nothing else."""
    import pyarrow as pa
    from deltalake import DeltaTable

    dt = DeltaTable(table.uri, storage_options=table.check_options)
    rows = _deltalake_rows(dt, "id, v, seq")
    stored = {(r["id"], r["v"], r["seq"]) for r in rows}
    expected = {(i, v, seq) for i, (v, seq) in source.live.items()}
    report.wrong_values = len(stored ^ expected)
    feed = pa.table(dt.load_cdf(starting_version=0).read_all()).to_pylist()
    written: Counter[tuple[int, int]] = Counter()
    removed: Counter[tuple[int, int]] = Counter()
    for change in feed:
        if change["_change_type"] in ("insert", "update_postimage"):
            written[(change["id"], change["seq"])] += 1
        elif change["_change_type"] == "delete":
            removed[(change["id"], change["seq"])] += 1
    report.feed_changes = len(feed)
    report.feed_wrong = sum(((written - source.written) + (source.written - written)).values())
    report.feed_wrong += sum(((removed - source.removed) + (source.removed - removed)).values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--cycles", type=int, default=len(KINDS) * 5)
    parser.add_argument("--staging", choices=("auto", "spark", "arrow", "mixed"), default="auto")
    parser.add_argument(
        "--source",
        choices=SOURCES,
        default="json",
        help="JSON files (Spark's file source), a Delta table read by the deltalake format, "
        "JSON changes upserted by key, or a Kafka topic on a local broker",
    )
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument(
        "--s3-faults",
        type=float,
        default=None,
        metavar="RATE",
        help="put the table on a local S3 server behind the fault proxy at this rate (0.1)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    args = parser.parse_args()
    workdir = args.workdir or Path(f"campaign-{args.seed}-{args.staging}")
    if workdir.exists() and any(workdir.iterdir()):
        parser.error(f"{workdir} is not empty: the campaign needs a fresh directory")
    report = run_campaign(
        args.seed,
        args.cycles,
        workdir,
        args.staging,
        s3_fault_rate=args.s3_faults,
        source=args.source,
    )
    text = json.dumps({**asdict(report), "exact": report.exact}, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    sys.exit(0 if report.exact else 1)


if __name__ == "__main__":
    # Run as `python -m`, this file is __main__, a second copy of the module: the Kafka
    # sources subclass the classes of committers.tests._campaign, so that copy's main runs.
    from committers.tests._campaign import main as imported_main

    imported_main()
