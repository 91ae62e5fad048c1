"""Backoff and the verdicts on a failed call."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

__all__ = ["Backoff", "Classifier", "ErrorClassification", "Verdict"]

#: Defaults of :class:`Backoff`.
DEFAULT_MAX_ATTEMPTS = 6
DEFAULT_INITIAL_DELAY = 0.1
DEFAULT_MAX_DELAY = 5.0
DEFAULT_MULTIPLIER = 2.0
DEFAULT_DEADLINE = 120.0


class Verdict(enum.Enum):
    """What to do about one failed call.

    * ``RETRY``: transient, and repeating the call is safe (it did not take effect, or it is
      idempotent);
    * ``UNKNOWN``: the call may or may not have taken effect (a dropped connection after a
      non-idempotent request was sent, a commit whose answer was lost). Never repeated blindly:
      :func:`~framework.retry.commit_with_reconciliation` first asks whether it landed;
    * ``FAIL``: permanent (access denied, bad input): raised at once.
    """

    RETRY = "retry"
    UNKNOWN = "unknown"
    FAIL = "fail"


Classifier = Callable[[BaseException], Verdict]


@dataclass(frozen=True, slots=True)
class ErrorClassification:
    """The verdict on one failed request of an async writer (several entries at once).

    Attributes:
        retryable: send the entries again (within their retry budget); otherwise they are
            rejected for good (dead-lettered, or the job fails).
        throttled: the destination said it is over capacity; the rate limiting strategy hears it.
        retry_after_s: how long the destination asked to wait, if it said.
        caused_by_entries: for a fatal error, whether some entries of the request caused it, so
            that splitting the request isolates them for the dead-letter queue. A fatal error
            not caused by entries fails the job even with a dead-letter queue.
    """

    retryable: bool
    throttled: bool = False
    retry_after_s: float | None = None
    caused_by_entries: bool = False


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Capped exponential backoff, in seconds.

    The delay before retry number n (n = 0, 1, ...) is ``d = min(max_delay, initial_delay *
    multiplier ** n)``, of which the fraction ``jitter`` is random: ``d * (1 - jitter) +
    uniform(0, d * jitter)`` (``jitter=1``: full jitter, uniform in ``[0, d]``). When the
    destination says how long to wait (``Retry-After``), the delay is at least that, capped at
    ``max_retry_after``.

    Attributes:
        max_attempts: attempts in all, the first included.
        deadline: a loop (:func:`~framework.retry.retry_call`) stops retrying when the next
            sleep would end more than this many seconds after its first attempt; ``None``: no
            deadline.
        max_retry_after: the longest ``Retry-After`` honoured; ``None``: no cap.

    Raises:
        ValueError: on construction, for a non-positive attempt count, negative delays, a
            multiplier below 1, a jitter outside ``[0, 1]`` or a non-positive deadline.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_delay: float = DEFAULT_INITIAL_DELAY
    max_delay: float = DEFAULT_MAX_DELAY
    multiplier: float = DEFAULT_MULTIPLIER
    jitter: float = 1.0
    deadline: float | None = DEFAULT_DEADLINE
    max_retry_after: float | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_delay < 0 or self.max_delay < self.initial_delay:
            raise ValueError(
                f"need 0 <= initial_delay <= max_delay, got {self.initial_delay}, {self.max_delay}"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"jitter must be between 0 and 1, got {self.jitter}")
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline must be positive or None, got {self.deadline}")
        if self.max_retry_after is not None and self.max_retry_after <= 0:
            raise ValueError(
                f"max_retry_after must be positive or None, got {self.max_retry_after}"
            )

    def cap(self, retry_number: int) -> float:
        """The delay before retry number ``retry_number`` (0-based), before jitter."""
        # Compare exponents first so huge retry numbers cannot overflow a float.
        if retry_number > 64:
            return self.max_delay
        return min(self.max_delay, self.initial_delay * self.multiplier**retry_number)

    def delay(
        self, retry_number: int, rng: random.Random, retry_after: float | None = None
    ) -> float:
        """The jittered sleep before retry number ``retry_number`` (0-based), at least the
        destination's ``retry_after`` (capped at ``max_retry_after``)."""
        cap = self.cap(retry_number)
        delay = cap * (1.0 - self.jitter) + rng.random() * cap * self.jitter
        return max(delay, self.capped_retry_after(retry_after))

    def capped_retry_after(self, retry_after: float | None) -> float:
        """``retry_after`` limited to ``max_retry_after``; 0 when absent or not positive."""
        if retry_after is None or retry_after <= 0:
            return 0.0
        if self.max_retry_after is None:
            return retry_after
        return min(retry_after, self.max_retry_after)

    def delays(self, rng: random.Random) -> Iterator[float]:
        """The jittered sleeps between the attempts of one loop: ``max_attempts - 1`` values."""
        for n in range(self.max_attempts - 1):
            yield self.delay(n, rng)
