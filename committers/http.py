"""HttpSink: at-least-once delivery of rows to an HTTP endpoint, as JSON arrays.

Each request is ``POST <url>`` with a JSON array of row objects. The answer decides the fate of
the entries:

* ``2xx``: all accepted, unless the body is ``{"failed": [indexes]}``: those entries (0-based
  positions in the array) are retried;
* ``429`` and ``503``: throttling; everything is retried after at least ``Retry-After``
  (``Retry-After-Ms`` is preferred when present, being more precise) and the rate limiting
  strategy is told;
* ``408`` and other ``5xx``, connection errors, timeouts: retried;
* ``401``, ``403``, ``404``, ``405``, ``407`` and redirects: the endpoint refuses any request, so
  the job fails (a dead-letter queue would only hide the misconfiguration);
* other ``4xx`` (``400``, ``413``, ``422``, ...): fatal for the entries; with a dead-letter queue
  the request is split until the offending entries are isolated and dead-lettered.

Delivery is at-least-once: a record may arrive again (a retried request that had landed, a
retried task, a replayed batch). With ``idempotency_keys=IdempotencyKeys()`` every record
carries a key its redeliveries keep (a field of its object, and with ``idempotency_header`` the
``Idempotency-Key`` header of one-record requests), so an endpoint that deduplicates by it
stores each record once.

Example::

    from framework import TwoPhaseSink
    from committers.http import HttpSink

    sink = HttpSink("https://ingest.example.com/events",
                    headers={"Authorization": "Bearer ..."},
                    dead_letter_queue=JsonLinesDeadLetterQueue("s3://bucket/dead-letters"))
    TwoPhaseSink(sink).write(df)
"""

from __future__ import annotations

import datetime
import email.utils
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from framework.asyncsink import (
    DEFAULT_ERROR_CLASSIFIER,
    AsyncSink,
    AsyncSinkWriter,
    AsyncSinkWriterConfig,
    BufferedRequestState,
    BufferedRequestStateSerializer,
    BytesEntrySerializer,
    DeadLetterQueue,
    ElementConverter,
    ErrorClassifier,
    IdempotencyKeys,
    RateLimitingStrategyFactory,
    RetryPolicy,
    Row,
    json_default,
)
from framework.errors import (
    ConfigurationError,
    FatalDeliveryError,
    RetryableDeliveryError,
    ThrottledError,
    UnsupportedTypeError,
)
from framework.sink import VersionedSerializer, WriterContext

__all__ = [
    "DEFAULT_HTTP_CONFIG",
    "HTTP_ERROR_CLASSIFIER",
    "IDEMPOTENCY_KEY_HEADER",
    "HttpSink",
    "HttpSinkWriter",
    "JsonRowConverter",
    "parse_retry_after",
]

DEFAULT_HTTP_CONFIG = AsyncSinkWriterConfig(
    max_batch_size=500,
    max_in_flight_requests=16,
    max_buffered_requests=10_000,
    max_batch_size_in_bytes=4 * 1024 * 1024,
    max_time_in_buffer_ms=1_000,
    max_record_size_in_bytes=1024 * 1024,
    request_timeout_ms=30_000,
)

IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
THROTTLING_STATUSES = frozenset({429, 503})
RETRYABLE_CLIENT_STATUSES = frozenset({408, 425})
# Statuses that refuse the request whatever it contains: a configuration problem, not poison.
REQUEST_REFUSED_STATUSES = frozenset({401, 403, 404, 405, 407})
_ERROR_BODY_PREVIEW = 300


HTTP_ERROR_CLASSIFIER: ErrorClassifier = DEFAULT_ERROR_CLASSIFIER.with_retryable(
    aiohttp.ClientConnectionError, aiohttp.ClientPayloadError
)
"""The default classifier plus aiohttp's connection and payload errors as retryable."""


class JsonRowConverter:
    """Encodes a row as a compact JSON object (UTF-8 bytes), the entry type of :class:`HttpSink`.

    Dates and times become ISO 8601 strings, decimals strings, binary base64.
    """

    def apply(self, element: Row, context: WriterContext | None) -> bytes:
        """Encode one row.

        Raises:
            UnsupportedTypeError: a value has a type JSON cannot represent.
        """
        try:
            return json.dumps(element, separators=(",", ":"), default=json_default).encode()
        except TypeError as err:
            raise UnsupportedTypeError(f"row cannot be encoded as JSON: {err}") from err


