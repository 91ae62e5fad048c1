"""Uploads of staged files to S3 through the framework's async sink writer (FLIP-171, FLIP-242).

A staged Parquet file goes up as S3 multipart-upload parts while it is still being encoded (a
file smaller than one part is a single PutObject). Every part, and the request that completes
an upload, is a request entry of an :class:`~framework.asyncsink.AsyncSinkWriter`:

* ``503`` (``SlowDown``) and ``429`` are throttling: the AIMD rate limiting strategy halves the
  number of parts in flight and the entry waits out a backoff without spending its retry
  budget (back-pressure, as for any async sink);
* ``500``/``502``/``504``, dropped connections and request timeouts are retried with capped,
  jittered backoff, each entry within its retry budget;
* anything else (access denied, missing bucket) fails the task at once, with the S3 error.

The buffering hints bound memory: per task at most ``concurrency`` parts in flight and as many
waiting, each ``part_size`` bytes, plus one part being filled per open file.

Staging is at-least-once by nature: a part or a PUT may be sent twice, harmlessly, since every
staged file has a unique name; the Delta commit makes the batch exactly-once. botocore's own
retries are off for this client, so throttling reaches the rate limiter instead of being
absorbed by a hidden retry loop.

A killed task leaves an incomplete multipart upload, which S3 lists nowhere but in
``ListMultipartUploads``: :func:`abort_incomplete_uploads` aborts those of uncommitted files,
and the driver calls it with the files a failed attempt's manifest names.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import fsspec.asyn

from committers.delta.storage._s3errors import STAGING_ERRORS
from committers.delta.storage._storage import TableLocation
from framework.asyncsink import (
    AsyncSinkWriter,
    AsyncSinkWriterConfig,
    ElementConverter,
    RetryPolicy,
)
from framework.errors import DeliveryError, RetriesExhaustedError, StagingError
from framework.sink import WriterContext

__all__ = [
    "MAX_UPLOAD_PART_SIZE",
    "MIN_UPLOAD_PART_SIZE",
    "S3Uploader",
    "UploadStream",
    "abort_incomplete_uploads",
]

logger = logging.getLogger(__name__)

MIN_UPLOAD_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_UPLOAD_PART_SIZE = 5 * 1024 * 1024 * 1024  # and its maximum
DEFAULT_REQUEST_TIMEOUT_MS = 120_000  # one part of up to part_size bytes


class _Kind(enum.Enum):
    PUT = "put"  # a whole (small) file in one PutObject
    PART = "part"  # one part of a multipart upload
    COMPLETE = "complete"  # CompleteMultipartUpload, once every part is in


@dataclass(eq=False)
class _Upload:
    """One staged object. ``parts`` and ``size`` are set by the writing thread before it sets
    ``closed`` (on the loop); everything else changes only on the event loop."""

    bucket: str
    key: str
    upload_id: str | None = None
    creating: asyncio.Lock = field(default_factory=asyncio.Lock)  # binds to the loop on use
    etags: dict[int, str] = field(default_factory=dict)
    parts: int = 0  # parts handed to the writer so far
    size: int = 0
    closed: bool = False
    completing: bool = False
    finished: bool = False
    stray_upload_ids: bool = False  # a create whose answer was lost may have made another


@dataclass(eq=False, slots=True)
class _Request:
    """A request entry: one PUT, one part or one completion."""

    upload: _Upload
    kind: _Kind
    number: int = 0
    body: bytes = b""
    sent: bool = False  # an earlier attempt may have reached S3


class _Identity(ElementConverter[_Request, _Request]):
    def apply(self, element: _Request, context: WriterContext | None) -> _Request:
        return element


class _PartWriter(AsyncSinkWriter[_Request, _Request]):
    """Sends each entry as one S3 request, on the event loop of the s3fs filesystem."""

    def __init__(self, fs: Any, *, concurrency: int) -> None:
        super().__init__(
            element_converter=_Identity(),
            config=AsyncSinkWriterConfig(
                max_batch_size=1,  # S3 has no batched upload: one entry per request
                max_in_flight_requests=concurrency,
                max_buffered_requests=concurrency + 1,
                max_batch_size_in_bytes=MAX_UPLOAD_PART_SIZE,
                max_record_size_in_bytes=MAX_UPLOAD_PART_SIZE,
                max_time_in_buffer_ms=10,
                request_timeout_ms=DEFAULT_REQUEST_TIMEOUT_MS,
            ),
            retry_policy=RetryPolicy(max_attempts=8, max_backoff_ms=5_000.0),
            error_classifier=STAGING_ERRORS,  # its classify() tells throttling apart
        )
        self._fs = fs
        self._completions: set[asyncio.Task[None]] = set()

    def size_in_bytes(self, entry: _Request) -> int:
        return len(entry.body)

    def describe_entry(self, entry: _Request) -> Any:
        return {"key": entry.upload.key, "kind": entry.kind.value, "part": entry.number}

    async def submit_request_entries(self, entries: list[_Request]) -> list[_Request]:
        for entry in entries:
            await self._send(entry)
        return []

    async def _send(self, entry: _Request) -> None:
        upload = entry.upload
        s3 = await _s3_client(self._fs, upload.bucket)
        target = {"Bucket": upload.bucket, "Key": upload.key}
        retried, entry.sent = entry.sent, True
        if entry.kind is _Kind.PUT:
            await s3.put_object(**target, Body=entry.body)
            upload.finished = True
        elif entry.kind is _Kind.PART:
            upload_id = await self._upload_id(s3, upload)
            response = await s3.upload_part(
                **target, UploadId=upload_id, PartNumber=entry.number, Body=entry.body
            )
            upload.etags[entry.number] = response["ETag"]
            self.complete_when_ready(upload)
        else:
            parts = [{"PartNumber": n, "ETag": upload.etags[n]} for n in sorted(upload.etags)]
            try:
                await s3.complete_multipart_upload(
                    **target, UploadId=upload.upload_id, MultipartUpload={"Parts": parts}
                )
            except Exception as err:
                # An earlier attempt completed it but its answer was lost: the upload id is gone
                # and the object is there, whole.
                if not (retried and await self._landed(s3, upload, err)):
                    raise
            upload.finished = True
            if upload.stray_upload_ids:
                await _abort_uploads_of(s3, upload.bucket, upload.key)

    async def _upload_id(self, s3: Any, upload: _Upload) -> str:
        if upload.upload_id is None:
            async with upload.creating:  # parts in flight together share one upload
                if upload.upload_id is None:
                    try:
                        response = await s3.create_multipart_upload(
                            Bucket=upload.bucket, Key=upload.key
                        )
                    except Exception:
                        upload.stray_upload_ids = True
                        raise
                    upload.upload_id = response["UploadId"]
        return upload.upload_id

    async def _landed(self, s3: Any, upload: _Upload, err: BaseException) -> bool:
        if STAGING_ERRORS.response_of(err)[1] != "NoSuchUpload":
            return False
        try:
            head = await s3.head_object(Bucket=upload.bucket, Key=upload.key)
        except Exception:
            return False
        return bool(head.get("ContentLength") == upload.size)

    def complete_when_ready(self, upload: _Upload) -> None:
        """Queue the completion once the upload is closed and every part is in."""
        if upload.completing or not upload.closed or len(upload.etags) < upload.parts:
            return
        upload.completing = True
        task = asyncio.get_running_loop().create_task(
            self.write_entries([_Request(upload, _Kind.COMPLETE)])
        )
        self._completions.add(task)

    async def flush_all(self, uploads: list[_Upload]) -> None:
        """Wait until every upload in ``uploads`` (all closed) is a whole object."""
        while True:
            await self.flush()
            completions, self._completions = self._completions, set()
            if completions:
                await asyncio.gather(*completions)  # they only buffer: flush again
                continue
            unfinished = [upload.key for upload in uploads if not upload.finished]
            if unfinished:
                raise StagingError(f"uploads did not complete: {unfinished[:3]}")  # a bug
            return

    async def abort_uploads(self, uploads: list[_Upload]) -> None:
        """Drop what is queued, then abort the multipart uploads that were started."""
        for task in self._completions:
            task.cancel()
        await self.abort()
        for upload in uploads:
            if upload.upload_id is not None and not upload.finished:
                try:
                    s3 = await _s3_client(self._fs, upload.bucket)
                    await s3.abort_multipart_upload(
                        Bucket=upload.bucket, Key=upload.key, UploadId=upload.upload_id
                    )
                except Exception as err:  # the driver's cleanup aborts it later
                    logger.info("could not abort the upload of %s: %s", upload.key, err)
        await self.close()


class S3Uploader:
    """Uploads one task's staged files; called from the task's threads.

    Guarantees: a file counts as uploaded (``flush`` returned) only once S3 holds it whole;
    on failure ``flush`` raises :class:`StagingError` naming the S3 error, and ``abort``
    aborts the started multipart uploads (best effort: the driver's cleanup aborts those
    of uncommitted files too).
    """

    def __init__(self, location: TableLocation, *, part_size: int, concurrency: int) -> None:
        self._fs = location.upload_filesystem()
        self._loop: asyncio.AbstractEventLoop = self._fs.loop
        self._part_size = part_size
        self._writer = _PartWriter(self._fs, concurrency=concurrency)
        self._uploads: list[_Upload] = []

    def open(self, path: str) -> UploadStream:
        """A write-only stream whose bytes become the object ``path`` (``bucket/key``)."""
        bucket, key = path.split("/", 1)
        upload = _Upload(bucket, key)
        self._uploads.append(upload)
        return UploadStream(self, upload, self._part_size)

    def _run(self, coroutine: Any, what: str) -> Any:
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        try:
            return future.result()
        except StagingError:
            raise
        except Exception as err:
            cause = err.__cause__ if isinstance(err, DeliveryError) and err.__cause__ else err
            retried = (
                " (still failing after every retry)"
                if isinstance(err, RetriesExhaustedError)
                else ""
            )
            raise StagingError(f"{what} failed{retried}: {type(cause).__name__}: {cause}") from err

    def _submit(self, request: _Request) -> None:
        """Queue one request; blocks while the writer's buffer is full (back-pressure)."""
        self._run(self._writer.write_entries([request]), f"uploading {request.upload.key!r}")

    def _close(self, upload: _Upload, tail: bytes) -> None:
        if upload.parts == 0:
            self._submit(_Request(upload, _Kind.PUT, body=tail))
            return
        if tail:
            upload.parts += 1
            self._submit(_Request(upload, _Kind.PART, upload.parts, tail))

        async def closed() -> None:
            upload.closed = True
            self._writer.complete_when_ready(upload)

        self._run(closed(), f"uploading {upload.key!r}")

    def flush(self) -> None:
        """Wait until every closed stream's object is complete.

        Raises:
            StagingError: an upload failed for good (the S3 error is its cause).
        """
        self._run(self._writer.flush_all(list(self._uploads)), "uploading staged files")

    def abort(self) -> None:
        """Stop uploading; abort the multipart uploads that were started (best effort)."""
        future = asyncio.run_coroutine_threadsafe(
            self._writer.abort_uploads(self._uploads), self._loop
        )
        try:
            future.result()
        except Exception as err:
            logger.info("aborting uploads: %s", err)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._writer.close(), self._loop).result()

    @property
    def metrics(self) -> Any:
        return self._writer.metrics


