"""``python -m committers.delta``: gather what is inside a Delta table the sink writes.

:func:`gather` reads one :class:`InspectReport` (who writes the table and how far each writer
got, recent commits, staged leftovers, file sizes, protocol and settings);
:func:`list_orphans` wraps :func:`remove_orphan_files`, as a dry run unless told otherwise.
Rendering is in ``_inspect_render.py``, the command line in ``_inspect_cli.py`` (see
``docs/inspect.md``).

The table is reached exactly as :class:`~committers.delta.DeltaSink` reaches it: through
:meth:`TableLocation.of`, so S3 endpoint, region and credentials come from the same environment
variables (``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ...).
Inspecting never writes anything.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from committers.delta.storage._staging import STAGING_DIR, read_manifest
from committers.delta.storage._storage import TableLocation
from committers.delta.table._live_vectors import table_deletion_vectors
from committers.delta.table._protocol import ENFORCED_FEATURES, TableFeatures
from committers.delta.table._snapshot import commit_times, reader_features
from committers.delta.table._table import (
    COMMIT_APP_ID,
    COMMIT_EPOCH_ID,
    COMMIT_RUN_ID,
    COMMIT_WRITER,
    file_mtime,
    is_cleanable_file,
    live_paths,
    open_existing_table,
    plain_error_text,
    referenced_paths,
    remove_orphan_files,
)
from committers.delta.write._options import DEFAULT_TARGET_FILE_SIZE
from framework.errors import DestinationError

__all__ = [
    "DEFAULT_APP_HISTORY",
    "DEFAULT_RECENT_COMMITS",
    "DEFAULT_SMALL_FILE_BYTES",
    "REPORT_VERSION",
    "InspectReport",
    "OrphanReport",
    "gather",
    "list_orphans",
]

#: Bumped when a JSON key changes meaning or disappears (new keys may appear without a bump).
#: 2: a commit's ``time`` is the time ``timestampAsOf`` resolves it by (its in-commit timestamp
#: or its commit file's), the writer's commitInfo time is ``commit_info_time``.
REPORT_VERSION = 2
DEFAULT_RECENT_COMMITS = 10
#: A file below a quarter of the sink's target file size (128 MiB) counts as small.
DEFAULT_SMALL_FILE_BYTES = DEFAULT_TARGET_FILE_SIZE // 4
#: Commits searched (newest first) for each app id's last commit; the txn alone gives its batch.
DEFAULT_APP_HISTORY = 1000
_FIRST_HISTORY_WINDOW = 64  # enough for most tables; the full search only if an app is missing

# delta-spark style metrics (the sink's too): files, rows and bytes an operation added.
_SPARK_FILES = ("numFiles", "numAddedFiles")
_SPARK_ROWS = "numOutputRows"
_SPARK_BYTES = ("numOutputBytes", "numAddedBytes")

# Features a legacy reader version implies (writer versions: see _protocol.TableFeatures).
_LEGACY_READER_FEATURES = {2: ("columnMapping",)}

_CHECKPOINT_NAME = re.compile(r"^(\d{20})\.checkpoint(?:\.[^/]+)?\.(parquet|json)$")
_COMMIT_NAME = re.compile(r"^(\d{20})\.json$")


# -- the report -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableInfo:
    uri: str
    version: int
    id: str
    name: str | None
    partition_columns: list[str]
    created_time: str | None


@dataclass(frozen=True)
class AppCommit:
    """The newest commit of one app id found in the history searched; ``time`` and
    ``commit_info_time`` as in :class:`CommitEntry`."""

    version: int
    batch: int | None
    writer_identity: str | None
    run_id: str | None
    time: str | None
    commit_info_time: str | None


@dataclass(frozen=True)
class AppWriter:
    """One app id writing the table: ``last_batch`` is its txn version (what the sink's replay
    check reads), ``last_commit`` its newest commit in the history searched (or ``None``)."""

    app_id: str
    last_batch: int | None
    txn_last_updated: str | None
    last_commit: AppCommit | None


@dataclass(frozen=True)
class AppsSection:
    history_searched: int
    entries: list[AppWriter]


@dataclass(frozen=True)
class CommitEntry:
    """One commit. ``time`` is the time ``timestampAsOf`` resolves this version by (its
    in-commit timestamp, else its commit file's modification time, in whole milliseconds, made
    strictly increasing): reading the
    table at that time reads this version; ``None`` when the commit file is gone.
    ``commit_info_time`` is the time the writer put in its commitInfo (usually a little
    earlier, when the commit was prepared). ``metrics_source`` says where the counts come
    from: ``"operationMetrics"`` (delta-spark style metrics in commitInfo) or ``"log"`` (its
    add actions in the commit file); ``rows_added`` is ``None`` when an added file has no
    ``numRecords``, every count is ``None`` when the commit file is gone."""

    version: int
    time: str | None
    commit_info_time: str | None
    operation: str | None
    app_id: str | None
    batch: int | None
    files_added: int | None
    rows_added: int | None
    bytes_added: int | None
    metrics_source: str


@dataclass(frozen=True)
class Leftover:
    """A file the sink (or remove-orphans, once old enough) would delete.

    ``kind``: ``"manifest"`` (a staging manifest), ``"staging"`` (any other file under the
    staging directory), ``"staged"`` (a file a manifest names that no table version references)
    or ``"unreferenced"`` (a Parquet data file no table version references and no manifest
    names). ``app_id``/``writer_identity``/``batch`` come from the manifest's location.
    """

    path: str
    kind: str
    bytes: int
    modified: str
    age_seconds: float
    app_id: str | None
    writer_identity: str | None
    batch: int | None


@dataclass(frozen=True)
class LeftoversSection:
    count: int
    bytes: int
    oldest_age_seconds: float | None
    entries: list[Leftover]


@dataclass(frozen=True)
class FilesSection:
    """The files of the current version. ``rows`` (the rows the version holds: the files'
    record counts less the rows their deletion vectors delete) is ``None`` if a file has no
    record count; ``small_file_ratio`` is ``None`` for a table without files;
    ``deletion_vectors``: files with one, ``deleted_rows``: the rows those delete."""

    count: int
    bytes: int
    rows: int | None
    small_file_threshold_bytes: int
    small_files: int
    small_file_ratio: float | None
    deletion_vectors: int = 0
    deleted_rows: int = 0


@dataclass(frozen=True)
class ProtocolSection:
    """Protocol versions and features. ``reader_features``/``writer_features`` are what the
    protocol lists (table features, versions 3/7); the ``effective_`` lists add what legacy
    versions imply. ``unsupported_by_sink``: writer features for which the sink refuses to
    append."""

    min_reader_version: int
    min_writer_version: int
    reader_features: list[str]
    writer_features: list[str]
    effective_reader_features: list[str]
    effective_writer_features: list[str]
    unsupported_by_sink: list[str]


@dataclass(frozen=True)
class Settings:
    """Notable table properties; ``None`` means not set (readers use their default)."""

    column_mapping_mode: str
    deletion_vectors: bool
    checkpoint_interval: int | None
    set_transaction_retention_duration: str | None
    log_retention_duration: str | None
    deleted_file_retention_duration: str | None
    append_only: bool
    change_data_feed: bool


@dataclass(frozen=True)
class InspectReport:
    """Everything ``inspect`` prints, as gathered at ``generated_at`` (UTC)."""

    report_version: int
    generated_at: str
    table: TableInfo
    apps: AppsSection
    commits: list[CommitEntry]
    staged_leftovers: LeftoversSection
    files: FilesSection
    protocol: ProtocolSection
    settings: Settings
    configuration: dict[str, str]


# -- opening ----------------------------------------------------------------------------------


# -- gathering --------------------------------------------------------------------------------


def gather(
    location: TableLocation,
    *,
    recent_commits: int = DEFAULT_RECENT_COMMITS,
    small_file_bytes: int = DEFAULT_SMALL_FILE_BYTES,
    app_history: int = DEFAULT_APP_HISTORY,
    now: float | None = None,
) -> InspectReport:
    """Read the table at ``location`` and its directory into a report; writes nothing.

    Args:
        recent_commits: how many of the newest commits to list.
        small_file_bytes: files smaller than this count as small.
        app_history: how many of the newest commits to search for each app id's last commit.
        now: the time ages are measured from (seconds since the epoch; default: now).

    Raises:
        NotATableError, DestinationError: see ``_table.open_existing_table``; also
            ``DestinationError`` when reading fails part way.
    """
    now = time.time() if now is None else now
    table = open_existing_table(location)
    try:
        return _gather(location, table, recent_commits, small_file_bytes, app_history, now)
    except (OSError, DeltaError) as err:
        raise DestinationError(
            f"cannot read {location.uri} completely: {plain_error_text(err)}"
        ) from err


def _gather(
    location: TableLocation,
    table: DeltaTable,
    recent_commits: int,
    small_file_bytes: int,
    app_history: int,
    now: float,
) -> InspectReport:
    version = table.version()
    metadata = table.metadata()
    configuration = {str(k): str(v) for k, v in (metadata.configuration or {}).items()}
    transactions = _app_transactions(location, version)
    history = _history(table, recent_commits, app_history, set(transactions))
    times = commit_times(location)
    return InspectReport(
        report_version=REPORT_VERSION,
        generated_at=_iso(now),
        table=TableInfo(
            uri=location.uri,
            version=version,
            id=str(metadata.id),
            name=metadata.name,
            partition_columns=list(metadata.partition_columns),
            created_time=_iso_ms(metadata.created_time),
        ),
        apps=_apps(table, transactions, history, times, searched=len(history)),
        commits=[_commit_entry(location, info, times) for info in history[:recent_commits]],
        staged_leftovers=_staged_leftovers(location, table, now),
        files=_files(table, location, small_file_bytes),
        protocol=_protocol(table),
        settings=_settings(configuration),
        configuration=dict(sorted(configuration.items())),
    )


def _history(
    table: DeltaTable, recent_commits: int, app_history: int, app_ids: set[str]
) -> list[dict[str, Any]]:
    """The newest commits, newest first: enough for the commit list, and searched deeper (up to
    ``app_history``) only while a txn app id has no commit in what was read."""
    first = max(recent_commits, min(_FIRST_HISTORY_WINDOW, app_history))
    history = table.history(limit=first)
    found = {info.get(COMMIT_APP_ID) for info in history}
    if app_ids - found and len(history) == first and app_history > first:
        history = table.history(limit=app_history)
    return history


@dataclass(frozen=True)
class _Txn:
    version: int
    last_updated: int | None


def _app_transactions(location: TableLocation, version: int) -> dict[str, _Txn]:
    """The ``txn`` actions of ``version``: its newest checkpoint, then the commits after it.

    delta-rs answers ``transaction_version(app_id)`` but cannot list the app ids, so the log is
    read here (the same files any Delta reader replays)."""
    fs = location.filesystem()
    commits: dict[int, str] = {}
    checkpoints: dict[int, list[str]] = {}
    for entry in fs.ls(location.path("_delta_log"), detail=False):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if match := _COMMIT_NAME.match(name):
            commits[int(match.group(1))] = entry
        elif match := _CHECKPOINT_NAME.match(name):
            checkpoints.setdefault(int(match.group(1)), []).append(entry)
    start = max((v for v in checkpoints if v <= version), default=-1)
    transactions: dict[str, _Txn] = {}
    for part in checkpoints.get(start, []):
        for txn in _checkpoint_txns(fs, part):
            _apply_txn(transactions, txn)
    for commit in sorted(v for v in commits if start < v <= version):
        for action in _json_actions(fs, commits[commit]):
            if "txn" in action:
                _apply_txn(transactions, action["txn"])
    return transactions


def _apply_txn(transactions: dict[str, _Txn], txn: Mapping[str, Any]) -> None:
    last_updated = txn.get("lastUpdated")
    transactions[str(txn["appId"])] = _Txn(
        int(txn["version"]), None if last_updated is None else int(last_updated)
    )


def _checkpoint_txns(fs: Any, path: str) -> list[Mapping[str, Any]]:
    if path.endswith(".json"):  # a v2 checkpoint in JSON form
        return [a["txn"] for a in _json_actions(fs, path) if "txn" in a]
    with fs.open(path, "rb") as src:
        schema = pq.read_schema(src)
        if "txn" not in schema.names:
            return []
        src.seek(0)
        column = pq.read_table(src, columns=["txn"]).column("txn")
    return [txn for txn in column.to_pylist() if txn and txn.get("appId") is not None]


def _json_actions(fs: Any, path: str) -> list[dict[str, Any]]:
    with fs.open(path, "rb") as src:
        lines = src.read().decode().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def _apps(
    table: DeltaTable,
    transactions: Mapping[str, _Txn],
    history: list[dict[str, Any]],
    times: Mapping[int, float],
    searched: int,
) -> AppsSection:
    newest: dict[str, AppCommit] = {}
    for info in history:  # newest first
        app_id = info.get(COMMIT_APP_ID)
        if app_id is not None and str(app_id) not in newest:
            version = int(info["version"])
            newest[str(app_id)] = AppCommit(
                version=version,
                batch=_int_or_none(info.get(COMMIT_EPOCH_ID)),
                writer_identity=info.get(COMMIT_WRITER),
                run_id=info.get(COMMIT_RUN_ID),
                time=_commit_time(times, info),
                commit_info_time=_iso_ms(info.get("timestamp")),
            )
    entries = []
    for app_id in sorted(set(transactions) | set(newest)):
        txn = transactions.get(app_id)
        entries.append(
            AppWriter(
                app_id=app_id,
                # delta-rs's answer, as the sink's replay check reads it (an expired txn is None)
                last_batch=table.transaction_version(app_id) if txn else None,
                txn_last_updated=_iso_ms(txn.last_updated) if txn else None,
                last_commit=newest.get(app_id),
            )
        )
    return AppsSection(history_searched=searched, entries=entries)


def _commit_time(times: Mapping[int, float], info: Mapping[str, Any]) -> str | None:
    """The time ``timestampAsOf`` resolves the commit ``info`` by: its in-commit timestamp,
    else its commit file's time (see ``CommitClock``)."""
    if info.get("inCommitTimestamp") is not None:
        return _iso_ms(info["inCommitTimestamp"])
    stamp = times.get(int(info["version"]))
    return None if stamp is None else _iso(stamp)


