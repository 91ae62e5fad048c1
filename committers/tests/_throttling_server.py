"""A real HTTP ingestion server for tests, the example and the benchmarks (aiohttp, 127.0.0.1).

``POST /ingest`` takes a JSON array of objects, like :class:`committers.http.HttpSink` sends.
The server admits requests through a token bucket of ``capacity`` requests per second (with a
small ``burst``) and answers ``429 Too Many Requests`` past it, with ``Retry-After`` (whole
seconds, as RFC 9110 has it) and ``Retry-After-Ms`` (the precise wait). Admitted requests can
additionally fail on purpose, deterministically from ``seed``:

* ``failure_rate``: that share of admitted requests answers ``500``;
* ``partial_failure_rate``: that share answers ``200 {"failed": [indexes]}`` and stores only
  the other entries;
* ``poison_field``: a request containing an object whose field of that name is true answers
  ``400`` (the whole request is refused, as real APIs do);
* ``lost_ack_rate``: that share of admitted requests stores its records, then answers ``500``
  (the acknowledgement is lost: the client sends them again).

With ``dedup_field`` (a record field) or ``dedup_header`` (a request header, for one-record
requests) the server stores a record only the first time its key arrives and counts the
others as ``duplicate_records``; a record without a key is stored (and counted as
``unkeyed_records``).

Accepted requests take ``latency_ms`` before the answer. ``GET /stats`` returns the counters,
``POST /reset`` clears them. Run it in a thread (:class:`ThrottlingServer`), or in its own
process (:func:`serve_in_subprocess`) when the client's CPU use must not disturb it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["BackgroundServer", "ServerStats", "ThrottlingServer", "serve_in_subprocess"]

DEFAULT_BURST_SECONDS = 0.05
PARTIAL_FAILURE_ENTRY_SHARE = 0.3


@dataclass
class ServerStats:
    """Counters of one server since start or the last reset."""

    requests: int = 0
    accepted_requests: int = 0
    rejected_requests: int = 0  # 429
    failed_requests: int = 0  # 500
    partially_failed_requests: int = 0
    poison_requests: int = 0  # 400
    accepted_records: int = 0
    lost_acks: int = 0  # stored, then answered 500
    duplicate_records: int = 0  # with dedup: a key seen before
    unkeyed_records: int = 0  # with dedup: no key
    first_request_time: float | None = None
    last_request_time: float | None = None


@dataclass
class _Settings:
    capacity: float | None
    burst: float
    latency_s: float
    failure_rate: float
    partial_failure_rate: float
    poison_field: str | None
    keep_records: bool
    seed: int
    lost_ack_rate: float = 0.0
    dedup_field: str | None = None
    dedup_header: str | None = None


@dataclass
class _State:
    settings: _Settings
    rng: random.Random
    tokens: float
    last_refill: float
    stats: ServerStats = field(default_factory=ServerStats)
    records: list[dict[str, Any]] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _make_app(state: _State) -> web.Application:
    settings = state.settings

    def admit(now: float) -> float | None:
        """Take a token; return None when admitted, else the seconds until the next token."""
        if settings.capacity is None:
            return None
        state.tokens = min(
            settings.burst, state.tokens + (now - state.last_refill) * settings.capacity
        )
        state.last_refill = now
        if state.tokens >= 1.0:
            state.tokens -= 1.0
            return None
        return (1.0 - state.tokens) / settings.capacity

    async def ingest(request: web.Request) -> web.Response:
        body = await request.read()
        now = time.monotonic()
        with state.lock:
            stats = state.stats
            stats.requests += 1
            if stats.first_request_time is None:
                stats.first_request_time = now
            stats.last_request_time = now
            wait = admit(now)
            if wait is not None:
                stats.rejected_requests += 1
        if wait is not None:
            return web.json_response(
                {"error": "over capacity"},
                status=429,
                headers={
                    "Retry-After": str(max(1, math.ceil(wait))),
                    "Retry-After-Ms": str(max(1, math.ceil(wait * 1000))),
                },
            )
        try:
            records = json.loads(body)
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
            return web.json_response({"error": "expected a JSON array of objects"}, status=400)
        if settings.latency_s:
            await asyncio.sleep(settings.latency_s)
        with state.lock:
            stats = state.stats
            roll = state.rng.random()
            if roll < settings.failure_rate:
                stats.failed_requests += 1
                return web.json_response({"error": "injected failure"}, status=500)
            if settings.poison_field is not None and any(
                r.get(settings.poison_field) for r in records
            ):
                stats.poison_requests += 1
                return web.json_response({"error": "poison record"}, status=400)
            failed: list[int] = []
            if records and roll < settings.failure_rate + settings.partial_failure_rate:
                failed = [
                    i
                    for i in range(len(records))
                    if state.rng.random() < PARTIAL_FAILURE_ENTRY_SHARE
                ] or [state.rng.randrange(len(records))]
                stats.partially_failed_requests += 1
            skip = set(failed)
            stored = _first_arrivals(
                state, [r for i, r in enumerate(records) if i not in skip], request.headers
            )
            stats.accepted_requests += 1
            stats.accepted_records += len(stored)
            if settings.keep_records:
                state.records.extend(stored)
            lost = not failed and state.rng.random() < settings.lost_ack_rate
            if lost:
                stats.lost_acks += 1
        if lost:
            return web.json_response({"error": "injected failure after storing"}, status=500)
        if failed:
            return web.json_response({"failed": failed})
        return web.Response(status=200)

    async def get_stats(request: web.Request) -> web.Response:
        with state.lock:
            return web.json_response(asdict(state.stats))

    async def reset(request: web.Request) -> web.Response:
        with state.lock:
            state.stats = ServerStats()
            state.records = []
            state.keys = set()
        return web.Response(status=204)

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/ingest", ingest)
    app.router.add_get("/stats", get_stats)
    app.router.add_post("/reset", reset)
    return app


def _first_arrivals(
    state: _State, records: list[dict[str, Any]], headers: Any
) -> list[dict[str, Any]]:
    """Those of ``records`` whose key has not arrived before (all without dedup); counts the
    duplicates and the records without a key. Call with the lock held."""
    settings, stats = state.settings, state.stats
    if settings.dedup_field is None and settings.dedup_header is None:
        return records
    first = []
    for record in records:
        if settings.dedup_header is not None:
            key = headers.get(settings.dedup_header)
        else:
            key = record.get(settings.dedup_field)
        if key is None:
            stats.unkeyed_records += 1
        elif str(key) in state.keys:
            stats.duplicate_records += 1
            continue
        else:
            state.keys.add(str(key))
        first.append(record)
    return first


class BackgroundServer:
    """Serves an aiohttp application from a background thread on 127.0.0.1 and a free port."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start serving; returns once the port is bound."""
        loop = asyncio.new_event_loop()
        started = threading.Event()
        errors: list[BaseException] = []

        async def serve() -> None:
            runner = web.AppRunner(self._app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self._runner = runner
            self.port = int(runner.addresses[0][1])

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(serve())
            except BaseException as err:
                errors.append(err)
                return
            finally:
                started.set()
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="test-http-server", daemon=True)
        self._thread.start()
        started.wait(timeout=30)
        if errors:
            raise errors[0]

    def stop(self) -> None:
        """Stop serving and join the thread."""
        loop, thread, runner = self._loop, self._thread, self._runner
        if loop is None or thread is None:
            return
        if runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
        self._loop = self._thread = self._runner = None


