"""Pluggable rate limiting (FLIP-242) and Flink's default: congestion control with AIMD.

The writer consults its :class:`RateLimitingStrategy` before every request::

    info = RequestInfo(batch_size=min(max_batch_size, strategy.get_max_batch_size(), buffered), ..)
    if not strategy.should_block(info):
        strategy.register_in_flight_request(info)
        ... send ...
        strategy.register_completed_request(ResultInfo(...))

Strategies are stateful and belong to exactly one writer; a sink therefore holds a *factory*
(:data:`RateLimitingStrategyFactory`) and every writer builds its own strategy on the executor.
Strategies never read a clock: times come in through :class:`RequestInfo` and
:class:`ResultInfo` (the writer's event-loop clock, in seconds), which keeps them deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from framework.asyncsink._config import AsyncSinkWriterConfig
from framework.errors import ConfigurationError

__all__ = [
    "DEFAULT_AIMD_DECREASE_FACTOR",
    "DEFAULT_AIMD_INCREASE_RATE",
    "AIMDScalingStrategy",
    "CongestionControlRateLimitingStrategy",
    "RateLimitingStrategy",
    "RateLimitingStrategyFactory",
    "RequestInfo",
    "ResultInfo",
    "ScalingStrategy",
    "SupportsInFlightLimit",
    "SupportsUnblockTime",
]

DEFAULT_AIMD_INCREASE_RATE = 10
DEFAULT_AIMD_DECREASE_FACTOR = 0.5


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """A request about to be sent (or just sent).

    Attributes:
        batch_size: number of entries in the request.
        request_start_time: the writer's clock (seconds) when the request is considered.
    """

    batch_size: int
    request_start_time: float


@dataclass(frozen=True, slots=True)
class ResultInfo:
    """A request that completed, successfully or not.

    Attributes:
        batch_size: number of entries the request carried.
        failed_messages: entries that will be retried (a partial failure or a retryable error).
            Entries rejected fatally are not counted: a poison record says nothing about
            congestion.
        request_start_time: the writer's clock (seconds) when the request was sent.
        latency_s: how long the request took.
        throttled: the destination said it is over capacity (HTTP 429/503, Kinesis
            ProvisionedThroughputExceeded, ...).
        retry_after_s: how long the destination asked the client to wait, if it said.
    """

    batch_size: int
    failed_messages: int
    request_start_time: float
    latency_s: float
    throttled: bool = False
    retry_after_s: float | None = None

    @property
    def completion_time(self) -> float:
        """The writer's clock when the request completed."""
        return self.request_start_time + self.latency_s


class RateLimitingStrategy(Protocol):
    """Decides when the writer may send and how large a request may be (FLIP-242).

    Implementations must be cheap (they run for every request on the event loop) and must not
    block while nothing is in flight unless they also implement :class:`SupportsUnblockTime`;
    otherwise the writer re-checks :meth:`should_block` after a short poll interval.
    """

    def register_in_flight_request(self, request: RequestInfo) -> None:
        """A request of ``request.batch_size`` entries was just sent."""
        ...

    def register_completed_request(self, result: ResultInfo) -> None:
        """A request completed; adapt the limits to its outcome."""
        ...

    def should_block(self, request: RequestInfo) -> bool:
        """Whether ``request`` must wait (it is sent once this returns False)."""
        ...

    def get_max_batch_size(self) -> int:
        """The largest request the strategy allows now (the writer also caps it by config)."""
        ...


@runtime_checkable
class SupportsUnblockTime(Protocol):
    """Optional: a strategy that blocks for time-based reasons says when it will unblock."""

    def seconds_until_unblocked(self, request: RequestInfo) -> float:
        """Seconds from ``request.request_start_time`` until ``request`` may be sent, if nothing
        completes meanwhile; 0 when only a completion can unblock it."""
        ...


@runtime_checkable
class SupportsInFlightLimit(Protocol):
    """Optional: a strategy that exposes its current limit for the writer's metrics."""

    @property
    def in_flight_limit(self) -> float:
        """The current limit (entries in flight, or requests per second for pacing)."""
        ...


RateLimitingStrategyFactory = Callable[[AsyncSinkWriterConfig], RateLimitingStrategy]
"""Builds a fresh strategy for one writer from its config. Must pickle (e.g. a class method,
a module-level function or a ``functools.partial`` of one)."""


class ScalingStrategy(Protocol):
    """How a limit grows after success and shrinks after failure."""

    def scale_up(self, current: int) -> int:
        """The limit after a successful request."""
        ...

    def scale_down(self, current: int) -> int:
        """The limit after a failed request."""
        ...


