"""Reads and put-if-absent writes of the files in a table's ``_delta_log`` (moved out of
``_log_append``): the one place the sink's own log writers (:mod:`._log_append`,
:mod:`._log_rewrite`) and readers of its log view touch the log's files.

Guarantees: :meth:`LogStore.put_if_absent` creates a file only if no file of that name exists
(a hard link of a complete temporary file on a local file system; ``If-None-Match: *`` on S3)
and says whether it did; an S3 PUT whose outcome is unknown (a dropped connection, a timeout)
raises ``OSError`` saying so, never reports success or failure it does not know.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import pyarrow.parquet as pq

from committers.delta.storage._storage import TableLocation

__all__ = ["LAST_CHECKPOINT", "LOG_DIR", "LogStore", "LogViewUnavailable", "json_line"]

T = TypeVar("T")

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"


class LogViewUnavailable(Exception):
    """The log cannot be followed by probing (no table, a log cleaned before any checkpoint,
    a checkpoint format this view does not read): the caller uses delta-rs instead."""


def json_line(action: Mapping[str, Any]) -> str:
    # raw UTF-8 and no spaces, as serde_json writes (see the project notes on \uD8xx escapes)
    return json.dumps(action, separators=(",", ":"), ensure_ascii=False) + "\n"


class LogStore:
    """Reads and put-if-absent writes of files in a table's ``_delta_log``.

    Local tables use the file system directly; S3 tables use the location's s3fs client (its
    botocore client for the conditional PUT). Other schemes are not supported
    (:meth:`supports`): their commits go through delta-rs.
    """

    def __init__(self, location: TableLocation) -> None:
        self._location = location

    @staticmethod
    def supports(location: TableLocation) -> bool:
        return location.is_local or location.is_s3

    def _path(self, name: str) -> str:
        return self._location.path(f"{LOG_DIR}/{name}")

    def _key(self, name: str) -> str:
        """The S3 object key of ``_delta_log/<name>``."""
        return f"{self._location.key_prefix}/{LOG_DIR}/{name}".lstrip("/")

    def read(self, name: str) -> bytes | None:
        """The content of ``_delta_log/<name>``, or ``None`` if there is no such file (the
        probe: one open, or one GET, whatever the size of the log)."""
        try:
            if self._location.is_local:
                with open(self._path(name), "rb") as handle:
                    return handle.read()
        except FileNotFoundError:
            return None
        return self._get(name)

    def read_commits(self, first: int, count: int) -> list[bytes]:
        """The commit files of versions ``first``, ``first + 1``, ... up to ``count`` of them,
        stopping before the first missing one. On S3 the ``count`` GETs go out at once."""
        names = [f"{version:020d}.json" for version in range(first, first + count)]
        if self._location.is_local or count == 1:
            found = []
            for name in names:
                if (raw := self.read(name)) is None:
                    break
                found.append(raw)
            return found
        from fsspec.asyn import sync

        async def get_all() -> list[bytes | None]:
            return list(await asyncio.gather(*(self._get_async(name) for name in names)))

        raws: list[bytes | None] = self._translated(
            lambda: sync(self._location.filesystem().loop, get_all), first
        )
        return [r for r in itertools.takewhile(lambda raw: raw is not None, raws) if r is not None]

    def _get(self, name: str) -> bytes | None:
        """One GET through the location's S3 client (s3fs's ``cat_file`` would first ask for
        the size, and on a missing key list the prefix too: three requests per probe)."""
        from fsspec.asyn import sync

        fs = self._location.filesystem()
        raw: bytes | None = self._translated(lambda: sync(fs.loop, self._get_async, name), name)
        return raw

    async def _get_async(self, name: str) -> bytes | None:
        from botocore.exceptions import ClientError

        client = await self._location.filesystem().set_session()
        key = self._key(name)
        try:
            response = await client.get_object(Bucket=self._location.bucket, Key=key)
        except ClientError as err:
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 404 or err.response.get("Error", {}).get("Code") == "NoSuchKey":
                return None
            raise
        body = response["Body"]
        try:
            data: bytes = await body.read()
        finally:
            body.close()
        return data

    @staticmethod
    def _translated(call: Callable[[], T], what: object) -> T:
        """``call()``, its S3 client errors raised as ``OSError``."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return call()
        except (ClientError, BotoCoreError) as err:
            raise OSError(f"reading {LOG_DIR} at {what} failed: {err}") from err

    @property
    def uri(self) -> str:
        return self._location.uri

    def read_checkpoint(self, name: str) -> dict[str, Any]:
        """The ``protocol``, ``metaData`` (as JSON actions), ``txn`` entries (app id ->
        version) and ``domainMetadata`` actions (domain -> action) of checkpoint file
        ``name``: a Parquet checkpoint (only those columns are read) or a v2 checkpoint's
        JSON one (``<version>.checkpoint.<uuid>.json``). Its file actions, in the checkpoint
        or in sidecars, are not read.

        Raises:
            LogViewUnavailable: the checkpoint file is missing.
        """
        if name.endswith(".json"):
            raw = self.read(name)
            if raw is None:
                raise LogViewUnavailable(f"checkpoint {name} is missing")
            return _non_file_actions(map(json.loads, raw.splitlines()))
        path = self._path(name)
        try:
            opener = open if self._location.is_local else self._location.filesystem().open
            with opener(path, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                wanted = [c for c in _NON_FILE_ACTIONS if c in parquet.schema_arrow.names]
                columns = parquet.read(columns=wanted)
        except FileNotFoundError as err:
            raise LogViewUnavailable(f"checkpoint {name} is missing") from err
        return _non_file_actions(
            {kind: entry}
            for kind in wanted
            for entry in columns.column(kind).to_pylist()
            if entry is not None and any(v is not None for v in entry.values())
        )

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """Write ``_delta_log/<name>`` unless it exists, atomically: readers see all of it or
        nothing. Returns ``False`` if it existed (another writer won that version).

        Raises:
            OSError: the outcome is unknown (an S3 error other than 412 included); the caller
                reconciles.
        """
        if self._location.is_local:
            return self._link_if_absent(self._path(name), data)
        return self._conditional_put(name, data)

    @staticmethod
    def _link_if_absent(target: str, data: bytes) -> bool:
        directory = os.path.dirname(target)
        temporary = os.path.join(directory, f"_commit_{uuid.uuid4()}.json.tmp")  # as delta-rs
        try:
            with open(temporary, "xb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.link(temporary, target)  # atomic, and fails if the target exists
            return True
        except FileExistsError:
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)

    def _conditional_put(self, name: str, data: bytes) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError
        from fsspec.asyn import sync

        fs = self._location.filesystem()
        key = self._key(name)

        async def put() -> None:
            client = await fs.set_session()
            await client.put_object(
                Bucket=self._location.bucket, Key=key, Body=data, IfNoneMatch="*"
            )

        try:
            sync(fs.loop, put)
            return True
        except ClientError as err:
            status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 412 or err.response.get("Error", {}).get("Code") == "PreconditionFailed":
                return False
            raise OSError(f"PUT of {LOG_DIR}/{name} failed, outcome unknown: {err}") from err
        except BotoCoreError as err:  # a dropped connection or timeout: it may have landed
            raise OSError(f"PUT of {LOG_DIR}/{name} failed, outcome unknown: {err}") from err


_NON_FILE_ACTIONS = ("protocol", "metaData", "txn", "domainMetadata")


def _non_file_actions(actions: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What :meth:`LogStore.read_checkpoint` returns, from a checkpoint's actions."""
    found: dict[str, Any] = {}
    for action in actions:
        for kind, entry in action.items():
            if kind == "txn":
                found.setdefault("txn", {})[entry["appId"]] = int(entry["version"])
            elif kind == "domainMetadata":
                found.setdefault(kind, {})[entry["domain"]] = dict(entry)
            elif kind in ("protocol", "metaData"):
                found[kind] = _as_json_action(entry)
    return found


def _as_json_action(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint row (maps as lists of pairs) as the JSON action it stands for."""
    action = dict(entry)
    for key in ("configuration",):
        if isinstance(action.get(key), list):
            action[key] = dict(action[key])
    fmt = action.get("format")
    if isinstance(fmt, dict) and isinstance(fmt.get("options"), list):
        action["format"] = {**fmt, "options": dict(fmt["options"])}
    return action
