"""A second rate limiting strategy: pace requests at the rate the destination accepts.

AIMD limits *how many entries are in flight* and halves that window on every failed request, so
against a destination with a request-rate quota it oscillates in a saw-tooth: it overshoots the
quota, collects a burst of rejections, halves (shrinking batches as well, since the window caps
the batch size), and climbs back 10 entries per request. Most of the time it is either above the
quota (rejections) or well below it (lost goodput).

:class:`PacingRateLimitingStrategy` controls the *request rate* instead, which is what quotas
limit:

* it sends full batches, spaced ``1 / rate`` apart, with at most ``max_in_flight_requests``
  outstanding;
* on throttling (or a ``Retry-After``, or latency inflation when enabled) it measures the rate
  the destination actually *accepted* over the last ``estimation_window_s`` and sets its rate a
  little below that (``headroom``), but never cuts more than ``max_decrease`` at once (a stall
  of the destination makes the accepted rate look low for a moment), and it reacts at most
  once per round trip: results of requests sent before the last reduction are ignored, as TCP
  does;
* while no throttling is seen it first returns towards the capacity it last measured (time
  constant 0.5 s, so it spends most of its time just under it rather than far below), then
  probes beyond it multiplicatively, with a gain that doubles every second without congestion
  (to find capacity that was added) and a ceiling of twice the accepted rate (so that a sender
  that was idle does not build up a rate it never tested);
* a ``Retry-After`` additionally holds back the next request until the time the destination
  asked for.
"""

from __future__ import annotations

import math
from collections import deque

from framework.asyncsink._config import AsyncSinkWriterConfig
from framework.asyncsink._ratelimit import RequestInfo, ResultInfo
from framework.errors import ConfigurationError

__all__ = [
    "DEFAULT_PACING_ESTIMATION_WINDOW_S",
    "DEFAULT_PACING_HEADROOM",
    "DEFAULT_PACING_MAX_DECREASE",
    "DEFAULT_PACING_PROBE_GAIN",
    "PacingRateLimitingStrategy",
]

DEFAULT_PACING_HEADROOM = 0.05
DEFAULT_PACING_MAX_DECREASE = 0.2
DEFAULT_PACING_PROBE_GAIN = 0.05
DEFAULT_PACING_ESTIMATION_WINDOW_S = 1.0
DEFAULT_PACING_MIN_RATE = 1.0
# Below this many accepted requests in the window the accepted rate is too noisy to trust; the
# strategy then halves the rate it observed itself sending instead.
_MIN_SAMPLES = 4
_MIN_SPAN_S = 0.01
_MAX_PROBE_GAIN = 1.0
# After a cut the rate returns towards the capacity last measured with this time constant, and
# probes beyond it once within this share of it.
_RECOVERY_TIME_S = 0.5
_NEAR_CAPACITY = 0.995


