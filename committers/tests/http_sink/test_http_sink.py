"""HttpSink against real HTTP servers on 127.0.0.1: our throttling server and scripted ones.

The sink is driven through the same Sink API the Spark runtime uses (create_writer, write,
prepare_commit, close), without Spark. Retries use millisecond backoffs.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import functools
import json
import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import fsspec
import pyarrow as pa
import pytest
from aiohttp import web

from committers.http import (
    DEFAULT_HTTP_CONFIG,
    HttpSink,
    HttpSinkWriter,
    JsonRowConverter,
    parse_retry_after,
)
from committers.tests._async_helpers import run_sink_task
from committers.tests._throttling_server import BackgroundServer, ThrottlingServer
from framework.asyncsink import (
    AsyncSinkTaskWriter,
    AsyncSinkWriterConfig,
    JsonLinesDeadLetterQueue,
    PacingRateLimitingStrategy,
    RetryPolicy,
)
from framework.errors import (
    ConfigurationError,
    FatalDeliveryError,
    RetriesExhaustedError,
    UnsupportedTypeError,
)
from framework.sink import Epoch, WriterContext

CONTEXT = WriterContext(
    epoch=Epoch(app_id="http-test", epoch_id=0, writer_identity="w", run_id="r"),
    partition_id=0,
    attempt_number=0,
    task_attempt_id=1,
)
FAST_RETRIES = RetryPolicy(max_attempts=8, initial_backoff_ms=2, max_backoff_ms=20)
SMALL = AsyncSinkWriterConfig(
    max_batch_size=10,
    max_in_flight_requests=4,
    max_buffered_requests=100,
    max_time_in_buffer_ms=50,
    request_timeout_ms=2_000,
)


def rows(count: int, start: int = 0, **extra: Any) -> pa.RecordBatch:
    ids = list(range(start, start + count))
    columns: dict[str, Any] = {"id": ids, "name": [f"row-{i}" for i in ids]}
    for key, value in extra.items():
        columns[key] = [value] * count
    return pa.RecordBatch.from_pydict(columns)


def deliver(sink: HttpSink, *batches: pa.RecordBatch) -> AsyncSinkTaskWriter[bytes]:
    """Run one task: write every batch, flush, close. Returns the writer for its metrics."""
    return run_sink_task(sink, *batches, context=CONTEXT)


def metrics_of(writer: AsyncSinkTaskWriter[bytes]) -> Any:
    assert writer.async_writer is not None
    return writer.async_writer.metrics


@pytest.fixture
def server() -> Iterator[ThrottlingServer]:
    with ThrottlingServer() as running:
        yield running


class ScriptedServer:
    """Answers requests with scripted (status, headers, body) tuples, then 200; records each
    request's arrival time and JSON body."""

    def __init__(self, script: list[tuple[int, dict[str, str], Any]]) -> None:
        self.script = list(script)
        self.arrivals: list[float] = []
        self.bodies: list[list[dict[str, Any]]] = []
        self.lock = threading.Lock()
        app = web.Application()
        app.router.add_post("/ingest", self.handle)
        self.server = BackgroundServer(app)

    async def handle(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        with self.lock:
            self.arrivals.append(time.monotonic())
            self.bodies.append(body)
            status, headers, answer = self.script.pop(0) if self.script else (200, {}, None)
        if callable(answer):
            answer = await answer()
        text = answer if isinstance(answer, str) else json.dumps(answer) if answer else ""
        return web.Response(status=status, headers=headers, text=text)

    @property
    def url(self) -> str:
        return f"{self.server.base_url}/ingest"

    def ids(self, request: int) -> list[int]:
        return [row["id"] for row in self.bodies[request]]

    def __enter__(self) -> ScriptedServer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def sink_for(url: str, **kwargs: Any) -> HttpSink:
    kwargs.setdefault("config", SMALL)
    kwargs.setdefault("retry_policy", FAST_RETRIES)
    return HttpSink(url, **kwargs)


# ------------------------------------------------------------------------------ delivery


def test_every_row_is_delivered_exactly_once_when_nothing_fails(server: ThrottlingServer):
    writer = deliver(sink_for(server.url), rows(95), rows(30, start=95))
    received = server.records
    assert sorted(record["id"] for record in received) == list(range(125))
    assert received[0] == {"id": 0, "name": "row-0"}
    metrics = metrics_of(writer)
    assert (metrics.num_records_out, metrics.num_retries, metrics.num_requests) == (125, 0, 13)
    assert metrics.num_bytes_out == sum(len(json.dumps(r, separators=(",", ":"))) for r in received)


def test_throttled_requests_are_retried_until_every_row_is_in(server: ThrottlingServer):
    with ThrottlingServer(capacity=40, burst=2) as throttling:
        writer = deliver(sink_for(throttling.url), rows(200))
        stats = throttling.stats
        assert sorted(record["id"] for record in throttling.records) == list(range(200))
    # 429s never store anything, so there are no duplicates, and the writer saw them.
    assert stats.rejected_requests > 0
    assert stats.accepted_records == 200
    metrics = metrics_of(writer)
    assert metrics.num_throttled_requests == stats.rejected_requests
    assert metrics.num_records_out == 200


def test_the_pacing_strategy_delivers_everything_with_few_rejections():
    pacing = functools.partial(PacingRateLimitingStrategy.from_config, initial_rate=20.0)
    with ThrottlingServer(capacity=40, burst=2) as throttling:
        deliver(sink_for(throttling.url, rate_limiting=pacing), rows(300))
        stats = throttling.stats
        assert sorted(record["id"] for record in throttling.records) == list(range(300))
    assert stats.accepted_requests == 30
    assert stats.rejected_requests <= 3


def test_entries_listed_as_failed_in_a_2xx_answer_are_retried_alone():
    with ScriptedServer([(200, {}, {"failed": [1, 3]})]) as scripted:
        writer = deliver(sink_for(scripted.url), rows(5))
        assert scripted.ids(0) == [0, 1, 2, 3, 4]
        assert scripted.ids(1) == [1, 3]
    metrics = metrics_of(writer)
    assert (metrics.num_records_out, metrics.num_retries) == (5, 2)


def test_a_malformed_failed_list_resends_the_whole_request():
    with ScriptedServer([(200, {}, {"failed": [7]})]) as scripted:
        deliver(sink_for(scripted.url), rows(3))
        assert scripted.ids(1) == [0, 1, 2]


@pytest.mark.parametrize(
    ("status", "headers", "min_gap"),
    [
        (429, {"Retry-After-Ms": "150"}, 0.15),
        (503, {"Retry-After": "0.15"}, 0.15),
        (500, {}, 0.0),
        (408, {}, 0.0),
    ],
)
def test_throttling_and_server_errors_are_retried_honouring_retry_after(status, headers, min_gap):
    with ScriptedServer([(status, headers, {"error": "busy"})]) as scripted:
        writer = deliver(sink_for(scripted.url), rows(3))
        assert len(scripted.bodies) == 2
        assert scripted.ids(1) == [0, 1, 2]
        assert scripted.arrivals[1] - scripted.arrivals[0] >= min_gap - 0.005
    assert metrics_of(writer).num_throttled_requests == (1 if status in (429, 503) else 0)


def test_a_request_that_times_out_is_sent_again():
    # The first answer is held back until the retry has arrived, so that request always times
    # out; the retry is answered at once and has a whole second, ample on a loaded machine.
    async def answer_after_the_retry() -> dict[str, Any]:
        for _ in range(3_000):  # at most 30 s
            if len(scripted.bodies) > 1:
                break
            await asyncio.sleep(0.01)
        return {}

    config = AsyncSinkWriterConfig(
        max_batch_size=10, max_buffered_requests=100, request_timeout_ms=1_000
    )
    with ScriptedServer([(200, {}, answer_after_the_retry)]) as scripted:
        writer = deliver(sink_for(scripted.url, config=config), rows(2))
        assert [scripted.ids(0), scripted.ids(1)] == [[0, 1], [0, 1]]
        assert len(scripted.bodies) == 2
    assert metrics_of(writer).num_failed_requests == 1


def test_an_unreachable_endpoint_exhausts_the_retry_budget():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    policy = RetryPolicy(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=2)
    sink = sink_for(f"http://127.0.0.1:{port}/ingest", retry_policy=policy)
    with pytest.raises(RetriesExhaustedError, match=r"after 3 attempts.*ClientConnectorError"):
        deliver(sink, rows(2))


# --------------------------------------------------------------------- fatal and poison


def test_a_400_fails_the_job_with_the_status_and_body_when_there_is_no_queue():
    with (
        ScriptedServer([(400, {}, {"error": "field 'x' invalid"})]) as scripted,
        pytest.raises(FatalDeliveryError, match=r"answered 400: .*field 'x' invalid"),
    ):
        deliver(sink_for(scripted.url), rows(2))


def test_a_poison_record_lands_in_the_dead_letter_queue_and_the_rest_is_delivered(
    server: ThrottlingServer, tmp_path
):
    queue = JsonLinesDeadLetterQueue(str(tmp_path / "dlq"))
    batch = pa.RecordBatch.from_pylist(
        [{"id": i, "name": f"row-{i}", "poison": i == 13} for i in range(40)]
    )
    writer = deliver(sink_for(server.url, dead_letter_queue=queue), batch)
    assert sorted(record["id"] for record in server.records) == [i for i in range(40) if i != 13]
    fs = fsspec.filesystem("file")
    [path] = fs.glob(str(tmp_path / "dlq" / "*.jsonl"))
    [line] = [json.loads(text) for text in fs.cat(path).splitlines()]
    assert line["entry"] == {"id": 13, "name": "row-13", "poison": True}
    assert line["reason"] == "fatal"
    assert line["error_type"] == "framework.errors.FatalDeliveryError"
    assert "answered 400" in line["error"]
    assert line["app_id"] == "http-test"
    assert metrics_of(writer).num_dead_lettered == 1


def test_an_endpoint_refusing_every_request_fails_the_job_even_with_a_queue(tmp_path):
    queue = JsonLinesDeadLetterQueue(str(tmp_path / "dlq"))
    with ScriptedServer([(401, {}, {"error": "no token"})]) as scripted:
        with pytest.raises(FatalDeliveryError, match="answered 401"):
            deliver(sink_for(scripted.url, dead_letter_queue=queue), rows(4))
        assert len(scripted.bodies) == 1
    assert not (tmp_path / "dlq").exists()


# ------------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: HttpSink("ftp://host/x"), "absolute http:// or https:// URL"),
        (lambda: HttpSink("/relative/path"), "absolute http:// or https:// URL"),
        (lambda: HttpSink("http:///no-host"), "absolute http:// or https:// URL"),
        (lambda: HttpSink("http://h/x", headers={"X": "a\r\nb"}), "contains a line break"),
        (lambda: HttpSink("http://h/x", headers={"": "v"}), "non-empty strings"),
        (
            lambda: HttpSink(
                "http://h/x",
                config=AsyncSinkWriterConfig(max_batch_size=10, max_buffered_requests=10),
            ),
            "max_buffered_requests .* must be greater than max_batch_size",
        ),
        (
            lambda: HttpSink("http://h/x", retry_policy=RetryPolicy(max_attempts=0)),
            "max_attempts must be a positive integer",
        ),
        (
            lambda: HttpSink("http://h/x", dead_letter_queue=JsonLinesDeadLetterQueue("")),
            "non-empty fsspec URL",
        ),
    ],
)
def test_each_bad_configuration_is_rejected_at_construction(make: Callable[[], Any], message):
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_the_sink_pickles_without_clients_and_hides_header_values(tmp_path):
    sink = HttpSink(
        "https://ingest.example.com/v1",
        headers={"Authorization": "Bearer secret"},
        rate_limiting=functools.partial(PacingRateLimitingStrategy.from_config, headroom=0.1),
        dead_letter_queue=JsonLinesDeadLetterQueue(str(tmp_path)),
    )
    clone = pickle.loads(pickle.dumps(sink))
    assert clone.url == sink.url
    assert clone.headers == (("Authorization", "Bearer secret"),)
    assert isinstance(clone.rate_limiting(DEFAULT_HTTP_CONFIG), PacingRateLimitingStrategy)
    assert "secret" not in repr(sink)
    writer = clone.create_async_writer(None)
    assert isinstance(writer, HttpSinkWriter)