def _commit_entry(
    location: TableLocation, info: Mapping[str, Any], times: Mapping[int, float]
) -> CommitEntry:
    version = int(info["version"])
    counts = _spark_metrics(info.get("operationMetrics") or {})
    source = "operationMetrics"
    if counts is None:
        counts, source = _logged_counts(location, version), "log"
    files, rows, size = counts
    return CommitEntry(
        version=version,
        time=_commit_time(times, info),
        commit_info_time=_iso_ms(info.get("timestamp")),
        operation=info.get("operation"),
        app_id=info.get(COMMIT_APP_ID),
        batch=_int_or_none(info.get(COMMIT_EPOCH_ID)),
        files_added=files,
        rows_added=rows,
        bytes_added=size,
        metrics_source=source,
    )


_Counts = tuple[int | None, int | None, int | None]  # files, rows, bytes (None: unknown)


def _spark_metrics(metrics: Mapping[str, Any]) -> _Counts | None:
    """(files, rows, bytes) from delta-spark style metrics (string values), if all are there.

    delta-rs's own metrics name no bytes, so its commits are counted from the log."""
    files = _int_or_none(next((metrics[k] for k in _SPARK_FILES if k in metrics), None))
    rows = _int_or_none(metrics.get(_SPARK_ROWS))
    size = _int_or_none(next((metrics[k] for k in _SPARK_BYTES if k in metrics), None))
    if files is None or rows is None or size is None:
        return None
    return files, rows, size