class UploadStream:
    """The file object a Parquet writer writes into: bytes are cut into parts as they come."""

    def __init__(self, uploader: S3Uploader, upload: _Upload, part_size: int) -> None:
        self._uploader = uploader
        self.upload = upload
        self._part_size = part_size
        self._buffer = bytearray()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._closed:
            raise ValueError("write to a closed upload stream")
        view = memoryview(data)
        self._buffer += view
        self.upload.size += view.nbytes
        if len(self._buffer) >= self._part_size:
            self.upload.parts += 1
            body, self._buffer = bytes(self._buffer), bytearray()
            self._uploader._submit(_Request(self.upload, _Kind.PART, self.upload.parts, body))
        return view.nbytes

    def tell(self) -> int:
        return self.upload.size

    def flush(self) -> None:
        pass  # parts go out when full; the tail on close

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        tail, self._buffer = bytes(self._buffer), bytearray()
        self._uploader._close(self.upload, tail)


async def _s3_client(fs: Any, bucket: str) -> Any:
    """The aiobotocore client of an s3fs filesystem, on its event loop."""
    await fs.set_session()  # creates the client once, refreshes a closed one
    return await fs.get_s3(bucket)


async def _abort_incomplete(s3: Any, bucket: str, prefix: str, keys: set[str]) -> int:
    """Abort every incomplete multipart upload under ``prefix`` whose key is in ``keys``;
    returns how many."""
    aborted = 0
    page = {"Bucket": bucket, "Prefix": prefix}
    while True:
        listing = await s3.list_multipart_uploads(**page)
        for item in listing.get("Uploads", []):
            if item["Key"] in keys:
                await s3.abort_multipart_upload(
                    Bucket=bucket, Key=item["Key"], UploadId=item["UploadId"]
                )
                aborted += 1
        if not listing.get("IsTruncated"):
            return aborted
        page["KeyMarker"] = listing["NextKeyMarker"]
        page["UploadIdMarker"] = listing["NextUploadIdMarker"]


