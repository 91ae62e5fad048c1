"""The one retry loop: :func:`retry_call`, and :func:`commit_with_reconciliation` on top of it."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

from framework.errors import CommitStateUnknownError, SinkError
from framework.retry._backoff import Backoff, Classifier, Verdict

__all__ = ["CommitResult", "commit_with_reconciliation", "retry_call"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

_DEFAULT_BACKOFF = Backoff()


def _never_retry(_: BaseException) -> Verdict:
    return Verdict.FAIL


def retry_call(
    fn: Callable[[], T],
    *,
    classify: Classifier,
    backoff: Backoff = _DEFAULT_BACKOFF,
    description: str = "operation",
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``fn`` until it succeeds, retrying errors ``classify`` marks ``RETRY``.

    Args:
        fn: the operation; must be safe to repeat for every error classified ``RETRY``.
        classify: the error classification.
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
    value, _, _ = _attempts(
        fn, classify, backoff, description, rng or random.Random(), sleep, clock
    )
    return cast(T, value)  # without ``settle`` nothing is reconciled: ``fn`` returned it


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
    classify: Classifier,
    read_classify: Classifier = _never_retry,
    backoff: Backoff = _DEFAULT_BACKOFF,
    read_backoff: Backoff | None = None,
    description: str = "commit",
    rng: random.Random | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> CommitResult[T]:
    """Commit at most once, retrying transient failures and reconciling unknown outcomes.

    After an attempt fails with an ``UNKNOWN`` verdict, ``is_committed()`` is asked (reading the
    destination, e.g. a table's ``txn`` for the app id, not the commit's response) before
    anything else happens: if the commit landed, the result is returned with ``reconciled=True``
    and no further attempt is made; if it did not, the commit is retried (``RETRY`` errors are
    retried directly).

    A retried commit must carry the same idempotence key (e.g. ``txn(app_id, version)``): if
    the earlier attempt lands late, the destination rejects the retry (``UNKNOWN`` again), and
    the next reconciliation finds the landed commit. So a commit is never applied twice.

    Args:
        commit: one commit attempt.
        is_committed: whether the destination holds this commit; it may raise a
            ``SinkError`` (passed through, e.g. ``ConcurrentWriterError``) for a definite answer.
        classify: verdict per commit error.
        read_classify: verdict per error of an ``is_committed`` read (``RETRY`` ones are
            retried); by default none is retried.
        backoff: retry policy of the commit attempts.
        read_backoff: retry policy of ``is_committed`` reads; defaults to ``backoff``.
        description, rng, sleep, clock: as for :func:`retry_call`.

    Returns:
        A :class:`CommitResult`.

    Raises:
        CommitStateUnknownError: the outcome could not be determined: ``is_committed`` kept
            failing, or attempts ran out after an ``UNKNOWN`` failure (the last attempt may
            still land). The caller must reconcile later; the original error is the cause.
        BaseException: a ``FAIL`` error unchanged (nothing landed), or a ``RETRY`` error
            unchanged once attempts run out, or what ``is_committed`` raised as a
            ``SinkError`` (e.g. ``ConcurrentWriterError``).
    """
    rng = rng or random.Random()

    def landed(err: BaseException, attempt: int) -> bool:
        try:
            return retry_call(
                is_committed,
                classify=read_classify,
                backoff=read_backoff or backoff,
                description=f"{description}: reconciling",
                rng=rng,
                sleep=sleep,
                clock=clock,
            )
        except SinkError:
            raise  # e.g. ConcurrentWriterError: a definite answer
        except Exception as read_err:
            raise CommitStateUnknownError(
                f"{description}: attempt {attempt} failed with an unknown outcome "
                f"({_brief(err)}) and reading the destination to reconcile failed "
                f"({_brief(read_err)}); the commit may or may not have landed"
            ) from err

    value, attempts, reconciled = _attempts(
        commit, classify, backoff, description, rng, sleep, clock, settle=landed
    )
    return CommitResult(value, attempts=attempts, reconciled=reconciled)


def _attempts(
    fn: Callable[[], T],
    classify: Classifier,
    backoff: Backoff,
    description: str,
    rng: random.Random,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
    settle: Callable[[BaseException, int], bool] | None = None,
) -> tuple[T | None, int, bool]:
    """The retry loop: (what ``fn`` returned, attempts made, settled as landed).

    An ``UNKNOWN`` failure is raised unchanged without ``settle``; with it, ``settle(error,
    attempt)`` says whether the attempt landed (then the loop ends, settled) or not (then it is
    retried like a ``RETRY`` failure, and running out of attempts raises
    ``CommitStateUnknownError``).
    """
    delays = backoff.delays(rng)
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn(), attempt, False
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:
            verdict = classify(err)
            if verdict is Verdict.FAIL or (verdict is Verdict.UNKNOWN and settle is None):
                raise
            if verdict is Verdict.UNKNOWN and settle is not None and settle(err, attempt):
                logger.info(
                    "%s: attempt %d failed (%s) but the commit had landed; not repeating it",
                    description,
                    attempt,
                    _brief(err),
                )
                return None, attempt, True
            delay = next(delays, None)
            past_deadline = (
                delay is not None
                and backoff.deadline is not None
                and clock() - start + delay > backoff.deadline
            )
            if delay is None or past_deadline:
                _log_giving_up(description, attempt, err, backoff if past_deadline else None)
                if verdict is Verdict.UNKNOWN:
                    raise CommitStateUnknownError(
                        f"{description}: gave up after {attempt} attempts; the last one failed "
                        f"with an unknown outcome ({_brief(err)}) and may still land: reconcile "
                        "by reading the destination before retrying"
                    ) from err
                raise
            logger.info(
                "%s: attempt %d failed (%s)%s; retrying in %.2fs",
                description,
                attempt,
                _brief(err),
                ", not landed" if verdict is Verdict.UNKNOWN else "",
                delay,
            )
            sleep(delay)


def _log_giving_up(
    description: str, attempts: int, err: BaseException, deadline_of: Backoff | None
) -> None:
    if deadline_of is not None:
        logger.warning(
            "%s failed, retry deadline of %.1fs reached after %d attempts: %s",
            description,
            deadline_of.deadline,
            attempts,
            _brief(err),
        )
    else:
        logger.warning("%s failed after %d attempts: %s", description, attempts, _brief(err))


def _brief(err: BaseException) -> str:
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:200]}"