def _logged_counts(location: TableLocation, version: int) -> _Counts:
    """(files, rows, bytes) of the add actions in commit ``version``'s file; all ``None`` if
    log clean-up removed the file since the history was read."""
    path = location.path(f"_delta_log/{version:020d}.json")
    try:
        actions = _json_actions(location.filesystem(), path)
    except FileNotFoundError:
        return None, None, None
    adds = [a["add"] for a in actions if "add" in a]
    rows: int | None = 0
    for add in adds:
        records = _num_records(add.get("stats"))
        rows = None if rows is None or records is None else rows + records
    return len(adds), rows, sum(int(add.get("size") or 0) for add in adds)


def _num_records(stats: str | None) -> int | None:
    if not stats:
        return None
    try:
        value = json.loads(stats).get("numRecords")
    except (ValueError, AttributeError):
        return None
    return _int_or_none(value)


def _staged_leftovers(location: TableLocation, table: DeltaTable, now: float) -> LeftoversSection:
    """Files under the table root that the sink's clean-up or remove-orphans would delete
    (whatever their age): staging manifests and other staging files, files the manifests name
    that no table version references, and unreferenced Parquet data files."""
    listing = _listing(location)
    owners: dict[str, _Owner] = {}  # file named by a manifest -> the manifest's owner
    entries: list[Leftover] = []
    for relative, info in listing.items():
        if relative.split("/", 1)[0] != STAGING_DIR:
            continue
        owner = _manifest_owner(relative)
        is_manifest = relative.endswith(".json")
        entries.append(
            _leftover(relative, "manifest" if is_manifest else "staging", info, now, owner)
        )
        if is_manifest:
            with contextlib.suppress(FileNotFoundError):
                for named in read_manifest(location, location.path(relative)).files:
                    owners.setdefault(named, owner)
    partition_by = table.metadata().partition_columns
    data = {r for r in listing if is_cleanable_file(r, partition_by) or r in owners}
    for relative in sorted(data - _referenced(location, table, data)):
        if relative in owners:
            entries.append(_leftover(relative, "staged", listing[relative], now, owners[relative]))
        else:
            entries.append(_leftover(relative, "unreferenced", listing[relative], now, None))
    entries.sort(key=lambda e: (-e.age_seconds, e.path))
    return LeftoversSection(
        count=len(entries),
        bytes=sum(e.bytes for e in entries),
        oldest_age_seconds=max((e.age_seconds for e in entries), default=None),
        entries=entries,
    )