async def _abort_uploads_of(s3: Any, bucket: str, key: str) -> None:
    """Abort the incomplete uploads of ``key`` (once its object is complete, any is stray).
    Best effort: what stays is empty and a lifecycle rule removes it."""
    try:
        await _abort_incomplete(s3, bucket, key, {key})
    except Exception as err:
        logger.info("could not abort stray uploads of %s: %s", key, err)


def abort_incomplete_uploads(location: TableLocation, relative_paths: Iterable[str]) -> int:
    """Abort the incomplete multipart uploads of ``relative_paths`` (files no commit
    references, named by the manifests of failed or killed attempts). Returns how many.

    Best effort: an error is logged, and the uploads stay until the bucket's lifecycle rule
    (``AbortIncompleteMultipartUpload``) removes them.
    """
    if not location.is_s3:
        return 0
    wanted = {location.path(relative).split("/", 1)[1] for relative in relative_paths}
    if not wanted:
        return 0
    fs = location.filesystem()

    async def abort() -> int:
        s3 = await _s3_client(fs, location.bucket)
        return await _abort_incomplete(s3, location.bucket, location.key_prefix, wanted)

    try:
        aborted: int = fsspec.asyn.sync(fs.loop, abort)
        return aborted
    except Exception as err:
        logger.warning(
            "could not abort incomplete uploads under %s (%s); a bucket lifecycle rule "
            "AbortIncompleteMultipartUpload removes them",
            location.uri,
            err,
        )
        return 0
