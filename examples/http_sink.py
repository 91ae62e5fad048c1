"""At-least-once delivery to an HTTP endpoint that throttles, fails and refuses a poison record.

Run with `python examples/http_sink.py`. What it shows:

1. A local HTTP ingestion server (our test server, on 127.0.0.1) admits 100 requests per second
   and answers 429 with Retry-After past that; 5% of admitted requests fail with a 500 and 5%
   report some of their entries as failed; a request holding a record with "poison": true is
   refused with a 400.
2. A bounded Spark job sends 20,000 rows in 4 partitions through TwoPhaseSink(HttpSink(...)):
   every task buffers rows, POSTs JSON arrays of up to 200 rows, retries failures with capped,
   jittered backoff, paces itself with PacingRateLimitingStrategy (the strategy recommended for
   endpoints with a request quota, with its defaults), and waits for every request before it
   ends.
3. The poison row is isolated by splitting its request and written to a dead-letter queue (JSON
   lines); every other row is delivered.
4. The script prints what the server counted, with what each figure means, and checks what it
   received: every good row at least once, the poison row only in the dead-letter queue.

How many requests are throttled here, and why that is not the README's 0.6%
---------------------------------------------------------------------------
Five runs on a 2-core machine (load average 0.4 to 7) counted 219 to 262 requests, of which 77
to 108 (35-42%) were answered 429. The README's "0.6% rejected" is the steady state of ONE writer
with a backlog, measured by benchmarks/async_congestion.py after a 3 s warm-up that is not
counted. This job never reaches a steady state (the server sees its requests for only 1.6 to
2.6 s), and a trace of every request showed why it is throttled more:

* every Spark task builds a fresh rate limiter, and a pacing limiter starts unpaced (only
  max_in_flight_requests, here 8, applies) and learns the quota from its first 429s. A task makes
  only about 25 requests, and 8 to 16 of them were throttled in its first 100 ms (49 of the 61
  429s of a run without the poison row);
* local[2] runs two tasks at a time against one quota, each limiter seeing only its share;
* the requests that split the poison row's batch are not paced, and a throttled half goes back
  to the buffer, so the isolation starts again from a full batch: 14 to 32 requests were
  refused with a 400 where about 9 would do.

Throttling costs time, never rows: a 429 is answered before the server does any work, its rows
are sent again after the Retry-After, and it does not count against the retry budget. If you
know the quota share of each task, `functools.partial(PacingRateLimitingStrategy.from_config,
initial_rate=...)` skips the start-up probing: with initial_rate=50 (100 requests/s, two tasks
at a time) a run had 43 requests throttled, all while the poison row was being isolated (its
unpaced splits also took the other task's share). Fewer 429s, not a faster job: a task running
alone then uses half of the quota.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROWS, PARTITIONS, POISON_ID = 20_000, 4, 4_242
CAPACITY = 100  # requests per second the server admits
BATCH = 200  # rows per request
IN_FLIGHT = 8  # requests in flight per task
WIDTH = 100  # of the printed lines
MAX_ATTEMPTS = 10  # failures a row may have (throttling excluded) before it is dead-lettered


@dataclass(frozen=True)
class Outcome:
    """What one run produced: the sink's batch metrics, the server's counters and contents."""

    url: str
    status: str
    stage_s: float
    stats: Any  # committers.tests._throttling_server.ServerStats
    received_ids: list[int]
    dead_lettered_ids: list[int]
    dead_letter_dir: Path
    rows: int
    poison_id: int


def spark_session() -> SparkSession:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("http-sink-example")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(
    spark: SparkSession, dead_letter_dir: Path, rows: int = ROWS, poison_id: int = POISON_ID
) -> Outcome:
    """Send ``rows`` orders (one of them poison) through the sink to a fresh local server."""
    from committers.http import HttpSink
    from committers.tests._throttling_server import ThrottlingServer
    from framework import TwoPhaseSink
    from framework.asyncsink import (
        AsyncSinkWriterConfig,
        JsonLinesDeadLetterQueue,
        PacingRateLimitingStrategy,
        RetryPolicy,
    )

    orders = spark.range(0, rows, numPartitions=PARTITIONS).selectExpr(
        "id AS order_id",
        "concat('customer-', id % 97) AS customer",
        "round(id * 0.37 % 500, 2) AS amount",
        "timestamp_seconds(1790000000 + id) AS placed_at",
        f"id = {poison_id} AS poison",
    )
    with ThrottlingServer(
        capacity=CAPACITY,
        failure_rate=0.05,
        partial_failure_rate=0.05,
        poison_field="poison",
        seed=1,
    ) as server:
        sink = HttpSink(
            server.url,
            config=AsyncSinkWriterConfig(
                max_batch_size=BATCH, max_in_flight_requests=IN_FLIGHT, max_time_in_buffer_ms=500
            ),
            retry_policy=RetryPolicy(
                max_attempts=MAX_ATTEMPTS, initial_backoff_ms=20, max_backoff_ms=2_000
            ),
            rate_limiting=PacingRateLimitingStrategy.from_config,
            dead_letter_queue=JsonLinesDeadLetterQueue(str(dead_letter_dir)),
            app_id="orders-to-http",
        )
        metrics = TwoPhaseSink(sink).write(orders)
        received = server.records
        stats = server.stats
    letters = [
        json.loads(line)
        for path in sorted(dead_letter_dir.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    return Outcome(
        url=server.url,
        status=metrics.status,
        stage_s=metrics.stage_ms / 1000,
        stats=stats,
        received_ids=[record["order_id"] for record in received],
        dead_lettered_ids=[letter["entry"]["order_id"] for letter in letters],
        dead_letter_dir=dead_letter_dir,
        rows=rows,
        poison_id=poison_id,
    )


def _wrap(text: str, indent: int = 2, first: str = "") -> list[str]:
    return textwrap.wrap(
        text,
        width=WIDTH,
        initial_indent=first,
        subsequent_indent=" " * (len(first) if first else indent),
        break_on_hyphens=False,
    )


def explain(outcome: Outcome) -> list[str]:
    """The figures of a run, each with what it means (lines of at most 100 characters)."""
    stats = outcome.stats
    needed = PARTITIONS * math.ceil(outcome.rows / PARTITIONS / BATCH)
    share = stats.rejected_requests / max(1, stats.requests)
    span = (stats.last_request_time or 0.0) - (stats.first_request_time or 0.0)
    distinct = len(set(outcome.received_ids))
    figures = [
        (
            f"{stats.accepted_requests:7} accepted (200)",
            f"{needed} requests of up to {BATCH} rows carry the rows; the others carried rows "
            f"sent again, or a half split off around the poison row",
        ),
        (
            f"{stats.partially_failed_requests:7}  of them partial",
            'answered 200 {"failed": [...]}: only the rows listed are sent again',
        ),
        (
            f"{stats.rejected_requests:7} throttled (429)",
            f"{share:.0%} of the requests: refused for capacity before any work and sent again "
            f"after Retry-After; throttling never counts against the retry budget, so it costs "
            f"time, not rows",
        ),
        (
            f"{stats.failed_requests:7} failed (500)",
            f"sent again after a backoff; a row may fail {MAX_ATTEMPTS} times before it is "
            f"dead-lettered",
        ),
        (
            f"{stats.poison_requests:7} refused (400)",
            "held the poison row: its request is split in halves until the row is alone, "
            "then dead-lettered",
        ),
    ]
    lines = _wrap(
        f"server {outcome.url}: admits {CAPACITY} requests/s (429 past that); 5% of admitted "
        f"requests answer 500, 5% report some rows failed; a request holding the poison row "
        f"answers 400"
    )
    lines += _wrap(
        f"batch: {outcome.status} in {outcome.stage_s:.1f} s (the Spark job included); the "
        f"server saw requests for {span:.1f} s, and the {needed} requests the rows need take "
        f"at least {needed / CAPACITY:.1f} s at {CAPACITY} requests/s"
    )
    lines.append(f"the server counted {stats.requests} requests, each answered one way:")
    for figure, meaning in figures:
        lines += _wrap(meaning, first=f"{figure:<26}")
    lines += _wrap(
        f"delivered {distinct:,} distinct rows, {len(outcome.received_ids) - distinct} "
        f"duplicates (at-least-once: a retried task or a timed-out request may send rows "
        f"twice); dead-lettered: {outcome.dead_lettered_ids}, in {outcome.dead_letter_dir}"
    )
    lines += _wrap(
        f"why {share:.0%} throttled here and 0.6% in the README: the README's figure is the "
        f"steady state of one writer with a backlog; here each of {PARTITIONS} short tasks "
        f"starts a fresh rate limiter that learns the quota from its first 429s, two tasks "
        f"share the quota, and the requests that isolate the poison row are not paced (see "
        f"this script's docstring)"
    )
    return lines


def problems(outcome: Outcome) -> list[str]:
    """What the run got wrong; empty when every good row arrived and only the poison row is
    dead-lettered."""
    found = []
    stats = outcome.stats
    missing = set(range(outcome.rows)) - {outcome.poison_id} - set(outcome.received_ids)
    if missing:
        found.append(f"{len(missing)} good rows never arrived, e.g. {sorted(missing)[:5]}")
    if outcome.poison_id in outcome.received_ids:
        found.append("the poison row was delivered")
    if outcome.dead_lettered_ids != [outcome.poison_id]:
        found.append(f"dead letters {outcome.dead_lettered_ids}, expected [{outcome.poison_id}]")
    answered = (
        stats.accepted_requests
        + stats.rejected_requests
        + stats.failed_requests
        + stats.poison_requests
    )
    if answered != stats.requests:
        found.append(f"{stats.requests} requests but {answered} answers counted")
    if outcome.status != "delivered":
        found.append(f"batch status {outcome.status!r}")
    return found


def main() -> int:
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s"
    )
    spark = spark_session()
    try:
        print(f"sending {ROWS:,} rows in {PARTITIONS} Spark tasks to a local throttling server")
        outcome = run(spark, Path(tempfile.mkdtemp(prefix="http-sink-dlq-")))
    finally:
        spark.stop()
    for line in explain(outcome):
        print(line)
    found = problems(outcome)
    for problem in found:
        print(f"FAILED: {problem}")
    if not found:
        print(
            "OK: every good row delivered at least once; the poison row is in the dead-letter queue"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
