"""Error classification: is a failed request worth sending again?

The classifier is a value handed to the writer (and pickled with the sink), never module-global
state, and it decides by exception type and structured attributes, never by parsing messages.
Its verdict, :class:`~framework.retry.ErrorClassification`, belongs to the framework's one retry
toolkit (:mod:`framework.retry`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from framework.errors import FatalDeliveryError, RetryableDeliveryError, ThrottledError
from framework.retry import ErrorClassification

__all__ = [
    "DEFAULT_ERROR_CLASSIFIER",
    "DEFAULT_FATAL_ERROR_TYPES",
    "DEFAULT_RETRYABLE_ERROR_TYPES",
    "ErrorClassification",
    "ErrorClassifier",
    "TypeErrorClassifier",
]


FATAL = ErrorClassification(retryable=False)
FATAL_ENTRIES = ErrorClassification(retryable=False, caused_by_entries=True)
RETRYABLE = ErrorClassification(retryable=True)


class ErrorClassifier(Protocol):
    """Decides whether the error a request raised is retryable. Must pickle."""

    def classify(self, error: BaseException) -> ErrorClassification:
        """Classify ``error``, raised by ``submit_request_entries`` or by its timeout."""
        ...


# Network trouble and timeouts: the request may succeed if sent again.
DEFAULT_RETRYABLE_ERROR_TYPES: tuple[type[BaseException], ...] = (
    RetryableDeliveryError,
    TimeoutError,
    asyncio.TimeoutError,  # not the builtin TimeoutError before Python 3.11
    ConnectionError,
)
DEFAULT_FATAL_ERROR_TYPES: tuple[type[BaseException], ...] = (FatalDeliveryError,)


@dataclass(frozen=True)
class TypeErrorClassifier:
    """Classifies by exception type, checking ``fatal`` before ``retryable``.

    A :class:`~framework.errors.ThrottledError` is reported as throttling, the
    ``retry_after_s`` of a :class:`~framework.errors.RetryableDeliveryError` is passed on, and a
    :class:`~framework.errors.FatalDeliveryError` says whether its entries caused it. An error of
    no listed type is fatal and not attributed to entries: retrying or dead-lettering what nobody
    anticipated would hide bugs, so the job fails.

    Attributes:
        retryable: types whose instances are retried.
        fatal: types that are fatal even when they also subclass a retryable type.
    """

    retryable: Sequence[type[BaseException]] = DEFAULT_RETRYABLE_ERROR_TYPES
    fatal: Sequence[type[BaseException]] = DEFAULT_FATAL_ERROR_TYPES

    def __post_init__(self) -> None:
        # Tuples make isinstance checks direct and keep the value hashable and picklable.
        object.__setattr__(self, "retryable", tuple(self.retryable))
        object.__setattr__(self, "fatal", tuple(self.fatal))

    def with_retryable(self, *types: type[BaseException]) -> TypeErrorClassifier:
        """A copy that also retries ``types`` (e.g. a client library's connection errors)."""
        return TypeErrorClassifier(retryable=(*self.retryable, *types), fatal=self.fatal)

    def classify(self, error: BaseException) -> ErrorClassification:
        """See :class:`ErrorClassifier`."""
        if isinstance(error, tuple(self.fatal)):
            if isinstance(error, FatalDeliveryError) and error.caused_by_entries:
                return FATAL_ENTRIES
            return FATAL
        if isinstance(error, tuple(self.retryable)):
            if isinstance(error, RetryableDeliveryError):
                return ErrorClassification(
                    retryable=True,
                    throttled=isinstance(error, ThrottledError),
                    retry_after_s=error.retry_after_s,
                )
            return RETRYABLE
        return FATAL


DEFAULT_ERROR_CLASSIFIER = TypeErrorClassifier()
