"""KinesisSink: at-least-once delivery of rows to an Amazon Kinesis data stream (FLIP-171's
example destination), through ``PutRecords`` on an async AWS client (aiobotocore).

Each row becomes one record: its JSON encoding as data, and a partition key taken from a column
or, by default, derived from the data (so a retried record lands on the same shard). A
``PutRecords`` answer lists per record whether it failed; failed records are re-queued, and
``ProvisionedThroughputExceededException`` among them is reported to the rate limiting strategy
as throttling. Errors of the whole call are classified by their AWS error code (never by their
message): throttling and internal errors are retried, validation errors are fatal for the
records, and a missing stream or denied access fails the job.

Example::

    sink = KinesisSink("clicks", region_name="eu-west-1", partition_key_field="user_id")
    TwoPhaseSink(sink).write_stream(df, checkpoint_location="/chk/clicks")
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from framework.asyncsink import (
    DEFAULT_ERROR_CLASSIFIER,
    AsyncSink,
    AsyncSinkWriter,
    AsyncSinkWriterConfig,
    BufferedRequestState,
    BufferedRequestStateSerializer,
    DeadLetterQueue,
    ElementConverter,
    ErrorClassification,
    ErrorClassifier,
    IdempotencyKeys,
    PartialFailure,
    RateLimitingStrategyFactory,
    RetryPolicy,
    Row,
    json_default,
)
from framework.errors import (
    ConfigurationError,
    InputError,
    RetryableDeliveryError,
    UnsupportedTypeError,
)
from framework.sink import VersionedSerializer, WriterContext

__all__ = [
    "DEFAULT_KINESIS_CONFIG",
    "KINESIS_MAX_BATCH_SIZE",
    "KINESIS_MAX_BATCH_SIZE_IN_BYTES",
    "KINESIS_MAX_RECORD_SIZE_IN_BYTES",
    "KinesisErrorClassifier",
    "KinesisJsonConverter",
    "KinesisRecord",
    "KinesisRecordSerializer",
    "KinesisSink",
    "KinesisSinkWriter",
]

# PutRecords limits (AWS documentation): 500 records, 5 MiB per call, 1 MiB per record
# (data plus partition key), partition keys of 1 to 256 characters.
KINESIS_MAX_BATCH_SIZE = 500
KINESIS_MAX_BATCH_SIZE_IN_BYTES = 5 * 1024 * 1024
KINESIS_MAX_RECORD_SIZE_IN_BYTES = 1024 * 1024
KINESIS_MAX_PARTITION_KEY_LENGTH = 256

# Flink's Kinesis Data Streams sink defaults.
DEFAULT_KINESIS_CONFIG = AsyncSinkWriterConfig(
    max_batch_size=KINESIS_MAX_BATCH_SIZE,
    max_in_flight_requests=50,
    max_buffered_requests=10_000,
    max_batch_size_in_bytes=KINESIS_MAX_BATCH_SIZE_IN_BYTES,
    max_time_in_buffer_ms=5_000,
    max_record_size_in_bytes=KINESIS_MAX_RECORD_SIZE_IN_BYTES,
)

_STREAM_NAME = re.compile(r"[a-zA-Z0-9_.-]{1,128}")

THROTTLING_ERROR_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "LimitExceededException",
        "KMSThrottlingException",
        "RequestLimitExceeded",
    }
)
RETRYABLE_ERROR_CODES = frozenset(
    {
        "InternalFailure",
        "InternalServerError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
# The records themselves are invalid: splitting the request isolates them.
RECORD_ERROR_CODES = frozenset({"ValidationException", "InvalidArgumentException"})


class KinesisRecord(NamedTuple):
    """One PutRecords entry."""

    data: bytes
    partition_key: str


class KinesisJsonConverter:
    """Encodes a row as JSON data with a partition key.

    Args:
        partition_key_field: column whose value (as text) is the partition key; ``None``
            derives a key from the data's CRC-32, spreading rows over shards deterministically.
    """

    def __init__(self, partition_key_field: str | None = None) -> None:
        self.partition_key_field = partition_key_field

    def apply(self, element: Row, context: WriterContext | None) -> KinesisRecord:
        """Convert one row.

        Raises:
            UnsupportedTypeError: a value cannot be encoded as JSON.
            InputError: the partition key column is missing, null or longer than 256 characters.
        """
        try:
            data = json.dumps(element, separators=(",", ":"), default=json_default).encode()
        except TypeError as err:
            raise UnsupportedTypeError(f"row cannot be encoded as JSON: {err}") from err
        field = self.partition_key_field
        if field is None:
            return KinesisRecord(data, format(zlib.crc32(data), "08x"))
        value = element.get(field)
        if value is None:
            raise InputError(f"partition key column {field!r} is missing or null in a row")
        key = str(value)
        if not 0 < len(key) <= KINESIS_MAX_PARTITION_KEY_LENGTH:
            raise InputError(
                f"partition key {key[:40]!r}... must have 1 to "
                f"{KINESIS_MAX_PARTITION_KEY_LENGTH} characters, has {len(key)}"
            )
        return KinesisRecord(data, key)


class KinesisRecordSerializer:
    """Stores a :class:`KinesisRecord` as key length, key (UTF-8) and data."""

    _KEY_LENGTH = struct.Struct(">H")

    def serialize(self, entry: KinesisRecord) -> bytes:
        """The bytes of ``entry``."""
        key = entry.partition_key.encode()
        return self._KEY_LENGTH.pack(len(key)) + key + entry.data

    def deserialize(self, data: bytes) -> KinesisRecord:
        """The record :meth:`serialize` wrote."""
        (length,) = self._KEY_LENGTH.unpack_from(data, 0)
        start = self._KEY_LENGTH.size
        key = data[start : start + length].decode()
        return KinesisRecord(data[start + length :], key)


@dataclass(frozen=True)
class KinesisErrorClassifier:
    """Classifies AWS errors by their error code, the rest as :data:`DEFAULT_ERROR_CLASSIFIER`.

    Throttling codes are retried and reported as throttling; internal errors and any 5xx are
    retried; ``ValidationException`` / ``InvalidArgumentException`` are fatal for the records;
    any other code (missing stream, denied access, KMS problems) is fatal for the job.
    botocore's connection and timeout errors are retried.

    Attributes:
        fallback: the classifier for non-AWS errors.
    """

    fallback: ErrorClassifier = DEFAULT_ERROR_CLASSIFIER

    def classify(self, error: BaseException) -> ErrorClassification:
        """See :class:`~framework.asyncsink.ErrorClassifier`."""
        from botocore.exceptions import ClientError, HTTPClientError
        from botocore.exceptions import ConnectionError as BotocoreConnectionError

        if isinstance(error, ClientError):
            details = error.response.get("Error", {})
            code = str(details.get("Code", ""))
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code in THROTTLING_ERROR_CODES:
                return ErrorClassification(retryable=True, throttled=True)
            if code in RETRYABLE_ERROR_CODES or status >= 500:
                return ErrorClassification(retryable=True)
            return ErrorClassification(
                retryable=False, caused_by_entries=code in RECORD_ERROR_CODES
            )
        if isinstance(error, BotocoreConnectionError | HTTPClientError):
            return ErrorClassification(retryable=True)
        return self.fallback.classify(error)


class KinesisSink(AsyncSink[KinesisRecord]):
    """At-least-once sink that writes rows to a Kinesis data stream.

    Picklable: it holds the stream name and plain client options; each task creates its own
    aiobotocore client (credentials from the usual AWS chain on the executor, unless given in
    ``client_options``). botocore's own retries are disabled: the writer retries with backoff.

    Args:
        stream_name: the data stream.
        region_name: AWS region (else from the environment).
        endpoint_url: a non-AWS endpoint (e.g. a local emulator).
        client_options: further keyword arguments of ``create_client`` (plain values).
        partition_key_field: column used as partition key (see :class:`KinesisJsonConverter`).
        config: buffering hints; :data:`DEFAULT_KINESIS_CONFIG` (Flink's) by default. Must stay
            within the PutRecords limits.
        retry_policy: retry budget and backoff.
        rate_limiting: factory of each writer's rate limiting strategy (AIMD by default).
        error_classifier: :class:`KinesisErrorClassifier` by default.
        dead_letter_queue: where rejected records go; ``None`` fails the job instead.
        element_converter: row to :class:`KinesisRecord`; overrides ``partition_key_field``.
        app_id: application identity reported with dead letters.
        idempotency_keys: stamp every row with a key that its redeliveries keep, a field of its
            JSON data (:class:`~framework.asyncsink.IdempotencyKeys`), for consumers that
            deduplicate by it.

    Raises:
        ConfigurationError: an invalid stream name, or limits beyond what PutRecords accepts.
    """

    def __init__(
        self,
        stream_name: str,
        *,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        client_options: Mapping[str, Any] | None = None,
        partition_key_field: str | None = None,
        config: AsyncSinkWriterConfig | None = None,
        retry_policy: RetryPolicy | None = None,
        rate_limiting: RateLimitingStrategyFactory | None = None,
        error_classifier: ErrorClassifier | None = None,
        dead_letter_queue: DeadLetterQueue | None = None,
        element_converter: ElementConverter[Row, KinesisRecord] | None = None,
        app_id: str | None = None,
        idempotency_keys: IdempotencyKeys | None = None,
    ) -> None:
        if not isinstance(stream_name, str) or not _STREAM_NAME.fullmatch(stream_name):
            raise ConfigurationError(
                f"stream_name must be 1 to 128 letters, digits, '_', '.' or '-', "
                f"got {stream_name!r}"
            )
        config = config if config is not None else DEFAULT_KINESIS_CONFIG
        for name, value, limit in (
            ("max_batch_size", config.max_batch_size, KINESIS_MAX_BATCH_SIZE),
            (
                "max_batch_size_in_bytes",
                config.max_batch_size_in_bytes,
                KINESIS_MAX_BATCH_SIZE_IN_BYTES,
            ),
            (
                "max_record_size_in_bytes",
                config.max_record_size_in_bytes,
                KINESIS_MAX_RECORD_SIZE_IN_BYTES,
            ),
        ):
            if value > limit:
                raise ConfigurationError(
                    f"{name} is {value}, but Kinesis PutRecords accepts at most {limit}; "
                    f"lower {name}"
                )
        options = dict(client_options or {})
        if region_name is not None:
            options["region_name"] = region_name
        if endpoint_url is not None:
            options["endpoint_url"] = endpoint_url
        super().__init__(
            element_converter=(
                element_converter
                if element_converter is not None
                else KinesisJsonConverter(partition_key_field)
            ),
            config=config,
            retry_policy=retry_policy,
            rate_limiting=rate_limiting,
            error_classifier=(
                error_classifier if error_classifier is not None else KinesisErrorClassifier()
            ),
            dead_letter_queue=dead_letter_queue,
            app_id=app_id,
            idempotency_keys=idempotency_keys,
        )
        self.stream_name = stream_name
        self.client_options = options

    def create_async_writer(
        self,
        context: WriterContext | None,
        initial_state: Sequence[BufferedRequestState[KinesisRecord]] = (),
    ) -> KinesisSinkWriter:
        """See :meth:`framework.asyncsink.AsyncSink.create_async_writer`."""
        return KinesisSinkWriter(
            stream_name=self.stream_name,
            client_options=self.client_options,
            **self.writer_kwargs(context, initial_state),
        )

    def state_serializer(self) -> VersionedSerializer[BufferedRequestState[KinesisRecord]]:
        """Records are stored as key and data bytes."""
        return BufferedRequestStateSerializer(KinesisRecordSerializer())

    def __repr__(self) -> str:
        # client_options may carry credentials: never print them.
        return f"KinesisSink({self.stream_name!r})"


class KinesisSinkWriter(AsyncSinkWriter[Row, KinesisRecord]):
    """The writer of :class:`KinesisSink`; one aiobotocore client per writer, opened lazily.

    Args:
        stream_name: the data stream.
        client_options: keyword arguments of aiobotocore's ``create_client``.
        **kwargs: passed to :class:`~framework.asyncsink.AsyncSinkWriter`.
    """

    def __init__(
        self, *, stream_name: str, client_options: Mapping[str, Any] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._stream_name = stream_name
        self._client_options = dict(client_options or {})
        self._client: Any = None
        self._client_lock: asyncio.Lock | None = None
        self._exit_stack: contextlib.AsyncExitStack | None = None

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        if self._client_lock is None:
            self._client_lock = asyncio.Lock()
        async with self._client_lock:
            if self._client is None:
                from aiobotocore.config import AioConfig
                from aiobotocore.session import get_session

                stack = contextlib.AsyncExitStack()
                options = dict(self._client_options)
                options.setdefault(
                    "config",
                    AioConfig(
                        # The writer retries with backoff and classification; botocore must not.
                        retries={"max_attempts": 0},
                        max_pool_connections=self.config.max_in_flight_requests,
                    ),
                )
                self._client = await stack.enter_async_context(
                    get_session().create_client("kinesis", **options)
                )
                self._exit_stack = stack
        return self._client

    async def put_records(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """One ``PutRecords`` call (a seam for tests that inject per-record failures)."""
        client = await self._get_client()
        response: dict[str, Any] = await client.put_records(
            StreamName=self._stream_name, Records=records
        )
        return response

    async def submit_request_entries(
        self, entries: list[KinesisRecord]
    ) -> PartialFailure[KinesisRecord]:
        """Send one PutRecords call and re-queue the records it marks as failed."""
        response = await self.put_records(
            [{"Data": entry.data, "PartitionKey": entry.partition_key} for entry in entries]
        )
        if not response.get("FailedRecordCount"):
            return PartialFailure(())
        results = response.get("Records", [])
        if len(results) != len(entries):
            # Which records failed is unknown; resending all of them is at-least-once safe.
            raise RetryableDeliveryError(
                f"PutRecords answered {len(results)} results for {len(entries)} records"
            )
        failed: list[KinesisRecord] = []
        throttled = False
        for entry, result in zip(entries, results, strict=True):
            code = result.get("ErrorCode")
            if code:
                failed.append(entry)
                throttled = throttled or code in THROTTLING_ERROR_CODES
        return PartialFailure(failed, throttled=throttled)

    def size_in_bytes(self, entry: KinesisRecord) -> int:
        """Data plus partition key, as Kinesis counts a record against its 1 MiB limit."""
        return len(entry.data) + len(entry.partition_key.encode())

    def describe_entry(self, entry: KinesisRecord) -> Any:
        """Partition key and base64 data, for the dead-letter queue."""
        return {
            "partition_key": entry.partition_key,
            "data_base64": base64.b64encode(entry.data).decode("ascii"),
        }

    async def release_resources(self) -> None:
        """Close the aiobotocore client."""
        if self._exit_stack is not None:
            await self._exit_stack.aclose()
        self._client = self._exit_stack = None
