"""Opening, creating and inspecting the Delta table through delta-rs, with clear errors."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote as url_quote
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from committers.delta.storage._staging import STAGING_DIR, read_manifest
from committers.delta.storage._storage import ResolvedCredentials, TableLocation
from committers.delta.table._change_feed import CHANGE_DATA_DIR
from committers.delta.table._deletion_vectors import vector_path
from committers.delta.table._live_vectors import checkpoint_vector, live_adds, vector_of
from committers.delta.table._protocol import reader_features
from framework.errors import (
    ConfigurationError,
    DestinationError,
    LocationNotWritableError,
    NotATableError,
)

__all__ = [
    "COMMIT_APP_ID",
    "COMMIT_EPOCH_ID",
    "COMMIT_RUN_ID",
    "COMMIT_WRITER",
    "CleanupCandidates",
    "CommitRecord",
    "action_paths",
    "added_paths",
    "bytes_per_row",
    "check_cleanable",
    "cleanup_candidates",
    "delete_files",
    "file_mtime",
    "find_commit",
    "find_run",
    "is_cleanable_file",
    "live_paths",
    "open_existing_table",
    "open_table",
    "referenced_paths",
    "removal_times",
    "remove_orphan_files",
]

log = logging.getLogger("committers.delta")

# Keys of our entries in each commit's commitInfo. Never put credentials here.
COMMIT_APP_ID = "sink.appId"
COMMIT_EPOCH_ID = "sink.epochId"
COMMIT_WRITER = "sink.writerIdentity"
COMMIT_RUN_ID = "sink.runId"

_HISTORY_WINDOWS = (64, 4096)  # how far back to look for an epoch's commit (recovery only)


def bytes_per_row(table: DeltaTable) -> float | None:
    """Compressed bytes per row in the table's current files (None if it has no rows)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    rows = pc.sum(actions.column("num_records")).as_py() if actions.num_rows else 0
    if not rows:
        return None
    return float(pc.sum(actions.column("size_bytes")).as_py()) / rows


def _is_empty_or_missing(location: TableLocation) -> bool:
    fs = location.filesystem()
    root = location.path()
    try:
        entries = fs.ls(root, detail=False)
    except FileNotFoundError:
        return True
    except OSError as err:  # e.g. a parent is a file
        raise _not_writable(location, err) from err
    names = {entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries}
    ignorable = {STAGING_DIR, "_delta_log"}
    if STAGING_DIR in names and not names <= ignorable:
        # A first write that died before its commit left staged files; its manifests name
        # them, and the first commit's clean-up deletes them.
        ignorable |= _staged_top_level_names(location)
    return names <= ignorable


def _staged_top_level_names(location: TableLocation) -> set[str]:
    """First path segments of everything the staging manifests under the root name."""
    fs = location.filesystem()
    names: set[str] = set()
    for manifest in fs.find(location.path(STAGING_DIR)):
        if manifest.endswith(".json"):
            with contextlib.suppress(FileNotFoundError):
                listing = read_manifest(location, manifest)
                names |= {path.split("/", 1)[0] for path in listing.files | listing.directories}
    return names


def open_table(
    location: TableLocation, credentials: ResolvedCredentials | None = None
) -> DeltaTable | None:
    """The table at ``location``, or ``None`` if there is none yet (the sink then creates it
    with its first commit, so a failed first write leaves nothing behind). ``credentials``:
    those the handle is built with on S3 (resolved now if not given).

    Raises:
        NotATableError: the location holds files but no Delta log.
        LocationNotWritableError: the location cannot be read (credentials, bucket, path).
    """
    uri, options = location.uri, location.delta_storage_options(credentials)
    try:
        if DeltaTable.is_deltatable(uri, storage_options=options):
            return DeltaTable(uri, storage_options=options)
        if _is_empty_or_missing(location):
            return None
        # Another writer may have made the table since the look for its log: its first
        # commit then deleted the manifests that said its files were staged, not foreign.
        if DeltaTable.is_deltatable(uri, storage_options=options):
            return DeltaTable(uri, storage_options=options)
    except OSError as err:  # wrong credentials, missing bucket, unreachable endpoint
        raise _not_writable(location, err) from err
    raise NotATableError(
        f"{location.uri} holds files but is not a Delta table (no _delta_log). "
        "Point table_uri at an existing Delta table, an empty directory or a new path."
    )


