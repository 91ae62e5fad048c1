"""Congestion control against a throttling HTTP destination, strategies side by side.

The destination is our test server (``committers/tests/_throttling_server.py``) in its own
process on 127.0.0.1: it admits ``capacity`` requests per second through a token bucket (burst
of 50 ms of capacity) and answers 429 with ``Retry-After``/``Retry-After-Ms`` past it; admitted
requests take ``latency`` ms. An HttpSinkWriter is fed without pause (its input always waiting,
as in a backlog), so the rate limiting strategy alone decides how close to the capacity it runs.

The strategies alternate over several rounds (so that noise from other processes on the
machine hits them alike); in each round every strategy gets a fresh writer, a warm-up, and a
measurement window between a reset and a read of the server's counters. Summed over rounds:

* goodput (requests): accepted requests per second as a share of the capacity C;
* goodput (records): accepted records per second as a share of C x max_batch_size, the most
  the destination can take (AIMD also shrinks batches, which costs records, not requests);
* rejected: 429 answers as a share of all requests the server received.

Strategies: Flink's default (CongestionControlRateLimitingStrategy with AIMD: +10, x0.5,
threshold max_batch_size * max_in_flight_requests) and PacingRateLimitingStrategy (ours); a
third row, a fixed pace at 98% of C that is *told* the capacity, shows the ceiling this machine
reaches at the time of the run (a loaded machine delays timers and the server).

Usage: python benchmarks/async_congestion.py [--capacity 100] [--latency-ms 50] [--rounds 2]
       [--seconds 10] [--warmup 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from committers.http import HttpSinkWriter
from committers.tests._throttling_server import serve_in_subprocess
from framework.asyncsink import (
    AsyncSinkWriterConfig,
    CongestionControlRateLimitingStrategy,
    PacingRateLimitingStrategy,
    RateLimitingStrategy,
    RequestInfo,
    ResultInfo,
    RetryPolicy,
)
from framework.sink import WriterContext

CHUNK = 1_000
ORACLE_SHARE = 0.98


class FixedPace:
    """Reference, not a strategy to use: sends full batches at a fixed ``rate`` that is told
    the capacity. Its goodput is the ceiling this machine reaches (timer and CPU noise
    included), against which the adaptive strategies are read."""

    def __init__(self, rate: float, max_in_flight_requests: int, max_batch_size: int) -> None:
        self._interval = 1.0 / rate
        self._next = -1e9
        self._in_flight = 0
        self._max_in_flight = max_in_flight_requests
        self._batch = max_batch_size

    def register_in_flight_request(self, request: RequestInfo) -> None:
        self._in_flight += 1
        now = request.request_start_time
        self._next = max(self._next, now - self._interval) + self._interval

    def register_completed_request(self, result: ResultInfo) -> None:
        self._in_flight -= 1

    def should_block(self, request: RequestInfo) -> bool:
        return self._in_flight >= self._max_in_flight or request.request_start_time < self._next

    def seconds_until_unblocked(self, request: RequestInfo) -> float:
        if self._in_flight >= self._max_in_flight:
            return 0.0
        return max(0.0, self._next - request.request_start_time)

    def get_max_batch_size(self) -> int:
        return self._batch


class Identity:
    def apply(self, element: bytes, context: WriterContext | None) -> bytes:
        return element


def server_call(base_url: str, method: str, path: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{base_url}{path}", method=method, data=b"" if method == "POST" else None
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else {}


async def measure(
    base_url: str,
    config: AsyncSinkWriterConfig,
    strategy: RateLimitingStrategy,
    warmup_s: float,
    seconds: float,
) -> dict[str, float]:
    writer = HttpSinkWriter(
        url=f"{base_url}/ingest",
        element_converter=Identity(),
        config=config,
        # Throttling never spends the budget; the policy only shapes the backoff.
        retry_policy=RetryPolicy(max_attempts=100, initial_backoff_ms=10, max_backoff_ms=1_000),
        rate_limiting_strategy=strategy,
    )
    entries = [
        json.dumps({"id": i, "payload": "x" * 40}, separators=(",", ":")).encode()
        for i in range(CHUNK)
    ]
    stop = asyncio.Event()

    async def produce() -> None:
        while not stop.is_set():
            await writer.write_entries(entries)

    producer = asyncio.create_task(produce())
    await asyncio.sleep(warmup_s)
    await asyncio.to_thread(server_call, base_url, "POST", "/reset")
    before = writer.metrics
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    stats = await asyncio.to_thread(server_call, base_url, "GET", "/stats")
    elapsed = time.perf_counter() - started
    after = writer.metrics
    stop.set()
    await writer.abort()
    producer.cancel()
    await asyncio.gather(producer, return_exceptions=True)
    await writer.close()
    return {
        "seconds": elapsed,
        "accepted": stats["accepted_requests"],
        "rejected": stats["rejected_requests"],
        "records": stats["accepted_records"],
        "client_records": after.num_records_out - before.num_records_out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=float, default=100.0, help="requests per second")
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--batch", type=int, default=100, help="max_batch_size")
    parser.add_argument("--in-flight", type=int, default=50, help="max_in_flight_requests")
    parser.add_argument("--rounds", type=int, default=2, help="strategies alternate per round")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds before measuring")
    parser.add_argument("--seconds", type=float, default=10.0, help="window per round")
    args = parser.parse_args()

    config = AsyncSinkWriterConfig(
        max_batch_size=args.batch,
        max_in_flight_requests=args.in_flight,
        max_buffered_requests=max(10_000, 4 * args.batch),
        max_time_in_buffer_ms=100,
    )
    strategies: list[tuple[str, Callable[[AsyncSinkWriterConfig], RateLimitingStrategy]]] = [
        ("AIMD (Flink defaults)", CongestionControlRateLimitingStrategy.from_config),
        ("Pacing (ours)", PacingRateLimitingStrategy.from_config),
        (
            f"fixed {ORACLE_SHARE:.0%} of C (ref.)",
            lambda cfg: FixedPace(
                ORACLE_SHARE * args.capacity, cfg.max_in_flight_requests, cfg.max_batch_size
            ),
        ),
    ]
    capacity = args.capacity
    print(
        f"# congestion control - {time.strftime('%Y-%m-%d %H:%M')}, Python "
        f"{platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"# server: capacity C = {capacity:g} requests/s (burst {max(1.0, capacity * 0.05):g}), "
        f"latency {args.latency_ms:g} ms, 429 + Retry-After past C; client: max_batch_size "
        f"{args.batch}, max_in_flight_requests {args.in_flight}; {args.rounds} rounds, the "
        f"strategies alternating, each a fresh writer: {args.warmup:g} s warm-up, "
        f"{args.seconds:g} s measured\n"
    )
    totals = {
        name: dict.fromkeys(("seconds", "accepted", "rejected", "records"), 0.0)
        for name, _ in strategies
    }
    with serve_in_subprocess(
        capacity=capacity, latency_ms=args.latency_ms, keep_records=False, poison_field=None
    ) as base_url:
        for _ in range(args.rounds):
            for name, factory in strategies:
                result = asyncio.run(
                    measure(base_url, config, factory(config), args.warmup, args.seconds)
                )
                for key in totals[name]:
                    totals[name][key] += result[key]
                time.sleep(0.5)  # let the token bucket refill between strategies
    header = (
        f"{'strategy':<26}{'goodput req/s':>14}{'% of C':>8}{'records/s':>11}"
        f"{'% of C*batch':>13}{'rejected':>10}{'requests':>10}{'mean batch':>11}"
    )
    print(header)
    for name, total in totals.items():
        requests = total["accepted"] + total["rejected"]
        accepted_rps = total["accepted"] / total["seconds"]
        records_ps = total["records"] / total["seconds"]
        print(
            f"{name:<26}{accepted_rps:>14.1f}"
            f"{100 * accepted_rps / capacity:>7.1f}%"
            f"{records_ps:>11.0f}"
            f"{100 * records_ps / (capacity * args.batch):>12.1f}%"
            f"{100 * total['rejected'] / max(1.0, requests):>9.1f}%"
            f"{requests:>10.0f}{total['records'] / max(1.0, total['accepted']):>11.1f}"
        )
    print("\ntarget for the best strategy: goodput >= 90% of C with <= 5% of requests rejected")


if __name__ == "__main__":
    main()