class ThrottlingServer:
    """The server in a background thread of this process, on 127.0.0.1 and a free port.

    Args:
        capacity: requests per second admitted; ``None`` admits everything.
        burst: tokens the bucket holds (default: 50 ms of capacity, at least 1).
        latency_ms: delay of every admitted request.
        failure_rate: share of admitted requests that answer 500.
        partial_failure_rate: share of admitted requests that report some entries failed.
        poison_field: records with this field true make their request answer 400.
        keep_records: store accepted records (turn off for long benchmarks).
        seed: seeds the injected failures.
        lost_ack_rate: share of admitted requests stored and then answered 500.
        dedup_field, dedup_header: deduplicate records by this field, or by this header of
            one-record requests (see the module docstring).
    """

    def __init__(
        self,
        *,
        capacity: float | None = None,
        burst: float | None = None,
        latency_ms: float = 0.0,
        failure_rate: float = 0.0,
        partial_failure_rate: float = 0.0,
        poison_field: str | None = "poison",
        keep_records: bool = True,
        seed: int = 0,
        lost_ack_rate: float = 0.0,
        dedup_field: str | None = None,
        dedup_header: str | None = None,
    ) -> None:
        if capacity is not None and burst is None:
            burst = max(1.0, capacity * DEFAULT_BURST_SECONDS)
        settings = _Settings(
            capacity=capacity,
            burst=burst or 1.0,
            latency_s=latency_ms / 1000.0,
            failure_rate=failure_rate,
            partial_failure_rate=partial_failure_rate,
            poison_field=poison_field,
            keep_records=keep_records,
            seed=seed,
            lost_ack_rate=lost_ack_rate,
            dedup_field=dedup_field,
            dedup_header=dedup_header,
        )
        self._state = _State(
            settings=settings,
            rng=random.Random(seed),
            tokens=settings.burst,
            last_refill=time.monotonic(),
        )
        self._server = BackgroundServer(_make_app(self._state))

    @property
    def port(self) -> int:
        """The bound port (0 before :meth:`start`)."""
        return self._server.port

    @property
    def url(self) -> str:
        """The ingestion endpoint."""
        return f"{self._server.base_url}/ingest"

    @property
    def records(self) -> list[dict[str, Any]]:
        """A copy of every accepted record, in arrival order (duplicates included)."""
        with self._state.lock:
            return list(self._state.records)

    @property
    def stats(self) -> ServerStats:
        """A copy of the counters."""
        with self._state.lock:
            return ServerStats(**asdict(self._state.stats))

    def reset(self) -> None:
        """Clear counters and records (the token bucket keeps its level)."""
        with self._state.lock:
            self._state.stats = ServerStats()
            self._state.records = []
            self._state.keys = set()

    def start(self) -> ThrottlingServer:
        """Start serving; returns once the port is bound."""
        self._server.start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        self._server.stop()

    def __enter__(self) -> ThrottlingServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@contextlib.contextmanager
def serve_in_subprocess(**kwargs: Any) -> Iterator[str]:
    """Run a :class:`ThrottlingServer` in its own Python process; yields its base URL
    (``http://127.0.0.1:<port>``; POST ``/ingest``, GET ``/stats``, POST ``/reset``).

    Args:
        **kwargs: the keyword arguments of :class:`ThrottlingServer` (plain values).
    """
    process = subprocess.Popen(
        [sys.executable, "-m", __name__, json.dumps(kwargs)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # the child prints its port once it listens
        if not line.strip().isdigit():
            raise RuntimeError(f"the throttling server did not start (printed {line!r})")
        yield f"http://127.0.0.1:{int(line)}"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _main(arguments: list[str]) -> None:
    server = ThrottlingServer(**json.loads(arguments[0])).start()
    print(server.port, flush=True)
    try:
        threading.Event().wait()  # until the parent terminates this process
    finally:
        server.stop()


if __name__ == "__main__":
    _main(sys.argv[1:])
