"""Safe-commit self-test: does this S3 endpoint honour ``If-None-Match: *`` on PUT?

delta-rs writes each ``_delta_log/<version>.json`` with one PUT carrying ``If-None-Match: *`` and
relies on the server answering ``412 Precondition Failed`` when that version already exists;
no lock is used. On a server or gateway that ignores the header, two concurrent commits of the
same version both "succeed" and one of them silently disappears. :func:`verify_conditional_put`
checks the endpoint once, before the first commit, with a probe object under the table root:

0. LIST under the table root (on every call, never cached: access errors are classified the
   same way whatever the process did before);
1. PUT ``<table>/_sink_staging/_conditional_put_probe/<uuid>`` with ``If-None-Match: *``
   (must succeed);
2. PUT the same key again, with other content and the same header (must be rejected with 412);
3. GET the key (must still hold the first content);
4. DELETE the key (always attempted, whatever happened before).

Transient failures (503 SlowDown, 500, dropped connections) are retried with capped, jittered
backoff. A verified endpoint is remembered in a :class:`ConditionalPutCache`: by default the
process-wide :data:`PROCESS_CACHE`, which only ever records that an endpoint *passed* (a fact
that does not change while the process runs); failures are never cached, so a fixed endpoint
is re-probed next time.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from committers.delta.storage._s3errors import S3ErrorClassifier
from committers.delta.storage._staging import STAGING_DIR
from committers.delta.storage._storage import TableLocation
from framework.errors import LocationNotWritableError, UnsafeStorageError
from framework.retry import Backoff, Verdict, retry_call

__all__ = [
    "PROBE_BACKOFF",
    "PROBE_DIR",
    "PROCESS_CACHE",
    "ConditionalPutCache",
    "verify_conditional_put",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Directory (relative to the table root) holding the probe objects while a probe runs. It is
#: inside the sink's staging directory: Delta readers ignore it (leading ``_``), the sink's
#: "is this location empty?" check ignores it, and stores that keep empty directories visible
#: (SeaweedFS) leave nothing behind that looks like table data.
PROBE_DIR = f"{STAGING_DIR}/_conditional_put_probe"

#: Retry policy of each probe request: short, so an unreachable endpoint fails in seconds.
PROBE_BACKOFF = Backoff(max_attempts=6, initial_delay=0.2, max_delay=2.0, deadline=30.0)

_PROBE_ERRORS = S3ErrorClassifier()

_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "AccountProblem",
    }
)
_REGION_CODES = frozenset(
    {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}
)


@dataclass
class ConditionalPutCache:
    """Endpoints that passed the self-test. Thread-safe; only successes are recorded.

    Pass your own instance to :func:`verify_conditional_put` to scope the memory (e.g. per
    sink or per test); the default is :data:`PROCESS_CACHE`.
    """

    _verified: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def is_verified(self, endpoint: str) -> bool:
        with self._lock:
            return endpoint in self._verified

    def mark_verified(self, endpoint: str) -> None:
        with self._lock:
            self._verified.add(endpoint)

    def clear(self) -> None:
        with self._lock:
            self._verified.clear()

    def __getstate__(self) -> dict[str, Any]:
        return {"_verified": set(self._verified)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._verified = set(state["_verified"])
        self._lock = threading.Lock()


#: Per-process memory of endpoints verified to honour ``If-None-Match: *``. A documented cache
#: of a verified fact, not a retry registry: it only lets later sinks skip a repeated probe.
PROCESS_CACHE = ConditionalPutCache()


class _Rejected(Exception):
    """The server answered a request with an error response (carries status and code)."""

    def __init__(self, status: int | None, code: str | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _describe(status: int | None, code: str | None) -> str:
    return " ".join(part for part in (str(status) if status else "", code or "") if part) or "?"


def verify_conditional_put(
    location: TableLocation,
    *,
    skip: bool = False,
    cache: ConditionalPutCache | None = None,
    backoff: Backoff = PROBE_BACKOFF,
) -> None:
    """Check that ``location`` is reachable and writable, and that its S3 endpoint rejects a
    second ``If-None-Match: *`` PUT with 412. Non-S3 locations return at once.

    Call it before the first commit to a location. The access check (one listing under the
    table root) runs on every call, so wrong credentials, a missing bucket, a wrong region or
    an unreachable endpoint are reported the same way whatever ran before in the process; only
    the conditional-PUT verdict is remembered in ``cache``.

    Args:
        location: the table location; the probe uses its endpoint, credentials and bucket.
        skip: the user's explicit, loudly named override (``unsafe_skip_conditional_put_check``):
            no conditional PUT is made and a warning is logged naming the endpoint.
        cache: where verified endpoints are remembered; :data:`PROCESS_CACHE` by default.
        backoff: retry policy of every probe request.

    Guarantees:
        On return the endpoint answered 412 to a repeated conditional PUT of an existing key
        and kept the first content (or was verified earlier in ``cache``). The probe object is
        deleted on success and on failure (a failed delete is logged, not raised). Nothing
        else is written.

    Raises:
        UnsafeStorageError: the endpoint accepted the second conditional PUT, overwrote the
            object, rejected the header, or otherwise did not answer 412; the message names
            the endpoint and what it did. Writing there could lose commits.
        LocationNotWritableError: access denied (wrong or missing credentials), missing bucket,
            wrong region, unreachable endpoint (after bounded retries), or an unexpected error.
            Nothing was written.
    """
    if not location.is_s3:
        return
    endpoint = location.endpoint
    probe = _Probe(location, backoff)
    probe.check_access()
    if skip:
        logger.warning(
            "UNSAFE: the conditional-put self-test is skipped for %s (table %s) at the user's "
            "request (unsafe_skip_conditional_put_check=True). If this endpoint does not reject "
            "a second 'If-None-Match: *' PUT with 412, concurrent commits can silently lose data.",
            endpoint,
            location.uri,
        )
        return
    cache = PROCESS_CACHE if cache is None else cache
    if cache.is_verified(endpoint):
        return
    probe.run()
    cache.mark_verified(endpoint)
    logger.info("S3 endpoint %s honours If-None-Match: * (conditional PUT verified)", endpoint)


class _Probe:
    """One run of the self-test against one location."""

    def __init__(self, location: TableLocation, backoff: Backoff) -> None:
        self.location = location
        self.backoff = backoff
        self.endpoint = location.endpoint
        self.bucket = location.bucket
        prefix = location.key_prefix
        self.key = (
            f"{prefix}/{PROBE_DIR}/{uuid.uuid4().hex}"
            if prefix
            else (f"{PROBE_DIR}/{uuid.uuid4().hex}")
        )
        self.where = f"s3://{self.bucket}/{self.key}"
        self.fs: Any = None

    # -- plumbing ---------------------------------------------------------------------------

    def _filesystem(self) -> Any:
        """A private s3fs instance with this location's settings, botocore retries off.

        Retrying is done here with :data:`PROBE_BACKOFF`, so that a repeated PUT whose first
        attempt may have landed is interpreted correctly and an unreachable endpoint fails fast.
        """
        import fsspec

        kwargs = self.location.fsspec_options()
        config = dict(kwargs.get("config_kwargs", {}))
        config["retries"] = {"mode": "standard", "max_attempts": 1}
        kwargs["config_kwargs"] = config
        return fsspec.filesystem("s3", skip_instance_cache=True, **kwargs)

    def _call(self, what: str, make: Callable[[Any], Awaitable[T]]) -> T:
        """Run one S3 request with retries; error responses become :class:`_Rejected`."""
        from fsspec.asyn import sync

        fs = self.fs

        async def once() -> T:
            client = await fs.set_session()
            return await make(client)

        def attempt() -> T:
            result: T = sync(fs.loop, once)
            return result

        try:
            return retry_call(
                attempt, classify=_PROBE_ERRORS, backoff=self.backoff, description=what
            )
        except Exception as err:
            status, code = _PROBE_ERRORS.response_of(err)
            if status is not None or code is not None:
                raise _Rejected(status, code, str(err)) from err
            raise

    def _put(self, body: bytes) -> None:
        async def make(client: Any) -> None:
            await client.put_object(Bucket=self.bucket, Key=self.key, Body=body, IfNoneMatch="*")

        self._call(f"self-test conditional PUT to {self.endpoint}", make)

    def _get(self) -> bytes | None:
        async def make(client: Any) -> bytes:
            response = await client.get_object(Bucket=self.bucket, Key=self.key)
            async with response["Body"] as stream:
                data: bytes = await stream.read()
            return data

        try:
            return self._call(f"self-test GET from {self.endpoint}", make)
        except _Rejected as err:
            if err.status == 404:
                return None
            raise

    def _delete(self) -> None:
        async def make(client: Any) -> None:
            await client.delete_object(Bucket=self.bucket, Key=self.key)

        try:
            self._call(f"self-test DELETE at {self.endpoint}", make)
        except Exception as err:
            logger.warning(
                "could not delete the conditional-put probe object %s at %s (%s); it is safe "
                "to delete by hand",
                self.where,
                self.endpoint,
                type(err).__name__,
            )

    # -- errors -----------------------------------------------------------------------------

    def _unsafe(self, reason: str) -> UnsafeStorageError:
        return UnsafeStorageError(
            f"S3 endpoint {self.endpoint} is not safe for Delta commits (table "
            f"{self.location.uri}): {reason}. delta-rs writes each commit with a PUT carrying "
            "'If-None-Match: *' and needs the server to answer 412 when the object exists; "
            "without that, concurrent commits silently overwrite each other. Nothing was "
            "committed. Use a server that supports conditional writes (AWS S3, MinIO, "
            "SeaweedFS 4.x, ...) or, only if this table has a single writer ever, pass "
            "unsafe_skip_conditional_put_check=True."
        )

    def _not_writable(self, err: BaseException) -> LocationNotWritableError:
        where = f"table {self.location.uri} at S3 endpoint {self.endpoint}"
        if isinstance(err, _Rejected):
            what = _describe(err.status, err.code)
            if err.code == "NoSuchBucket" or (err.status == 404 and err.code is None):
                reason = f"bucket {self.bucket!r} does not exist ({what})"
            elif err.code in _ACCESS_CODES or err.status == 403:
                reason = (
                    f"access denied ({what}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / "
                    "AWS_SESSION_TOKEN (or the profile) and that they may write under the table"
                )
            elif err.code in _REGION_CODES or err.status == 301:
                reason = f"wrong region for bucket {self.bucket!r} ({what}): check AWS_REGION"
            else:
                reason = f"the server answered {what}"
        else:
            kind = _PROBE_ERRORS(err)
            if kind is Verdict.RETRY:
                reason = (
                    f"endpoint unreachable or failing after bounded retries "
                    f"({type(err).__name__}: {_first_line(err)})"
                )
            elif _is_credentials_error(err):
                reason = (
                    "no AWS credentials found: pass AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
                    "in storage_options, or set the standard AWS environment variables/profile"
                )
            else:
                reason = f"{type(err).__name__}: {_first_line(err)}"
        return LocationNotWritableError(f"cannot write {where}: {reason}. Nothing was written.")

    # -- the test ---------------------------------------------------------------------------

    def check_access(self) -> None:
        """One listing under the table root, classified like every probe request."""
        try:
            self.fs = self._filesystem()
        except Exception as err:
            raise self._not_writable(err) from err
        prefix = f"{self.location.key_prefix}/" if self.location.key_prefix else ""

        async def make(client: Any) -> None:
            await client.list_objects_v2(Bucket=self.bucket, Prefix=prefix, MaxKeys=1)

        try:
            self._call(f"access check at {self.endpoint}", make)
        except Exception as err:
            raise self._not_writable(err) from err

    def run(self) -> None:
        """The conditional-PUT test itself; :meth:`check_access` must have passed."""
        first = b"conditional-put-probe:first:" + uuid.uuid4().hex.encode()
        second = b"conditional-put-probe:second:" + uuid.uuid4().hex.encode()
        may_exist = True  # until the first PUT is known not to have landed
        try:
            # 1. create the probe object
            try:
                self._put(first)
            except _Rejected as err:
                if err.status != 412:
                    may_exist = False
                    if err.status == 501 or err.code == "NotImplemented":
                        raise self._unsafe(
                            "it does not implement conditional PUTs (a PUT with "
                            f"'If-None-Match: *' was answered {_describe(err.status, err.code)})"
                        ) from err
                    raise self._not_writable(err) from err
                # 412 on a fresh random key: an earlier attempt of ours landed and its
                # response was lost, or the server rejects every conditional PUT. Step 3 tells.
            except Exception as err:
                may_exist = not (_PROBE_ERRORS.never_sent(err) or _is_credentials_error(err))
                raise self._not_writable(err) from err

            # 2. the same key again: must be rejected with 412
            try:
                self._put(second)
            except _Rejected as err:
                if err.status != 412:
                    raise self._unsafe(
                        "a conditional PUT of an existing key was answered "
                        f"{_describe(err.status, err.code)} instead of 412 Precondition Failed"
                    ) from err
            except Exception as err:
                raise self._not_writable(err) from err
            else:
                raise self._unsafe(
                    "it accepted a second PUT with 'If-None-Match: *' of an existing key "
                    "(expected 412 Precondition Failed)"
                )

            # 3. the first content must have survived
            try:
                content = self._get()
            except Exception as err:
                raise self._not_writable(err) from err
            if content is None:
                raise self._unsafe(
                    "it rejected a conditional PUT of a key that did not exist (the probe "
                    "object was never created)"
                )
            if content != first:
                raise self._unsafe(
                    "it answered 412 to a second conditional PUT but overwrote the object anyway"
                )
        finally:
            if may_exist:
                self._delete()


def _is_credentials_error(err: BaseException) -> bool:
    """botocore found no (complete) credentials: raised before any request is sent."""
    return type(err).__name__ in ("NoCredentialsError", "PartialCredentialsError")


def _first_line(err: BaseException) -> str:
    text = str(err)
    return text.splitlines()[0][:300] if text else ""
