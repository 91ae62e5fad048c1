"""At-least-once delivery to an HTTP endpoint that throttles, fails and refuses a poison record.

Run with `python examples/http_sink.py`. What it shows:

1. A local HTTP ingestion server (our test server, on 127.0.0.1) admits 100 requests per second
   and answers 429 with Retry-After past that; 5% of admitted requests fail with a 500 and 5%
   report some of their entries as failed; a request holding a record with "poison": true is
   refused with a 400.
2. A bounded Spark job sends 20,000 rows through TwoPhaseSink(HttpSink(...)): every task
   buffers rows, POSTs JSON arrays of up to 200 rows, retries failures with capped, jittered
   backoff, paces itself with PacingRateLimitingStrategy to stay just under the server's
   capacity, and waits for every request before it ends.
3. The poison row is isolated by splitting its request and written to a dead-letter queue (JSON
   lines); every other row is delivered.
4. The script checks what the server received: every good row at least once, the poison row
   only in the dead-letter queue.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

ROWS, POISON_ID = 20_000, 4_242


def spark_session():
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


def main() -> None:
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "WARNING"), format="%(levelname)s %(name)s: %(message)s"
    )
    from committers.http import HttpSink
    from committers.tests._throttling_server import ThrottlingServer
    from framework import TwoPhaseSink
    from framework.asyncsink import (
        AsyncSinkWriterConfig,
        JsonLinesDeadLetterQueue,
        PacingRateLimitingStrategy,
        RetryPolicy,
    )

    dead_letters = Path(tempfile.mkdtemp(prefix="http-sink-dlq-"))
    spark = spark_session()
    orders = spark.range(0, ROWS, numPartitions=4).selectExpr(
        "id AS order_id",
        "concat('customer-', id % 97) AS customer",
        "round(id * 0.37 % 500, 2) AS amount",
        "timestamp_seconds(1790000000 + id) AS placed_at",
        f"id = {POISON_ID} AS poison",
    )
    with ThrottlingServer(
        capacity=100, failure_rate=0.05, partial_failure_rate=0.05, poison_field="poison", seed=1
    ) as server:
        print(f"server {server.url}: 100 requests/s, 10% of requests fail, poison -> 400")
        sink = HttpSink(
            server.url,
            config=AsyncSinkWriterConfig(
                max_batch_size=200, max_in_flight_requests=8, max_time_in_buffer_ms=500
            ),
            retry_policy=RetryPolicy(max_attempts=10, initial_backoff_ms=20, max_backoff_ms=2_000),
            rate_limiting=PacingRateLimitingStrategy.from_config,
            dead_letter_queue=JsonLinesDeadLetterQueue(str(dead_letters)),
            app_id="orders-to-http",
        )
        metrics = TwoPhaseSink(sink).write(orders)
        received = server.records
        stats = server.stats
    spark.stop()

    delivered = {record["order_id"] for record in received}
    letters = [
        json.loads(line)
        for path in sorted(dead_letters.glob("*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    print(f"batch: {metrics.status} in {metrics.stage_ms / 1000:.1f} s")
    print(
        f"server: {stats.requests} requests, {stats.accepted_requests} accepted, "
        f"{stats.rejected_requests} throttled (429), {stats.failed_requests} failed (500), "
        f"{stats.partially_failed_requests} partially failed, {stats.poison_requests} refused "
        f"(400)"
    )
    print(f"delivered {len(delivered)} distinct rows ({len(received) - len(delivered)} duplicates)")
    print(f"dead letters in {dead_letters}: {[letter['entry']['order_id'] for letter in letters]}")
    assert delivered == set(range(ROWS)) - {POISON_ID}, "a good row is missing"
    assert [letter["entry"]["order_id"] for letter in letters] == [POISON_ID]
    print("OK: every good row delivered at least once; the poison row is in the dead-letter queue")


if __name__ == "__main__":
    main()
