"""Capped, jittered exponential backoff, with the error classification passed in as a value.

Three verdicts a classifier can give an exception (:class:`Verdict`):

* ``RETRY``: transient, and repeating the call is safe (the request did not take effect, or it
  is idempotent: re-uploading a uniquely named staged file, a GET, a DELETE);
* ``UNKNOWN``: the request may or may not have taken effect (a dropped connection or a timeout
  after a non-idempotent request was sent, a delta-rs commit error). Never repeated blindly:
  :func:`commit_with_reconciliation` first asks the destination whether it landed;
* ``FAIL``: permanent (access denied, missing bucket, bad input): raised at once.

Classifiers shipped here: :class:`S3ErrorClassifier` (s3fs / botocore / aiohttp errors, by
exception type and the S3 status code and error code in the response, never by message text)
and :func:`classify_delta_commit_error` (delta-rs commit errors). No state is kept between
calls: every call owns its attempt counter and its random generator.
"""

from __future__ import annotations

import enum
import http.client
import logging
import random
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from framework.errors import CommitStateUnknownError

__all__ = [
    "DEFAULT_BACKOFF",
    "STAGING_ERRORS",
    "Backoff",
    "Classifier",
    "CommitResult",
    "S3ErrorClassifier",
    "Verdict",
    "classify_delta_commit_error",
    "commit_with_reconciliation",
    "retry_call",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Defaults of :class:`Backoff`.
DEFAULT_MAX_ATTEMPTS = 6
DEFAULT_INITIAL_DELAY = 0.1
DEFAULT_MAX_DELAY = 5.0
DEFAULT_MULTIPLIER = 2.0
DEFAULT_DEADLINE = 120.0


class Verdict(enum.Enum):
    """What to do about one failed attempt."""

    RETRY = "retry"
    UNKNOWN = "unknown"
    FAIL = "fail"


Classifier = Callable[[BaseException], Verdict]


@dataclass(frozen=True, kw_only=True)
class Backoff:
    """Capped exponential backoff with full jitter.

    The n-th retry (n = 0, 1, ...) sleeps a uniformly random time in
    ``[0, min(max_delay, initial_delay * multiplier ** n)]``. Retrying stops after
    ``max_attempts`` attempts in all, or when the next sleep would end after ``deadline`` seconds
    from the first attempt, whichever comes first.

    Raises:
        ValueError: on construction, for a non-positive attempt count or negative delays.
    """

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    initial_delay: float = DEFAULT_INITIAL_DELAY
    max_delay: float = DEFAULT_MAX_DELAY
    multiplier: float = DEFAULT_MULTIPLIER
    deadline: float | None = DEFAULT_DEADLINE

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.initial_delay < 0 or self.max_delay < self.initial_delay:
            raise ValueError(
                f"need 0 <= initial_delay <= max_delay, got {self.initial_delay}, {self.max_delay}"
            )
        if self.multiplier < 1:
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        if self.deadline is not None and self.deadline <= 0:
            raise ValueError(f"deadline must be positive or None, got {self.deadline}")

    def cap(self, retry_number: int) -> float:
        """Upper bound of the sleep before retry number ``retry_number`` (0-based)."""
        # Compare exponents first so huge retry numbers cannot overflow a float.
        if retry_number > 64:
            return self.max_delay
        return min(self.max_delay, self.initial_delay * self.multiplier**retry_number)

    def delays(self, rng: random.Random) -> Iterator[float]:
        """The jittered sleeps between attempts: ``max_attempts - 1`` values."""
        for n in range(self.max_attempts - 1):
            yield rng.uniform(0.0, self.cap(n))


DEFAULT_BACKOFF = Backoff()


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and its causes/contexts, each once, at most 16 deep."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _transport_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [
        ConnectionError,  # builtin: reset, refused, aborted, broken pipe
        TimeoutError,  # also asyncio.TimeoutError and socket.timeout on Python 3.10+
        socket.timeout,
        http.client.IncompleteRead,
        http.client.RemoteDisconnected,
    ]
    try:
        from botocore import exceptions as botocore_exceptions

        types += [botocore_exceptions.ConnectionError, botocore_exceptions.HTTPClientError]
    except ImportError:  # pragma: no cover - botocore ships with s3fs
        pass
    try:
        import aiohttp

        types += [aiohttp.ClientConnectionError, aiohttp.ClientPayloadError]
    except ImportError:  # pragma: no cover
        pass
    try:
        from fsspec.exceptions import FSTimeoutError

        types.append(FSTimeoutError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


def _not_sent_error_types() -> tuple[type[BaseException], ...]:
    """Transport errors raised before a request reached the server: safe to repeat."""
    types: list[type[BaseException]] = [ConnectionRefusedError]
    try:
        from botocore import exceptions as botocore_exceptions

        types += [
            botocore_exceptions.EndpointConnectionError,
            botocore_exceptions.ConnectTimeoutError,
        ]
    except ImportError:  # pragma: no cover
        pass
    try:
        import aiohttp

        types.append(aiohttp.ClientConnectorError)
    except ImportError:  # pragma: no cover
        pass
    return tuple(types)


@dataclass(frozen=True, kw_only=True)
class S3ErrorClassifier:
    """Classifies errors of S3 requests made through s3fs, aiobotocore or botocore.

    The whole ``__cause__``/``__context__`` chain is inspected, so s3fs's translated errors
    (``PermissionError`` from ``AccessDenied`` ...) are classified by the S3 response behind them.

    Attributes:
        retryable_status: HTTP statuses worth retrying (throttling and server errors).
        retryable_codes: S3 error codes worth retrying whatever their status.
        transport: verdict for a dropped connection or a timeout once a request may have been
            sent: ``RETRY`` for idempotent requests, ``UNKNOWN`` for conditional or otherwise
            non-idempotent ones. Errors raised before anything was sent (connection refused,
            connect timeout) are always ``RETRY``.
    """

    retryable_status: frozenset[int] = frozenset({429, 500, 502, 503, 504})
    retryable_codes: frozenset[str] = frozenset(
        {
            "SlowDown",
            "Throttling",
            "ThrottlingException",
            "RequestTimeout",
            "RequestTimeoutException",
            "InternalError",
            "ServiceUnavailable",
            "OperationAborted",
            "ConditionalRequestConflict",
        }
    )
    transport: Verdict = Verdict.RETRY
    _transport_types: tuple[type[BaseException], ...] = field(
        default_factory=_transport_error_types, repr=False, compare=False
    )
    _not_sent_types: tuple[type[BaseException], ...] = field(
        default_factory=_not_sent_error_types, repr=False, compare=False
    )

    def response_of(self, err: BaseException) -> tuple[int | None, str | None]:
        """(HTTP status, S3 error code) of the first S3 error response in ``err``'s chain."""
        for exc in _chain(err):
            response = getattr(exc, "response", None)
            if isinstance(response, dict) and (
                "Error" in response or "ResponseMetadata" in response
            ):
                status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                code = response.get("Error", {}).get("Code")
                return (int(status) if status is not None else None, code)
        return (None, None)

    def never_sent(self, err: BaseException) -> bool:
        """Whether ``err`` was raised before the request reached the server (e.g. refused)."""
        return any(isinstance(exc, self._not_sent_types) for exc in _chain(err))

    def __call__(self, err: BaseException) -> Verdict:
        status, code = self.response_of(err)
        if status is not None or code is not None:
            if status in self.retryable_status or code in self.retryable_codes:
                return Verdict.RETRY
            return Verdict.FAIL
        if self.never_sent(err):
            return Verdict.RETRY
        if any(isinstance(exc, self._transport_types) for exc in _chain(err)):
            return self.transport
        return Verdict.FAIL


#: For staging uploads, reads, listings and deletes: all idempotent.
STAGING_ERRORS = S3ErrorClassifier()


def classify_delta_commit_error(err: BaseException) -> Verdict:
    """Verdict for an exception raised by a delta-rs commit (``create_write_transaction``).

    delta-rs retries transient object-store errors itself before raising, and writes the log
    entry with a conditional PUT. So:

    * ``OSError`` (an object-store error that survived delta-rs's own retries, e.g. the
      connection dropped after the log entry was sent) -> ``UNKNOWN``;
    * ``CommitFailedError`` (a conflict delta-rs did not resolve; also what an internal retry
      of our own, already landed, conditional PUT turns into) and other ``DeltaError``s
      (e.g. a handle older than cleaned-up log files) -> ``UNKNOWN``;
    * protocol and schema errors, and anything else (bad arguments, our own errors) -> ``FAIL``.
    """
    from deltalake.exceptions import DeltaError, DeltaProtocolError, SchemaMismatchError

    if isinstance(err, (DeltaProtocolError, SchemaMismatchError)):
        return Verdict.FAIL  # the table refuses this commit: no retry can change that
    if isinstance(err, (DeltaError, OSError)):
        return Verdict.UNKNOWN  # includes CommitFailedError; reading the txn settles it
    return Verdict.FAIL


def retry_call(
    fn: Callable[[], T],
    *,
    classify: Classifier,
    backoff: Backoff = DEFAULT_BACKOFF,
    description: str = "operation",
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``fn`` until it succeeds, retrying errors ``classify`` marks ``RETRY``.

    Args:
        fn: the operation; must be safe to repeat for every error classified ``RETRY``.
        classify: the error classification, e.g. :data:`STAGING_ERRORS`.
        backoff: attempt count, delays and deadline.
        description: what ``fn`` does, for log lines.
        rng, sleep, clock: injectable for deterministic tests.

    Returns:
        What ``fn`` returned.

    Raises:
        BaseException: the last error, unchanged, when it is classified ``FAIL`` or ``UNKNOWN``
            or when attempts or the deadline run out. ``KeyboardInterrupt``/``SystemExit`` are
            never retried.
    """
    schedule = _Schedule(backoff, rng or random.Random(), clock)
    while True:
        attempt = schedule.start_attempt()
        try:
            return fn()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            verdict = classify(err)
            if verdict is not Verdict.RETRY:
                raise
            delay = schedule.next_delay()
            if delay is None:
                schedule.log_giving_up(description, err)
                raise
            logger.info(
                "%s: attempt %d failed (%s); retrying in %.2fs",
                description,
                attempt,
                _brief(err),
                delay,
            )
            sleep(delay)


class _Schedule:
    """The attempts of one call under a :class:`Backoff`: counts them, and says how long to
    sleep before the next one, or that the attempts or the deadline are used up."""

    def __init__(self, backoff: Backoff, rng: random.Random, clock: Callable[[], float]) -> None:
        self._backoff = backoff
        self._delays = backoff.delays(rng)
        self._clock = clock
        self._start = clock()
        self._attempts = 0
        self._past_deadline = False

    def start_attempt(self) -> int:
        """Counts an attempt; its number (1 for the first)."""
        self._attempts += 1
        return self._attempts

    def next_delay(self) -> float | None:
        """The sleep before the next attempt; ``None`` when there is none left, or when it
        would end past the deadline."""
        delay = next(self._delays, None)
        deadline = self._backoff.deadline
        if delay is not None and deadline is not None:
            self._past_deadline = self._clock() - self._start + delay > deadline
            if self._past_deadline:
                return None
        return delay

    def log_giving_up(self, description: str, err: BaseException) -> None:
        if self._past_deadline:
            logger.warning(
                "%s failed, retry deadline of %.1fs reached after %d attempts: %s",
                description,
                self._backoff.deadline,
                self._attempts,
                _brief(err),
            )
        else:
            logger.warning(
                "%s failed after %d attempts: %s", description, self._attempts, _brief(err)
            )


def _brief(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}"


@dataclass(frozen=True)
class CommitResult(Generic[T]):
    """How :func:`commit_with_reconciliation` ended.

    Attributes:
        value: what the successful commit call returned (``None`` when reconciled).
        attempts: commit calls made.
        reconciled: ``True`` when an attempt whose outcome was unknown turned out to have
            landed: the commit happened exactly once, and no further call was made.
    """

    value: T | None
    attempts: int
    reconciled: bool


def commit_with_reconciliation(
    commit: Callable[[], T],
    *,
    is_committed: Callable[[], bool],
    classify: Classifier = classify_delta_commit_error,
    backoff: Backoff = DEFAULT_BACKOFF,
    read_backoff: Backoff | None = None,
    description: str = "commit",
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> CommitResult[T]:
    """Commit at most once, retrying transient failures and reconciling unknown outcomes.

    After an attempt fails with an ``UNKNOWN`` verdict, ``is_committed()`` is asked (reading the
    table's ``txn`` for the app id, not the commit's response) before anything else happens:
    if the commit landed, the result is returned with ``reconciled=True`` and no further attempt
    is made; if it did not, the commit is retried (``RETRY`` errors are retried directly).

    A retried commit must carry the same ``txn(app_id, version)``: if the earlier attempt lands
    late, delta-rs rejects the retry as a concurrent transaction (``UNKNOWN`` again), and the
    next reconciliation finds the landed commit. So a commit is never applied twice.

    Args:
        commit: one commit attempt (e.g. ``create_write_transaction`` on a fresh snapshot).
        is_committed: whether the destination holds this commit; it may raise
            ``ConcurrentWriterError`` (passed through) when another instance committed it.
        classify: verdict per commit error; :func:`classify_delta_commit_error` by default.
        backoff: retry policy of the commit attempts.
        read_backoff: retry policy of ``is_committed`` reads (transient S3 errors are retried
            with :data:`STAGING_ERRORS`); defaults to ``backoff``.
        description, rng, sleep, clock: as for :func:`retry_call`.

    Returns:
        A :class:`CommitResult`.

    Raises:
        CommitStateUnknownError: the outcome could not be determined: ``is_committed`` kept
            failing, or attempts ran out after an ``UNKNOWN`` failure (the last attempt may
            still land). The caller must reconcile later (the engine does so through
            ``is_committed`` before the epoch is retried); the original error is the cause.
        BaseException: a ``FAIL`` error unchanged (nothing landed), or a ``RETRY`` error
            unchanged once attempts run out, or what ``is_committed`` raised as a
            ``SinkError`` (e.g. ``ConcurrentWriterError``).
    """
    rng = rng or random.Random()
    schedule = _Schedule(backoff, rng, clock)
    while True:
        attempt = schedule.start_attempt()
        try:
            return CommitResult(commit(), attempts=attempt, reconciled=False)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            verdict = classify(err)
            if verdict is Verdict.FAIL:
                raise
            if verdict is Verdict.UNKNOWN:
                try:
                    landed = retry_call(
                        is_committed,
                        classify=STAGING_ERRORS,
                        backoff=read_backoff or backoff,
                        description=f"{description}: reconciling",
                        rng=rng,
                        sleep=sleep,
                        clock=clock,
                    )
                except CommitStateUnknownError:
                    raise
                except Exception as read_err:
                    if _is_framework_error(read_err):
                        raise  # e.g. ConcurrentWriterError: a definite answer
                    raise CommitStateUnknownError(
                        f"{description}: attempt {attempt} failed with an unknown outcome "
                        f"({_brief(err)}) and reading the destination to reconcile failed "
                        f"({_brief(read_err)}); the commit may or may not have landed"
                    ) from err
                if landed:
                    logger.info(
                        "%s: attempt %d failed (%s) but the commit had landed; not repeating it",
                        description,
                        attempt,
                        _brief(err),
                    )
                    return CommitResult(None, attempts=attempt, reconciled=True)
            delay = schedule.next_delay()
            if delay is None:
                schedule.log_giving_up(description, err)
                if verdict is Verdict.UNKNOWN:
                    raise CommitStateUnknownError(
                        f"{description}: gave up after {attempt} attempts; the last one failed "
                        f"with an unknown outcome ({_brief(err)}) and may still land: reconcile "
                        "by reading the destination before retrying"
                    ) from err
                raise
            logger.info(
                "%s: attempt %d failed (%s), not landed; retrying in %.2fs",
                description,
                attempt,
                _brief(err),
                delay,
            )
            sleep(delay)


def _is_framework_error(err: BaseException) -> bool:
    from framework.errors import SinkError

    return isinstance(err, SinkError)