def open_existing_table(location: TableLocation) -> DeltaTable:
    """The table at ``location``, at its latest version; unlike :func:`open_table` there must
    be one.

    Raises:
        NotATableError: there is no Delta log at the location (missing path included).
        DestinationError: the storage cannot be read (endpoint, bucket, credentials).
        ConfigurationError: the storage options cannot be resolved (e.g. an unknown profile).
    """
    uri, options = location.uri, location.delta_storage_options()
    try:
        if DeltaTable.is_deltatable(uri, storage_options=options):
            return DeltaTable(uri, storage_options=options)
    except (OSError, DeltaError) as err:
        raise DestinationError(f"cannot read {uri}: {plain_error_text(err)}") from err
    raise NotATableError(f"{uri} is not a Delta table: {_why_not_a_table(location)}")


def _why_not_a_table(location: TableLocation) -> str:
    with contextlib.suppress(OSError):
        if not location.filesystem().exists(location.path()):
            return "nothing exists at this path"
    return "no _delta_log found there"


def check_cleanable(table: DeltaTable, location: TableLocation, operation: str) -> None:
    """Deleting files is only safe where every reference to a file is read here.

    Raises:
        DestinationError: the table uses v2 checkpoints, whose references (checkpoint
            sidecars) are not read.
    """
    if "v2Checkpoint" in reader_features(table)[1]:
        raise DestinationError(
            f"{location.uri} uses v2Checkpoint; {operation} does not read the checkpoint "
            "sidecars it references and will not risk deleting live files. Use the VACUUM of "
            "an engine that supports them."
        )


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_XML_FIELD = re.compile(r"<(Code|Message)>([^<]*)</\1>")


def plain_error_text(err: BaseException) -> str:
    """An error's text for a message: without terminal colour codes, and with an S3 XML error
    body reduced to its code and message."""
    text = _ANSI_ESCAPE.sub("", str(err))
    if "<?xml" in text or "<Error>" in text:
        fields = dict((k, v) for k, v in _XML_FIELD.findall(text))
        head = re.split(r"<\?xml|<Error>", text, maxsplit=1)[0].rstrip(' :"')
        detail = ": ".join(fields[k] for k in ("Code", "Message") if k in fields)
        text = f"{head}: {detail}" if detail else head
    return " ".join(text.split())


def _not_writable(location: TableLocation, err: BaseException) -> LocationNotWritableError:
    return LocationNotWritableError(
        f"cannot create a Delta table at {location.uri}: {plain_error_text(err)}. Check that "
        "the path exists or can be created and that this process has write permission there."
    )


@dataclass(frozen=True)
class CommitRecord:
    """Our metadata of one commit, as found in the table history."""

    version: int
    epoch_id: int | None
    writer_identity: str | None
    run_id: str | None


def _recent_history(
    table: DeltaTable, windows: tuple[int, ...] = _HISTORY_WINDOWS
) -> Iterator[dict[str, Any]]:
    """The commitInfos of the newest commits, newest first: the newest ``windows[0]``, then
    (each time from the newest again) the next window, until the history ends."""
    for window in windows:
        if window <= 0:
            return
        yield from table.history(limit=window)
        if table.version() < window:
            return


def find_commit(
    table: DeltaTable, app_id: str, epoch_id: int
) -> tuple[CommitRecord | None, CommitRecord | None]:
    """Search the history, newest first, for ``app_id``'s commits.

    Returns ``(commit of epoch_id or None, newest commit of app_id or None)``. Only the most
    recent commits are searched (recovery paths only need those).
    """
    newest: CommitRecord | None = None
    for info in _recent_history(table):
        if info.get(COMMIT_APP_ID) != app_id:
            continue
        record = CommitRecord(
            version=int(info["version"]),
            epoch_id=int(info[COMMIT_EPOCH_ID]) if COMMIT_EPOCH_ID in info else None,
            writer_identity=info.get(COMMIT_WRITER),
            run_id=info.get(COMMIT_RUN_ID),
        )
        newest = newest or record
        if record.epoch_id == epoch_id:
            return record, newest
    return None, newest


def find_run(table: DeltaTable, run_id: str, *, after_version: int | None = None) -> int | None:
    """The version of the commit whose commitInfo carries ``run_id``, or ``None``.

    With ``after_version`` only the versions after it are read (none when the table is still
    there); without, the most recent commits are searched, as by :func:`find_commit`.
    """
    windows = _HISTORY_WINDOWS if after_version is None else (table.version() - after_version,)
    for info in _recent_history(table, windows):
        if info.get(COMMIT_RUN_ID) == run_id:
            return int(info["version"])
    return None


def _relative(path: str, location: TableLocation) -> str:
    path = unquote(path)
    root = location.uri.rstrip("/") + "/"
    for prefix in (root, "file://" + root):
        if path.startswith(prefix):
            return path[len(prefix) :]
    return path


