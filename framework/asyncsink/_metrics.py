"""Writer metrics, readable from Python at any time and logged per request and per flush."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WriterMetrics"]


@dataclass(frozen=True, kw_only=True, slots=True)
class WriterMetrics:
    """A consistent snapshot of one writer's counters.

    Attributes:
        current_send_time_ms: duration of the most recently completed request, successful or
            not (Flink's ``currentSendTime``).
        num_records_out: entries the destination accepted. Each entry counts once, however
            often it was retried (Flink counts retries again).
        num_bytes_out: total ``size_in_bytes`` of those entries, each counted once.
        num_requests: requests sent, including retries and the sub-requests that isolate a
            poison record.
        num_failed_requests: requests that failed entirely or in part.
        num_throttled_requests: requests the destination refused for capacity.
        num_retries: entry re-sends scheduled (an entry retried three times counts three).
        num_dead_lettered: entries handed to the dead-letter queue.
        current_in_flight_limit: the rate limiting strategy's current limit (in-flight entries
            for AIMD, requests per second for pacing), or ``None`` if it does not expose one.
        in_flight_requests: requests awaiting an answer now.
        buffered_entries: entries held now, including those waiting for a retry.
    """

    current_send_time_ms: float = 0.0
    num_records_out: int = 0
    num_bytes_out: int = 0
    num_requests: int = 0
    num_failed_requests: int = 0
    num_throttled_requests: int = 0
    num_retries: int = 0
    num_dead_lettered: int = 0
    current_in_flight_limit: float | None = None
    in_flight_requests: int = 0
    buffered_entries: int = 0


class _Counters:
    """The mutable counters behind :class:`WriterMetrics`; touched only on the event loop."""

    __slots__ = (
        "current_send_time_ms",
        "num_bytes_out",
        "num_dead_lettered",
        "num_failed_requests",
        "num_records_out",
        "num_requests",
        "num_retries",
        "num_throttled_requests",
    )

    def __init__(self) -> None:
        self.current_send_time_ms = 0.0
        self.num_records_out = 0
        self.num_bytes_out = 0
        self.num_requests = 0
        self.num_failed_requests = 0
        self.num_throttled_requests = 0
        self.num_retries = 0
        self.num_dead_lettered = 0
