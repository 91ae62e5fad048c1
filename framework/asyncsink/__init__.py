"""At-least-once asynchronous sinks for destinations without transactions (FLIP-171, FLIP-242).

A destination subclasses :class:`AsyncSinkWriter` (two methods: ``submit_request_entries`` and
``size_in_bytes``) and :class:`AsyncSink` (builds the writer on the executor). The writer
buffers entries under the six buffering hints of :class:`AsyncSinkWriterConfig`, retries failed
entries with capped, jittered exponential backoff (:class:`RetryPolicy`), classifies errors with
an :class:`ErrorClassifier`, paces requests with a pluggable :class:`RateLimitingStrategy`, and
diverts poison records to an optional :class:`DeadLetterQueue`; :class:`IdempotencyKeys` stamps
every record with a key its redeliveries keep, for destinations that deduplicate.

This package imports neither pyspark nor deltalake.
"""

from framework.asyncsink._classify import (
    DEFAULT_ERROR_CLASSIFIER,
    ErrorClassification,
    ErrorClassifier,
    TypeErrorClassifier,
)
from framework.asyncsink._config import AsyncSinkWriterConfig, RetryPolicy
from framework.asyncsink._converter import ElementConverter
from framework.asyncsink._deadletter import (
    AsyncSinkDeadLetterQueue,
    DeadLetter,
    DeadLetterQueue,
    DeadLetterWriter,
    JsonLinesDeadLetterQueue,
)
from framework.asyncsink._idempotency import DEFAULT_KEY_FIELD, IdempotencyKeys
from framework.asyncsink._json import json_default
from framework.asyncsink._metrics import WriterMetrics
from framework.asyncsink._pacing import PacingRateLimitingStrategy
from framework.asyncsink._ratelimit import (
    AIMDScalingStrategy,
    CongestionControlRateLimitingStrategy,
    RateLimitingStrategy,
    RateLimitingStrategyFactory,
    RequestInfo,
    ResultInfo,
    ScalingStrategy,
    SupportsInFlightLimit,
    SupportsUnblockTime,
)
from framework.asyncsink._sink import AsyncSink, AsyncSinkTaskWriter, Row
from framework.asyncsink._state import (
    BufferedRequestState,
    BufferedRequestStateSerializer,
    BytesEntrySerializer,
    EntrySerializer,
    RequestEntryWrapper,
)
from framework.asyncsink._writer import AsyncSinkWriter, PartialFailure

__all__ = [
    "DEFAULT_ERROR_CLASSIFIER",
    "DEFAULT_KEY_FIELD",
    "AIMDScalingStrategy",
    "AsyncSink",
    "AsyncSinkDeadLetterQueue",
    "AsyncSinkTaskWriter",
    "AsyncSinkWriter",
    "AsyncSinkWriterConfig",
    "BufferedRequestState",
    "BufferedRequestStateSerializer",
    "BytesEntrySerializer",
    "CongestionControlRateLimitingStrategy",
    "DeadLetter",
    "DeadLetterQueue",
    "DeadLetterWriter",
    "ElementConverter",
    "EntrySerializer",
    "ErrorClassification",
    "ErrorClassifier",
    "IdempotencyKeys",
    "JsonLinesDeadLetterQueue",
    "PacingRateLimitingStrategy",
    "PartialFailure",
    "RateLimitingStrategy",
    "RateLimitingStrategyFactory",
    "RequestEntryWrapper",
    "RequestInfo",
    "ResultInfo",
    "RetryPolicy",
    "Row",
    "ScalingStrategy",
    "SupportsInFlightLimit",
    "SupportsUnblockTime",
    "TypeErrorClassifier",
    "WriterMetrics",
    "json_default",
]