def added_paths(location: TableLocation, version: int) -> set[str]:
    """Paths (relative, decoded) of the files added by commit ``version``: its data files,
    the files of their deletion vectors and its change files (``cdc`` actions)."""
    fs = location.filesystem()
    with fs.open(location.path(f"_delta_log/{version:020d}.json"), "rb") as src:
        lines = src.read().decode().splitlines()
    paths = set()
    for line in lines:
        action = json.loads(line) if line.strip() else {}
        for kind in ("add", "cdc"):
            if kind in action:
                paths |= action_paths(action[kind], location)
    return paths


def action_paths(action: Mapping[str, Any], location: TableLocation) -> set[str]:
    """The files (relative, decoded) an ``add``, ``remove`` or ``cdc`` action needs: its own
    and the file of its deletion vector when that is under the table root."""
    paths = {_relative(action["path"], location)}
    vector = vector_of(action, action["path"])
    if vector is not None:
        paths.add(vector_path(vector, location) or "")
    return paths - {""}


def _file_actions(location: TableLocation) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("add" | "remove" | "cdc", action)`` for every file action in the commits and
    checkpoints still in the log (the ones any reconstructable version is made of; change
    files are in commits only: checkpoints never carry ``cdc`` actions)."""
    fs = location.filesystem()
    # refresh: a cached listing (s3fs keeps one per process) would miss the newest commits
    for entry in fs.ls(location.path("_delta_log"), detail=False, refresh=True):
        name = entry.rsplit("/", 1)[-1]
        if name.endswith(".json") and name[:20].isdigit():
            with fs.open(entry, "rb") as src:
                for line in src.read().decode().splitlines():
                    action: dict[str, Any] = json.loads(line) if line.strip() else {}
                    for kind in ("add", "remove", "cdc"):
                        if kind in action:
                            yield kind, action[kind]
        elif ".checkpoint" in name and name.endswith(".parquet"):
            with fs.open(entry, "rb") as src:
                checkpoint = pq.read_table(src, columns=["add", "remove"])
            for kind in ("add", "remove"):
                for item in checkpoint.column(kind).to_pylist():
                    if item and item.get("path"):
                        vector = checkpoint_vector(item.get("deletionVector"))
                        yield kind, {**item, "deletionVector": vector}


def referenced_paths(location: TableLocation) -> set[str]:
    """Every file any reconstructable version (or tombstone) of the table mentions, the files
    of their deletion vectors included."""
    paths: set[str] = set()
    for _, action in _file_actions(location):
        paths |= action_paths(action, location)
    return paths


def removal_times(location: TableLocation) -> dict[str, int]:
    """The newest ``deletionTimestamp`` (milliseconds) of each file a remove action still in
    the log names (its data file and its deletion vector's file), by relative path; ``0`` for a
    remove without one (as old as can be, as delta-spark and delta-rs take it)."""
    removed: dict[str, int] = {}
    for kind, action in _file_actions(location):
        if kind == "remove":
            when = int(action.get("deletionTimestamp") or 0)
            for path in action_paths(action, location):
                removed[path] = max(when, removed.get(path, when))
    return removed


def live_paths(table: DeltaTable, location: TableLocation) -> set[str]:
    """The files of ``table``'s current version, relative to the root and decoded: its data
    files and the files of their deletion vectors."""
    if "deletionVectors" in reader_features(table)[1]:  # (delta-rs gives no vectors)
        paths: set[str] = set()
        for add in live_adds(location, table.version()).values():
            paths |= action_paths(add, location)
        return paths
    logged = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    return {_relative(path, location) for path in logged}


MIN_ORPHAN_RETENTION_SECONDS = 3600.0


# Characters delta-rs 1.6.6 writes unencoded in a log path (all others are %XX of UTF-8),
# as observed by committing removes of every ASCII character; pinned by a test.
_DELTA_RS_PATH_SAFE = "/!$&'()+,:;=@"


def delta_rs_path(decoded: str) -> str:
    """How delta-rs spells ``decoded`` (a relative path) in the log: it encodes every path it
    is given in an add or remove action this way."""
    return url_quote(decoded, safe=_DELTA_RS_PATH_SAFE)


def removal_path(logged: str) -> str | None:
    """The path to give ``RemoveAction`` so that delta-rs logs exactly ``logged`` (a path as
    the log holds it); ``None`` if delta-rs cannot spell it that way (another writer encoded
    it differently), so no remove of it would match."""
    decoded = unquote(logged)
    return decoded if delta_rs_path(decoded) == logged else None


def is_cleanable_file(relative: str, partition_by: Sequence[str] = ()) -> bool:
    """Whether the clean-ups (``remove_orphan_files``, VACUUM) consider the file at
    ``relative`` (to the table root) as the table's: a Parquet file or a deletion vector file
    (``deletion_vector_<uuid>.bin``) outside the log and the other hidden (``_``/``.``)
    directories of the table root. As in delta-spark's VACUUM, a directory of a partition
    column (``<column>=...``, of ``partition_by``) is never hidden, whatever its name starts
    with: the files under ``_2=a/`` of a table partitioned by ``_2`` are data; nor is
    ``_change_data/``, whose change files are the table's too."""
    name = relative.rsplit("/", 1)[-1]
    if not (name.endswith(".parquet") or _VECTOR_FILE.fullmatch(name)):
        return False
    top, _, below = relative.partition("/")
    if not top.startswith((".", "_")) or (top == CHANGE_DATA_DIR and below):
        return True
    column, is_partition_directory, _ = top.partition("=")
    return bool(below and is_partition_directory) and unquote(column) in partition_by


_VECTOR_FILE = re.compile(r"deletion_vector_[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}\.bin")


@dataclass(frozen=True)
class CleanupCandidates:
    """What a listing of the table root offers a clean-up.

    Attributes:
        files: relative path -> (fsspec path, listing entry) of the files older than the
            cutoff: entries of the staging directory, and data files
            (:func:`is_cleanable_file`).
        claimed: files a staging manifest younger than the cutoff names: their writer may
            still commit them.
    """

    files: dict[str, tuple[str, Mapping[str, Any]]]
    claimed: set[str]


def cleanup_candidates(
    location: TableLocation, *, cutoff: float, partition_columns: Sequence[str]
) -> CleanupCandidates:
    """List the table root once (see :class:`CleanupCandidates`); ``cutoff`` is a time in
    seconds since the epoch."""
    files: dict[str, tuple[str, Mapping[str, Any]]] = {}
    claimed: set[str] = set()
    for full, info in location.filesystem().find(location.path(), detail=True).items():
        relative = location.relative(full)
        young = file_mtime(info) > cutoff
        if relative.split("/", 1)[0] == STAGING_DIR:
            if young and relative.endswith(".json"):
                with contextlib.suppress(FileNotFoundError):
                    claimed |= read_manifest(location, full).files
            elif not young:
                files[relative] = (full, info)
        elif not young and is_cleanable_file(relative, partition_columns):
            files[relative] = (full, info)
    return CleanupCandidates(files, claimed)


def delete_files(fs: Any, paths: list[str]) -> None:
    """Delete ``paths`` (fsspec paths; one batched request on object stores); missing ones are
    fine."""
    if not paths:
        return
    try:
        fs.rm(paths)
    except FileNotFoundError:
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(path)


def remove_orphan_files(
    location: TableLocation,
    *,
    retention_seconds: float,
    dry_run: bool = False,
    unsafe_allow_short_retention: bool = False,
) -> list[str]:
    """Delete files under the table root that no table version references and that are older
    than ``retention_seconds``; return their relative paths.

    Considered: Parquet data files and deletion vector files outside ``_delta_log`` and hidden
    directories (a partition directory is not hidden, even ``_2=a/``), and our staging
    manifests. Never deleted: any file named by a commit or checkpoint still in the log (added
    or tombstoned, with the file of its deletion vector), any other kind of file (the log,
    files that are not the table's), files younger than the retention, and files listed by a
    staging manifest younger than the retention (a writer may still be about to commit them).

    Raises:
        ConfigurationError: retention shorter than an hour without the explicit override; a short
            retention can delete files a running writer has staged but not committed yet.
        DestinationError: the table uses v2 checkpoints, whose sidecars this cleanup does not
            read; it refuses rather than risk deleting live files.
    """
    if retention_seconds < MIN_ORPHAN_RETENTION_SECONDS and not unsafe_allow_short_retention:
        raise ConfigurationError(
            f"retention of {retention_seconds:.0f}s is shorter than "
            f"{MIN_ORPHAN_RETENTION_SECONDS:.0f}s: files a running writer staged but has not "
            "committed yet could be deleted. Use a longer retention, or pass "
            "unsafe_allow_short_retention=True when no writer is running."
        )
    table = DeltaTable(location.uri, storage_options=location.delta_storage_options())
    check_cleanable(table, location, "remove_orphan_files")
    listing = cleanup_candidates(
        location,
        cutoff=time.time() - retention_seconds,
        partition_columns=table.metadata().partition_columns,
    )
    # The log after the listing: a file listed and committed meanwhile is referenced.
    keep = referenced_paths(location) | listing.claimed
    removed = sorted(r for r in listing.files if r not in keep)
    if not dry_run:
        delete_files(location.filesystem(), [listing.files[r][0] for r in removed])
    return removed


def file_mtime(info: Mapping[str, Any]) -> float:
    """Modification time (seconds since the epoch) of an fsspec listing entry; now if unknown."""
    for key in ("mtime", "LastModified", "last_modified", "created"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        return float(value)
    return time.time()  # unknown age: treat as new, never delete
