"""How S3 errors are classified, for the framework's retry toolkit (:mod:`framework.retry`).

:class:`S3ErrorClassifier` judges an error of an S3 request made through s3fs, aiobotocore or
botocore, by exception type and the S3 status code and error code in the response, never by
message text: as a :class:`~framework.retry.Verdict` for calls retried in a loop
(:func:`~framework.retry.retry_call`: the conditional-PUT self-test, the reads that reconcile a
commit), and as an :class:`~framework.retry.ErrorClassification` that also says whether S3
throttled, for the async writer that uploads staged files (:mod:`._upload`). No state is kept
between calls.
"""

from __future__ import annotations

import functools
import http.client
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from framework.retry import ErrorClassification, Verdict

__all__ = ["STAGING_ERRORS", "S3ErrorClassifier"]

#: S3's answers that mean "over capacity": the async writer's rate limiter hears them.
THROTTLING_STATUS = frozenset({429, 503})
THROTTLING_CODES = frozenset(
    {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded"}
)


def _chain(err: BaseException) -> Iterator[BaseException]:
    """``err`` and its causes/contexts, each once, at most 16 deep."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


@functools.cache  # on first use: importing aiohttp and botocore costs 0.3 s of CPU
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


@functools.cache
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
        return any(isinstance(exc, _not_sent_error_types()) for exc in _chain(err))

    def __call__(self, err: BaseException) -> Verdict:
        status, code = self.response_of(err)
        if status is not None or code is not None:
            if status in self.retryable_status or code in self.retryable_codes:
                return Verdict.RETRY
            return Verdict.FAIL
        if self.never_sent(err):
            return Verdict.RETRY
        if any(isinstance(exc, _transport_error_types()) for exc in _chain(err)):
            return self.transport
        return Verdict.FAIL

    def classify(self, error: BaseException) -> ErrorClassification:
        """The verdict for a request of the async writer (an upload's part, PUT or completion):
        retryable as :meth:`__call__` says (the writer's own request timeout always is), and
        throttled when S3 answered that it is over capacity. A refused request is never
        the entries' fault."""
        if isinstance(error, TimeoutError):  # the writer's request timeout
            return ErrorClassification(retryable=True)
        if self(error) is not Verdict.RETRY:
            return ErrorClassification(retryable=False)
        status, code = self.response_of(error)
        throttled = status in THROTTLING_STATUS or code in THROTTLING_CODES
        return ErrorClassification(retryable=True, throttled=throttled)


#: For staging uploads, reads, listings and deletes: all idempotent.
STAGING_ERRORS = S3ErrorClassifier()