class PacingRateLimitingStrategy:
    """Paces full-size requests at just under the rate the destination is seen to accept.

    Congestion signals: a throttled result (``ResultInfo.throttled``), a ``Retry-After``, and,
    when ``latency_factor`` is set, a request slower than ``latency_factor`` times the fastest one
    in the estimation window (for destinations that queue instead of rejecting). Entries that
    failed without throttling (``failed_messages`` alone) are not congestion: a 10% random
    failure rate should not throttle the sender.

    Args:
        max_in_flight_requests: most requests outstanding at once.
        max_batch_size: the batch size returned by :meth:`get_max_batch_size`; batches are kept
            full because quotas usually count requests, not entries.
        initial_rate: starting requests per second; ``None`` starts unpaced (only the
            in-flight cap applies) until the first congestion signal.
        headroom: after congestion the rate is set to ``(1 - headroom)`` times the accepted
            rate.
        max_decrease: the largest cut of one reaction, as a fraction of the current rate
            (sustained overload is still left within a few round trips).
        probe_gain: relative rate increase per second beyond the last measured capacity while
            no congestion is seen (doubling every further second, up to 100% per second).
        estimation_window_s: how far back accepted requests are counted.
        min_rate: the rate never falls below this (requests per second).
        latency_factor: treat a request slower than this multiple of the window's fastest as
            congestion; ``None`` (default) disables the latency signal.

    Raises:
        ConfigurationError: a parameter is out of range.
    """

    def __init__(
        self,
        *,
        max_in_flight_requests: int,
        max_batch_size: int,
        initial_rate: float | None = None,
        headroom: float = DEFAULT_PACING_HEADROOM,
        max_decrease: float = DEFAULT_PACING_MAX_DECREASE,
        probe_gain: float = DEFAULT_PACING_PROBE_GAIN,
        estimation_window_s: float = DEFAULT_PACING_ESTIMATION_WINDOW_S,
        min_rate: float = DEFAULT_PACING_MIN_RATE,
        latency_factor: float | None = None,
    ) -> None:
        if max_in_flight_requests <= 0:
            raise ConfigurationError(
                f"max_in_flight_requests must be positive, got {max_in_flight_requests}"
            )
        if max_batch_size <= 0:
            raise ConfigurationError(f"max_batch_size must be positive, got {max_batch_size}")
        if initial_rate is not None and not (initial_rate > 0 and math.isfinite(initial_rate)):
            raise ConfigurationError(
                f"initial_rate must be a positive number of requests per second, or None to "
                f"start unpaced; got {initial_rate!r}"
            )
        if not 0 <= headroom < 1:
            raise ConfigurationError(f"headroom must be in [0, 1), got {headroom!r}")
        if not 0 < max_decrease < 1:
            raise ConfigurationError(f"max_decrease must be in (0, 1), got {max_decrease!r}")
        if not 0 < probe_gain <= _MAX_PROBE_GAIN:
            raise ConfigurationError(f"probe_gain must be in (0, 1], got {probe_gain!r}")
        if not (estimation_window_s > 0 and math.isfinite(estimation_window_s)):
            raise ConfigurationError(
                f"estimation_window_s must be a positive number of seconds, "
                f"got {estimation_window_s!r}"
            )
        if not (min_rate > 0 and math.isfinite(min_rate)):
            raise ConfigurationError(f"min_rate must be positive, got {min_rate!r}")
        if latency_factor is not None and not latency_factor > 1:
            raise ConfigurationError(
                f"latency_factor must be greater than 1 (or None to disable), "
                f"got {latency_factor!r}"
            )
        self._max_in_flight_requests = max_in_flight_requests
        self._max_batch_size = max_batch_size
        self._headroom = headroom
        self._max_decrease = max_decrease
        self._base_probe_gain = probe_gain
        self._window_s = estimation_window_s
        self._min_rate = min_rate
        self._latency_factor = latency_factor

        self._rate = math.inf if initial_rate is None else float(initial_rate)
        self._next_send_time = -math.inf
        self._in_flight_requests = 0
        self._first_send_time: float | None = None
        self._send_times: deque[float] = deque()
        self._accepted_times: deque[float] = deque()
        self._latencies: deque[tuple[float, float]] = deque()
        self._last_reduction_time = -math.inf
        self._capacity_estimate: float | None = None
        self._last_probe_time: float | None = None
        self._probe_gain = probe_gain
        self._last_gain_doubling: float | None = None

    @classmethod
    def from_config(
        cls,
        config: AsyncSinkWriterConfig,
        *,
        initial_rate: float | None = None,
        headroom: float = DEFAULT_PACING_HEADROOM,
        max_decrease: float = DEFAULT_PACING_MAX_DECREASE,
        probe_gain: float = DEFAULT_PACING_PROBE_GAIN,
        estimation_window_s: float = DEFAULT_PACING_ESTIMATION_WINDOW_S,
        min_rate: float = DEFAULT_PACING_MIN_RATE,
        latency_factor: float | None = None,
    ) -> PacingRateLimitingStrategy:
        """A strategy using the writer's in-flight cap and batch size; usable as a factory
        (wrap it in ``functools.partial`` to change the other parameters)."""
        return cls(
            max_in_flight_requests=config.max_in_flight_requests,
            max_batch_size=config.max_batch_size,
            initial_rate=initial_rate,
            headroom=headroom,
            max_decrease=max_decrease,
            probe_gain=probe_gain,
            estimation_window_s=estimation_window_s,
            min_rate=min_rate,
            latency_factor=latency_factor,
        )

    @property
    def rate(self) -> float:
        """Current pace in requests per second (``inf`` while unpaced)."""
        return self._rate

    @property
    def in_flight_limit(self) -> float:
        """The current pace in requests per second, for the writer's metrics."""
        return self._rate

    def register_in_flight_request(self, request: RequestInfo) -> None:
        """See :class:`~framework.asyncsink.RateLimitingStrategy`."""
        now = request.request_start_time
        self._in_flight_requests += 1
        if self._first_send_time is None:
            self._first_send_time = now
        self._send_times.append(now)
        if math.isfinite(self._rate):
            interval = 1.0 / self._rate
            # Allow catching up one interval (timer wake-ups are late), never a whole burst.
            self._next_send_time = max(self._next_send_time, now - interval) + interval

    def register_completed_request(self, result: ResultInfo) -> None:
        """See :class:`~framework.asyncsink.RateLimitingStrategy`."""
        now = result.completion_time
        self._in_flight_requests = max(0, self._in_flight_requests - 1)
        self._trim(now)
        congested = result.throttled or result.retry_after_s is not None
        if not result.throttled:
            self._accepted_times.append(now)
            if self._latency_factor is not None:
                congested = congested or self._latency_inflated(result.latency_s)
                self._latencies.append((now, result.latency_s))
        if result.retry_after_s is not None and result.retry_after_s > 0:
            self._next_send_time = max(self._next_send_time, now + result.retry_after_s)
        # A request sent before the last reduction reports on the old rate: ignore it.
        if result.request_start_time < self._last_reduction_time:
            return
        if congested:
            self._reduce(now)
        elif math.isfinite(self._rate):
            self._probe(now)

    def should_block(self, request: RequestInfo) -> bool:
        """See :class:`~framework.asyncsink.RateLimitingStrategy`."""
        return (
            self._in_flight_requests >= self._max_in_flight_requests
            or request.request_start_time < self._next_send_time
        )

    def seconds_until_unblocked(self, request: RequestInfo) -> float:
        """See :class:`~framework.asyncsink.SupportsUnblockTime`."""
        if self._in_flight_requests >= self._max_in_flight_requests:
            return 0.0
        return max(0.0, self._next_send_time - request.request_start_time)

    def get_max_batch_size(self) -> int:
        """See :class:`~framework.asyncsink.RateLimitingStrategy`."""
        return self._max_batch_size

    def _trim(self, now: float) -> None:
        horizon = now - self._window_s
        for times in (self._send_times, self._accepted_times):
            while times and times[0] < horizon:
                times.popleft()
        while self._latencies and self._latencies[0][0] < horizon:
            self._latencies.popleft()

    def _span(self, now: float) -> float:
        start = now - self._window_s
        if self._first_send_time is not None:
            start = max(start, self._first_send_time)
        return max(now - start, _MIN_SPAN_S)

    def _accepted_rate(self, now: float) -> float | None:
        if len(self._accepted_times) < _MIN_SAMPLES:
            return None
        return len(self._accepted_times) / self._span(now)

    def _latency_inflated(self, latency_s: float) -> bool:
        if self._latency_factor is None or not self._latencies:
            return False
        fastest = min(latency for _, latency in self._latencies)
        return fastest > 0 and latency_s > self._latency_factor * fastest

    def _reduce(self, now: float) -> None:
        accepted = self._accepted_rate(now)
        if accepted is not None:
            self._capacity_estimate = accepted
            target = accepted * (1.0 - self._headroom)
        else:
            target = 0.5 * len(self._send_times) / self._span(now)
        if math.isfinite(self._rate):
            target = max(target, self._rate * (1.0 - self._max_decrease))
        self._rate = max(self._min_rate, min(self._rate, target))
        self._last_reduction_time = now
        self._last_probe_time = now
        self._probe_gain = self._base_probe_gain
        self._last_gain_doubling = now

    def _probe(self, now: float) -> None:
        if self._last_probe_time is None or self._last_gain_doubling is None:
            self._last_probe_time = self._last_gain_doubling = now
            return
        elapsed = now - self._last_probe_time
        self._last_probe_time = now
        capacity = self._capacity_estimate
        if capacity is not None and self._rate < capacity * _NEAR_CAPACITY:
            # Return quickly towards the capacity last measured, slowing down as it nears it:
            # most of the time is spent just under the capacity, not far below it.
            self._rate = capacity - (capacity - self._rate) * math.exp(-elapsed / _RECOVERY_TIME_S)
            self._probe_gain = self._base_probe_gain
            self._last_gain_doubling = now
            return
        if now - self._last_gain_doubling >= 1.0:
            self._probe_gain = min(_MAX_PROBE_GAIN, self._probe_gain * 2)
            self._last_gain_doubling = now
        rate = self._rate * math.exp(self._probe_gain * elapsed)
        accepted = self._accepted_rate(now)
        if accepted is not None:
            # Never run far ahead of what was actually tested against the destination.
            rate = min(rate, max(self._rate, 2.0 * accepted))
        self._rate = rate