def _listing(location: TableLocation) -> dict[str, Mapping[str, Any]]:
    """Every file under the table root (relative path -> its fsspec listing entry)."""
    found = location.filesystem().find(location.path(), detail=True)
    return {location.relative(full): info for full, info in found.items()}


def _file_bytes(info: Mapping[str, Any]) -> int:
    return int(info.get("size") or 0)


def _referenced(location: TableLocation, table: DeltaTable, paths: set[str]) -> set[str]:
    """Which of ``paths`` some table version references. The current files answer most; the
    whole log (older versions, tombstones) is read only for the others."""
    current = live_paths(table, location)
    if paths <= current:
        return set(paths)
    return paths & (current | referenced_paths(location))


_Owner = tuple[str | None, str | None, int | None]  # app id, writer identity, batch


def _manifest_owner(relative: str) -> _Owner:
    """(app id, writer identity, batch) of a path ``_sink_staging/<app>/<writer>/<batch>/...``."""
    parts = relative.split("/")
    if len(parts) < 5:
        return None, None, None
    return unquote(parts[1]), unquote(parts[2]), _int_or_none(parts[3])


def _leftover(
    relative: str,
    kind: str,
    info: Mapping[str, Any],
    now: float,
    owner: _Owner | None,
) -> Leftover:
    modified = file_mtime(info)
    app_id, writer, batch = owner or (None, None, None)
    return Leftover(
        path=relative,
        kind=kind,
        bytes=_file_bytes(info),
        modified=_iso(modified),
        age_seconds=round(max(0.0, now - modified), 3),
        app_id=app_id,
        writer_identity=writer,
        batch=batch,
    )