# ------------------------------------------------------------------------ parsing units


def test_parse_retry_after_prefers_milliseconds_and_accepts_dates():
    now = datetime.datetime(2026, 1, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
    assert parse_retry_after({"Retry-After-Ms": "250", "Retry-After": "1"}) == 0.25
    assert parse_retry_after({"Retry-After": "2"}) == 2.0
    assert parse_retry_after({"Retry-After": "0.5"}) == 0.5
    assert parse_retry_after({"Retry-After": "Thu, 01 Jan 2026 12:00:03 GMT"}, now) == 3.0
    assert parse_retry_after({"Retry-After": "Thu, 01 Jan 2026 11:00:00 GMT"}, now) == 0.0
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({"Retry-After": "-1"}) is None
    assert parse_retry_after({"Retry-After-Ms": "x", "Retry-After": "1"}) == 1.0
    assert parse_retry_after({}) is None


def test_the_json_converter_encodes_arrow_types_and_rejects_the_rest():
    converter = JsonRowConverter()
    row = {
        "at": datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc),
        "day": datetime.date(2026, 1, 2),
        "price": decimal.Decimal("9.99"),
        "blob": b"\x01\x02",
        "tags": ["a"],
    }
    assert json.loads(converter.apply(row, None)) == {
        "at": "2026-01-02T03:04:05+00:00",
        "day": "2026-01-02",
        "price": "9.99",
        "blob": "AQI=",
        "tags": ["a"],
    }
    with pytest.raises(UnsupportedTypeError, match="cannot be encoded as JSON"):
        converter.apply({"x": object()}, None)
