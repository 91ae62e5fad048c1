"""Buffering hints and the retry policy of an :class:`AsyncSinkWriter`.

Both are frozen, keyword-only dataclasses validated at construction: a bad value raises
:class:`~framework.errors.ConfigurationError` before anything is buffered or sent. The retry
policy is configuration only (in milliseconds, the unit of the other hints): the writer runs it
as the framework's :class:`~framework.retry.Backoff`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from framework.errors import ConfigurationError
from framework.retry import Backoff

__all__ = [
    "DEFAULT_BACKOFF_MULTIPLIER",
    "DEFAULT_INITIAL_BACKOFF_MS",
    "DEFAULT_JITTER",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_BACKOFF_MS",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_BATCH_SIZE_IN_BYTES",
    "DEFAULT_MAX_BUFFERED_REQUESTS",
    "DEFAULT_MAX_IN_FLIGHT_REQUESTS",
    "DEFAULT_MAX_RECORD_SIZE_IN_BYTES",
    "DEFAULT_MAX_RETRY_AFTER_MS",
    "DEFAULT_MAX_TIME_IN_BUFFER_MS",
    "DEFAULT_REQUEST_TIMEOUT_MS",
    "AsyncSinkWriterConfig",
    "RetryPolicy",
]

DEFAULT_MAX_BATCH_SIZE = 500
DEFAULT_MAX_IN_FLIGHT_REQUESTS = 50
DEFAULT_MAX_BUFFERED_REQUESTS = 10_000
DEFAULT_MAX_BATCH_SIZE_IN_BYTES = 5 * 1024 * 1024
DEFAULT_MAX_TIME_IN_BUFFER_MS = 5_000
DEFAULT_MAX_RECORD_SIZE_IN_BYTES = 1024 * 1024
DEFAULT_REQUEST_TIMEOUT_MS = 30_000

DEFAULT_MAX_ATTEMPTS = 10
DEFAULT_INITIAL_BACKOFF_MS = 100.0
DEFAULT_MAX_BACKOFF_MS = 10_000.0
DEFAULT_BACKOFF_MULTIPLIER = 2.0
DEFAULT_JITTER = 0.5
DEFAULT_MAX_RETRY_AFTER_MS = 60_000.0


def _require_positive_int(name: str, value: object, hint: str = "") -> None:
    # bool is an int subclass; True as a batch size is always a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive integer, got {value!r}{hint}")


def _require_positive_number(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigurationError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True, kw_only=True, slots=True)
class AsyncSinkWriterConfig:
    """The six buffering hints of FLIP-171 plus a per-request timeout.

    Attributes:
        max_batch_size: most entries in one request to the destination.
        max_in_flight_requests: most requests awaiting an answer at once; a hard cap that the rate
            limiting strategy can only lower.
        max_buffered_requests: most entries held in the buffer (including entries waiting for a
            retry). ``write`` blocks while the buffer is full: that is the back-pressure.
            Must be greater than ``max_batch_size`` so that a full batch can form while the
            writer keeps accepting input.
        max_batch_size_in_bytes: a request is sent once the buffered entries reach this size, and
            no request is larger (except a single entry, bounded by the record size).
        max_time_in_buffer_ms: while the buffer is not empty, a (possibly partial) batch is sent
            at least this often.
        max_record_size_in_bytes: an entry larger than this is rejected with
            :class:`~framework.errors.RecordTooLargeError` (or dead-lettered, when a dead-letter
            queue is configured). At most ``max_batch_size_in_bytes``.
        request_timeout_ms: a request that has not completed after this long is abandoned and
            counts as a retryable failure. It may still have reached the destination, so a retry
            can duplicate its entries (at-least-once).

    Raises:
        ConfigurationError: a value is out of range; the message names the option and the fix.
    """

    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    max_in_flight_requests: int = DEFAULT_MAX_IN_FLIGHT_REQUESTS
    max_buffered_requests: int = DEFAULT_MAX_BUFFERED_REQUESTS
    max_batch_size_in_bytes: int = DEFAULT_MAX_BATCH_SIZE_IN_BYTES
    max_time_in_buffer_ms: int = DEFAULT_MAX_TIME_IN_BUFFER_MS
    max_record_size_in_bytes: int = DEFAULT_MAX_RECORD_SIZE_IN_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS

    def __post_init__(self) -> None:
        _require_positive_int("max_batch_size", self.max_batch_size)
        _require_positive_int("max_in_flight_requests", self.max_in_flight_requests)
        _require_positive_int("max_buffered_requests", self.max_buffered_requests)
        _require_positive_int("max_batch_size_in_bytes", self.max_batch_size_in_bytes)
        _require_positive_int("max_time_in_buffer_ms", self.max_time_in_buffer_ms)
        _require_positive_int("max_record_size_in_bytes", self.max_record_size_in_bytes)
        _require_positive_int("request_timeout_ms", self.request_timeout_ms)
        if self.max_buffered_requests <= self.max_batch_size:
            raise ConfigurationError(
                f"max_buffered_requests ({self.max_buffered_requests}) must be greater than "
                f"max_batch_size ({self.max_batch_size}): the buffer has to hold a full batch "
                f"while accepting more input; raise max_buffered_requests or lower max_batch_size"
            )
        if self.max_record_size_in_bytes > self.max_batch_size_in_bytes:
            raise ConfigurationError(
                f"max_record_size_in_bytes ({self.max_record_size_in_bytes}) must not exceed "
                f"max_batch_size_in_bytes ({self.max_batch_size_in_bytes}): a record has to fit "
                f"in one request; lower max_record_size_in_bytes or raise max_batch_size_in_bytes"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How often and how patiently failed entries are sent again.

    The delay before the n-th retry is ``d = min(max_backoff_ms, initial_backoff_ms *
    backoff_multiplier ** (n - 1))``, of which the fraction ``jitter`` is randomised:
    ``d * (1 - jitter) + uniform(0, d * jitter)``. When the destination says how long to wait
    (``Retry-After``), the delay is at least that, capped at ``max_retry_after_ms`` so that a
    misbehaving destination cannot stall the job for hours. Refusals for capacity (throttling)
    count in ``n`` only when the destination did not say how long to wait.

    Attributes:
        max_attempts: the retry budget of each entry: how many times it may fail, the first
            attempt included. An entry that fails this many times is dead-lettered, or fails the
            job with :class:`~framework.errors.RetriesExhaustedError`. Throttling (the
            destination refusing for capacity) does not count: it lengthens the backoff and
            slows the job down, but never dead-letters a good record.
        initial_backoff_ms: delay before the first retry, before jitter.
        max_backoff_ms: cap of the exponential delay.
        backoff_multiplier: growth of the delay per failed attempt (>= 1).
        jitter: fraction of the delay that is random, from 0 (none) to 1 ("full jitter").
        max_retry_after_ms: the longest ``Retry-After`` honoured.

    Raises:
        ConfigurationError: a value is out of range.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_backoff_ms: float = DEFAULT_INITIAL_BACKOFF_MS
    max_backoff_ms: float = DEFAULT_MAX_BACKOFF_MS
    backoff_multiplier: float = DEFAULT_BACKOFF_MULTIPLIER
    jitter: float = DEFAULT_JITTER
    max_retry_after_ms: float = DEFAULT_MAX_RETRY_AFTER_MS

    def __post_init__(self) -> None:
        _require_positive_int(
            "max_attempts", self.max_attempts, " (1 means: never retry, dead-letter at once)"
        )
        initial = _require_positive_number("initial_backoff_ms", self.initial_backoff_ms)
        maximum = _require_positive_number("max_backoff_ms", self.max_backoff_ms)
        if maximum < initial:
            raise ConfigurationError(
                f"max_backoff_ms ({self.max_backoff_ms}) must be at least initial_backoff_ms "
                f"({self.initial_backoff_ms}); raise max_backoff_ms or lower initial_backoff_ms"
            )
        multiplier = _require_positive_number("backoff_multiplier", self.backoff_multiplier)
        if multiplier < 1:
            raise ConfigurationError(
                f"backoff_multiplier must be >= 1 so that delays never shrink, "
                f"got {self.backoff_multiplier!r}"
            )
        if (
            isinstance(self.jitter, bool)
            or not isinstance(self.jitter, int | float)
            or not 0 <= self.jitter <= 1
        ):
            raise ConfigurationError(
                f"jitter must be a fraction between 0 (no jitter) and 1 (full jitter), "
                f"got {self.jitter!r}"
            )
        _require_positive_number("max_retry_after_ms", self.max_retry_after_ms)

    def backoff(self) -> Backoff:
        """This policy as the framework's :class:`~framework.retry.Backoff` (seconds), which
        the writer runs: the n-th retry is its retry number ``n - 1``; no deadline (each entry
        has its attempt budget instead)."""
        return Backoff(
            max_attempts=self.max_attempts,
            initial_delay=self.initial_backoff_ms / 1000.0,
            max_delay=self.max_backoff_ms / 1000.0,
            multiplier=self.backoff_multiplier,
            jitter=self.jitter,
            deadline=None,
            max_retry_after=self.max_retry_after_ms / 1000.0,
        )

    def backoff_s(
        self, failed_attempts: int, rng: random.Random, retry_after_s: float | None = None
    ) -> float:
        """Delay in seconds before sending an entry again after ``failed_attempts`` failures
        (>= 1), at least the destination's ``retry_after_s``: :meth:`Backoff.delay`."""
        return self.backoff().delay(max(0, failed_attempts - 1), rng, retry_after_s)