def _files(table: DeltaTable, location: TableLocation, small_file_bytes: int) -> FilesSection:
    actions = pa.table(table.get_add_actions(flatten=True))
    sizes = [int(s) for s in actions.column("size_bytes").to_pylist()] if actions.num_rows else []
    records = actions.column("num_records").to_pylist() if actions.num_rows else []
    small = sum(1 for size in sizes if size < small_file_bytes)
    vectors = table_deletion_vectors(location, reader_features(table)[1], table.version())
    deleted = sum(v.cardinality for v in vectors.values())
    return FilesSection(
        count=len(sizes),
        bytes=sum(sizes),
        rows=None if None in records else sum(int(r) for r in records) - deleted,
        small_file_threshold_bytes=small_file_bytes,
        small_files=small,
        small_file_ratio=round(small / len(sizes), 4) if sizes else None,
        deletion_vectors=len(vectors),
        deleted_rows=deleted,
    )


def _protocol(table: DeltaTable) -> ProtocolSection:
    protocol = table.protocol()
    reader = sorted(protocol.reader_features or [])
    writer = sorted(protocol.writer_features or [])
    effective_writer = TableFeatures.of(protocol.min_writer_version, writer).enabled
    if protocol.min_reader_version >= 3:
        effective_reader = set(reader)
    else:
        effective_reader = {
            feature
            for version, features in _LEGACY_READER_FEATURES.items()
            if protocol.min_reader_version >= version
            for feature in features
        }
    return ProtocolSection(
        min_reader_version=protocol.min_reader_version,
        min_writer_version=protocol.min_writer_version,
        reader_features=reader,
        writer_features=writer,
        effective_reader_features=sorted(effective_reader),
        effective_writer_features=sorted(effective_writer),
        unsupported_by_sink=sorted(effective_writer - ENFORCED_FEATURES.keys()),
    )