def parse_retry_after(
    headers: Mapping[str, str], now: datetime.datetime | None = None
) -> float | None:
    """Seconds the server asked to wait, from ``Retry-After-Ms`` or ``Retry-After``.

    ``Retry-After`` may be delta-seconds (decimals accepted) or an HTTP date. Unparseable or
    negative values are ignored (``None``), since a bad header must not stall delivery.
    """
    milliseconds = headers.get("Retry-After-Ms")
    if milliseconds is not None:
        try:
            value = float(milliseconds) / 1000.0
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("Retry-After")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        current = now or datetime.datetime.now(datetime.timezone.utc)
        return max(0.0, (when - current).total_seconds())
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


class HttpSink(AsyncSink[bytes]):
    """At-least-once sink that POSTs rows as JSON arrays to ``url``.

    Picklable: it holds only the URL, headers and plain configuration; each task opens its own
    ``aiohttp`` session on its own event loop.

    Args:
        url: the ``http://`` or ``https://`` endpoint.
        headers: extra request headers (e.g. authorization).
        config: buffering hints; :data:`DEFAULT_HTTP_CONFIG` by default.
        retry_policy: retry budget and backoff; :class:`RetryPolicy` defaults.
        rate_limiting: factory of each writer's rate limiting strategy; Flink's AIMD congestion
            control by default (``PacingRateLimitingStrategy.from_config`` suits endpoints with
            a request-rate quota better).
        error_classifier: which exceptions are retryable; :data:`HTTP_ERROR_CLASSIFIER`.
        dead_letter_queue: where rejected entries go; ``None`` fails the job instead.
        element_converter: row to JSON bytes; :class:`JsonRowConverter` by default.
        app_id: application identity reported with dead letters.
        idempotency_keys: stamp every row with a key that its redeliveries keep (request
            retries, task retries, batch replays), as the field ``idempotency_keys.field`` of
            its JSON object (:class:`~framework.asyncsink.IdempotencyKeys`), for an endpoint
            that deduplicates by it.
        idempotency_header: also send the key as the ``Idempotency-Key`` header; needs
            one-record requests (``config.max_batch_size=1``), since a request has one header.

    Raises:
        ConfigurationError: the URL or a header is invalid, or ``idempotency_header`` without
            ``idempotency_keys`` or with requests of more than one record.
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        config: AsyncSinkWriterConfig | None = None,
        retry_policy: RetryPolicy | None = None,
        rate_limiting: RateLimitingStrategyFactory | None = None,
        error_classifier: ErrorClassifier = HTTP_ERROR_CLASSIFIER,
        dead_letter_queue: DeadLetterQueue | None = None,
        element_converter: ElementConverter[Row, bytes] | None = None,
        app_id: str | None = None,
        idempotency_keys: IdempotencyKeys | None = None,
        idempotency_header: bool = False,
    ) -> None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"url must be an absolute http:// or https:// URL with a host, got {url!r}"
            )
        header_items = tuple((headers or {}).items())
        for name, value in header_items:
            if not isinstance(name, str) or not isinstance(value, str) or not name:
                raise ConfigurationError(
                    f"headers must map non-empty strings to strings, got {name!r}: {value!r}"
                )
            if "\n" in value or "\r" in value:
                raise ConfigurationError(f"header {name!r} contains a line break")
        super().__init__(
            element_converter=(
                element_converter if element_converter is not None else JsonRowConverter()
            ),
            config=config if config is not None else DEFAULT_HTTP_CONFIG,
            retry_policy=retry_policy,
            rate_limiting=rate_limiting,
            error_classifier=error_classifier,
            dead_letter_queue=dead_letter_queue,
            app_id=app_id,
            idempotency_keys=idempotency_keys,
        )
        if idempotency_header and (idempotency_keys is None or self.config.max_batch_size != 1):
            raise ConfigurationError(
                "idempotency_header=True sends each record's key as the Idempotency-Key header, "
                "so it needs idempotency_keys=IdempotencyKeys(...) and one-record requests "
                f"(config max_batch_size=1, got {self.config.max_batch_size}); or send the key "
                "in the records only (idempotency_header=False)"
            )
        self.url = url
        self.headers: tuple[tuple[str, str], ...] = header_items
        self.idempotency_header = idempotency_header

    def create_async_writer(
        self,
        context: WriterContext | None,
        initial_state: Sequence[BufferedRequestState[bytes]] = (),
    ) -> HttpSinkWriter:
        """See :meth:`framework.asyncsink.AsyncSink.create_async_writer`."""
        key_field = None
        if self.idempotency_header and self.idempotency_keys is not None:
            key_field = self.idempotency_keys.field
        return HttpSinkWriter(
            url=self.url,
            headers=dict(self.headers),
            key_header_field=key_field,
            **self.writer_kwargs(context, initial_state),
        )

    def state_serializer(self) -> VersionedSerializer[BufferedRequestState[bytes]]:
        """Entries are JSON bytes already: stored as they are."""
        return BufferedRequestStateSerializer(BytesEntrySerializer())

    def __repr__(self) -> str:
        # Headers may hold credentials: never print their values.
        return f"HttpSink({self.url!r}, headers={[name for name, _ in self.headers]!r})"


class HttpSinkWriter(AsyncSinkWriter[Row, bytes]):
    """The writer of :class:`HttpSink`; one ``aiohttp`` session per writer, opened lazily.

    Args:
        url: the endpoint.
        headers: extra request headers.
        key_header_field: send this field of each (one-record) request's entry as its
            ``Idempotency-Key`` header.
        **kwargs: passed to :class:`~framework.asyncsink.AsyncSinkWriter`.
    """

    def __init__(
        self,
        *,
        url: str,
        headers: Mapping[str, str] | None = None,
        key_header_field: str | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self._url = url
        self._key_header_field = key_header_field
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.config.max_in_flight_requests),
                # The writer enforces request_timeout_ms itself, around the whole request.
                timeout=aiohttp.ClientTimeout(total=None),
            )
        return self._session

    async def submit_request_entries(self, entries: list[bytes]) -> Sequence[bytes]:
        """POST the entries as one JSON array; see the module docstring for the outcomes."""
        body = b"[" + b",".join(entries) + b"]"
        sent = self._headers
        if self._key_header_field is not None:  # (one-record requests)
            key = json.loads(entries[0])[self._key_header_field]
            sent = {**sent, IDEMPOTENCY_KEY_HEADER: str(key)}
        async with self._client().post(
            self._url, data=body, headers=sent, allow_redirects=False
        ) as response:
            status = response.status
            payload = await response.read()
            headers = response.headers
        if 200 <= status < 300:
            return self._failed_entries(entries, payload)
        preview = payload[:_ERROR_BODY_PREVIEW].decode("utf-8", "replace")
        message = f"POST {self._url} answered {status}: {preview}"
        if status in THROTTLING_STATUSES:
            raise ThrottledError(message, retry_after_s=parse_retry_after(headers))
        if status >= 500 or status in RETRYABLE_CLIENT_STATUSES:
            raise RetryableDeliveryError(message, retry_after_s=parse_retry_after(headers))
        if 400 <= status < 500 and status not in REQUEST_REFUSED_STATUSES:
            raise FatalDeliveryError(message, caused_by_entries=True)
        raise FatalDeliveryError(message, caused_by_entries=False)

    @staticmethod
    def _failed_entries(entries: list[bytes], payload: bytes) -> Sequence[bytes]:
        if not payload.strip():
            return ()
        try:
            document = json.loads(payload)
        except ValueError:
            return ()  # a 2xx answer that is not JSON still accepts the batch
        if not isinstance(document, dict) or "failed" not in document:
            return ()
        failed = document["failed"]
        if not isinstance(failed, list) or not all(
            isinstance(index, int) and not isinstance(index, bool) and 0 <= index < len(entries)
            for index in failed
        ):
            # We cannot tell which entries failed; resending all of them is at-least-once safe.
            raise RetryableDeliveryError(
                f"the answer's 'failed' must list entry positions in [0, {len(entries)}), "
                f"got {str(failed)[:_ERROR_BODY_PREVIEW]}"
            )
        return [entries[index] for index in sorted(set(failed))]

    def size_in_bytes(self, entry: bytes) -> int:
        """The encoded size of the JSON object."""
        return len(entry)

    def sizes_in_bytes(self, entries: Sequence[bytes]) -> list[int]:
        """Vectorised :meth:`size_in_bytes`."""
        return list(map(len, entries))

    def describe_entry(self, entry: bytes) -> Any:
        """Dead letters carry the row itself, not its encoding."""
        try:
            return json.loads(entry)
        except ValueError:
            return entry.decode("utf-8", "replace")

    async def release_resources(self) -> None:
        """Close the aiohttp session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