@dataclass(frozen=True, kw_only=True, slots=True)
class AIMDScalingStrategy:
    """Additive increase, multiplicative decrease, as in Flink and TCP.

    ``scale_up(x) = min(x + increase_rate, rate_threshold)`` and
    ``scale_down(x) = max(1, round_half_up(x * decrease_factor))``.

    Attributes:
        increase_rate: added after each successful request (Flink default 10).
        decrease_factor: multiplier after each failed request, in (0, 1) (Flink default 0.5).
        rate_threshold: the ceiling of the limit.

    Raises:
        ConfigurationError: a parameter is out of range.
    """

    rate_threshold: int
    increase_rate: int = DEFAULT_AIMD_INCREASE_RATE
    decrease_factor: float = DEFAULT_AIMD_DECREASE_FACTOR

    def __post_init__(self) -> None:
        if isinstance(self.increase_rate, bool) or not isinstance(self.increase_rate, int):
            raise ConfigurationError(f"increase_rate must be an int, got {self.increase_rate!r}")
        if self.increase_rate <= 0:
            raise ConfigurationError(
                f"increase_rate must be positive, got {self.increase_rate}; "
                f"a limit that never grows cannot recover after throttling"
            )
        if not 0 < self.decrease_factor < 1:
            raise ConfigurationError(
                f"decrease_factor must lie strictly between 0 and 1, got {self.decrease_factor}"
            )
        if isinstance(self.rate_threshold, bool) or not isinstance(self.rate_threshold, int):
            raise ConfigurationError(f"rate_threshold must be an int, got {self.rate_threshold!r}")
        if self.rate_threshold <= 0:
            raise ConfigurationError(f"rate_threshold must be positive, got {self.rate_threshold}")

    def scale_up(self, current: int) -> int:
        """See :class:`ScalingStrategy`."""
        return min(current + self.increase_rate, self.rate_threshold)

    def scale_down(self, current: int) -> int:
        """See :class:`ScalingStrategy`. Rounds half up, like Java's ``Math.round``."""
        return max(1, int(current * self.decrease_factor + 0.5))


class CongestionControlRateLimitingStrategy:
    """Limits the number of entries in flight with a scaling strategy (Flink's default).

    The limit on in-flight entries (the congestion window) starts at
    ``initial_max_in_flight_messages``, is scaled up after every request without failed entries
    and scaled down after every request with some; it also caps the batch size. A request is
    blocked while ``max_in_flight_requests`` are in flight or while it would push the entries in
    flight past the window.

    Args:
        max_in_flight_requests: most requests in flight.
        initial_max_in_flight_messages: the starting window.
        scaling_strategy: how the window grows and shrinks.

    Raises:
        ConfigurationError: a limit is not positive.
    """

    def __init__(
        self,
        *,
        max_in_flight_requests: int,
        initial_max_in_flight_messages: int,
        scaling_strategy: ScalingStrategy,
    ) -> None:
        if max_in_flight_requests <= 0:
            raise ConfigurationError(
                f"max_in_flight_requests must be positive, got {max_in_flight_requests}"
            )
        if initial_max_in_flight_messages <= 0:
            raise ConfigurationError(
                f"initial_max_in_flight_messages must be positive, "
                f"got {initial_max_in_flight_messages}"
            )
        self._max_in_flight_requests = max_in_flight_requests
        self._scaling = scaling_strategy
        self._max_in_flight_messages = initial_max_in_flight_messages
        self._in_flight_requests = 0
        self._in_flight_messages = 0

    @classmethod
    def from_config(cls, config: AsyncSinkWriterConfig) -> CongestionControlRateLimitingStrategy:
        """Flink's defaults: window starts at one batch, AIMD(+10, x0.5) capped at
        ``max_batch_size * max_in_flight_requests``."""
        return cls(
            max_in_flight_requests=config.max_in_flight_requests,
            initial_max_in_flight_messages=config.max_batch_size,
            scaling_strategy=AIMDScalingStrategy(
                rate_threshold=config.max_batch_size * config.max_in_flight_requests
            ),
        )

    @property
    def in_flight_limit(self) -> float:
        """The current congestion window, in entries."""
        return float(self._max_in_flight_messages)

    def register_in_flight_request(self, request: RequestInfo) -> None:
        """See :class:`RateLimitingStrategy`."""
        self._in_flight_requests += 1
        self._in_flight_messages += request.batch_size

    def register_completed_request(self, result: ResultInfo) -> None:
        """See :class:`RateLimitingStrategy`."""
        self._in_flight_requests = max(0, self._in_flight_requests - 1)
        self._in_flight_messages = max(0, self._in_flight_messages - result.batch_size)
        if result.failed_messages > 0:
            self._max_in_flight_messages = self._scaling.scale_down(self._max_in_flight_messages)
        else:
            self._max_in_flight_messages = self._scaling.scale_up(self._max_in_flight_messages)

    def should_block(self, request: RequestInfo) -> bool:
        """See :class:`RateLimitingStrategy`."""
        return (
            self._in_flight_requests >= self._max_in_flight_requests
            or self._in_flight_messages + request.batch_size > self._max_in_flight_messages
        )

    def get_max_batch_size(self) -> int:
        """See :class:`RateLimitingStrategy`."""
        return self._max_in_flight_messages