def _settings(configuration: Mapping[str, str]) -> Settings:
    def flag(key: str) -> bool:
        return configuration.get(key, "false").strip().lower() == "true"

    return Settings(
        column_mapping_mode=configuration.get("delta.columnMapping.mode", "none"),
        deletion_vectors=flag("delta.enableDeletionVectors"),
        checkpoint_interval=_int_or_none(configuration.get("delta.checkpointInterval")),
        set_transaction_retention_duration=configuration.get(
            "delta.setTransactionRetentionDuration"
        ),
        log_retention_duration=configuration.get("delta.logRetentionDuration"),
        deleted_file_retention_duration=configuration.get("delta.deletedFileRetentionDuration"),
        append_only=flag("delta.appendOnly"),
        change_data_feed=flag("delta.enableChangeDataFeed"),
    )


# -- remove-orphans ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OrphanFile:
    path: str
    bytes: int | None  # None if it vanished before it could be measured


@dataclass(frozen=True)
class OrphanReport:
    """What remove-orphans found (``dry_run``) or deleted."""

    table: str
    dry_run: bool
    retention_seconds: float
    count: int
    bytes: int
    files: list[OrphanFile] = field(default_factory=list)


def list_orphans(
    location: TableLocation,
    *,
    retention_seconds: float,
    dry_run: bool = True,
    unsafe_allow_short_retention: bool = False,
) -> OrphanReport:
    """Run :func:`remove_orphan_files` (a dry run by default) and measure what it names.

    Sizes are taken from a listing made just before, so deleted files still have theirs.

    Raises:
        NotATableError, DestinationError: see ``_table.open_existing_table``; also when the
            table uses features remove_orphan_files refuses (v2 checkpoints).
        ConfigurationError: a retention below an hour without ``unsafe_allow_short_retention``.
    """
    open_existing_table(location)
    try:
        sizes = {relative: _file_bytes(info) for relative, info in _listing(location).items()}
        paths = remove_orphan_files(
            location,
            retention_seconds=retention_seconds,
            dry_run=dry_run,
            unsafe_allow_short_retention=unsafe_allow_short_retention,
        )
    except (OSError, DeltaError) as err:
        raise DestinationError(f"cannot clean {location.uri}: {plain_error_text(err)}") from err
    files = [OrphanFile(path, sizes.get(path)) for path in paths]
    return OrphanReport(
        table=location.uri,
        dry_run=dry_run,
        retention_seconds=retention_seconds,
        count=len(files),
        bytes=sum(f.bytes or 0 for f in files),
        files=files,
    )


# -- value helpers ----------------------------------------------------------------------------


def _int_or_none(value: Any) -> int | None:
    try:
        return None if value is None or isinstance(value, bool) else int(value)
    except (TypeError, ValueError):
        return None


def _iso(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _iso_ms(milliseconds: Any) -> str | None:
    value = _int_or_none(milliseconds)
    return None if value is None else _iso(value / 1000)
