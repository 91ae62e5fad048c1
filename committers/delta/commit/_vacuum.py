"""VACUUM: delete the files a Delta table no longer needs, as delta-spark's ``VACUUM`` and
delta-rs's ``vacuum()`` do, for every layout the sink writes.

Deleted, if their modification time is older than the retention too:

* **removed files**: files not in the current version whose removal (the newest
  ``deletionTimestamp`` of a remove action still in the log) is older than the retention:
  what an overwrite, an upsert or a compaction replaced. Time travel to any version within the
  retention keeps working: a file such a version reads is live, or was removed after that
  version, so within the retention;
* **unreferenced files**: data files no version names (what crashed writers left), and
  **staging** entries under ``_sink_staging/``, as :func:`remove_orphan_files` finds them;
* **change files** under ``_change_data/`` (the change data feed's): as delta-spark's VACUUM,
  by their age alone, committed or not. A change file is written with its commit, so the
  versions within the retention keep theirs.

Never deleted: the log; files a staging manifest younger than the retention names (a writer
may still commit them); other kinds of files than Parquet; anything in directories named
``_…`` or ``.…`` except ``_change_data/`` and the Hive directories of the table's own
partition columns (``_x=1/`` for a column ``_x``), anywhere else at any depth (the sink's run
directories ``batch-<n>-<run>/``, Spark's ``_temporary`` inside them); empty directories
other than the sink's run directories a vacuum empties (those are removed on local file
systems, as delta-spark removes empty directories; a run directory is never written again,
while another writer may be about to write into an empty partition directory; object stores
have no directories). Tables with v2 checkpoints are refused.

Deletion vector files (``deletion_vector_<uuid>.bin``) are files of the table like the data
files, as in delta-spark's VACUUM: live while a file of the current version has its vector
there (one vector file holds the vectors of many data files), removed when the newest remove
naming it is older than the retention, unreferenced when no action in the log names it.

The retention is the table's ``delta.deletedFileRetentionDuration`` (7 days if not set) unless
given; a shorter one (or one under an hour) is refused unless forced, as delta-spark's
``retentionDurationCheck`` and delta-rs's ``enforce_retention_duration`` do: readers of older
versions, and writers that staged files but have not committed them, could lose files.

The log: the removed files the current snapshot still lists as tombstones are deleted by
delta-rs's own ``vacuum()`` (lite mode, at this retention), which commits ``VACUUM START`` and
``VACUUM END`` with delta-spark's parameters and metrics; our commitInfo keys add
``sink.operation: "vacuum"``, the run id and ``sink.otherFilesDeleted`` (what was deleted just
before: files the snapshot no longer lists). delta-rs's ``vacuum()`` alone would not do: a
checkpoint drops the tombstones older than the table's retention, after which it never finds
those files again, and its full mode deletes unreferenced files whatever their age (staged
files of running writers too). delta-rs writes no VACUUM commit through its Python API
otherwise, so a vacuum that deletes no data file the snapshot lists as removed leaves no
commit (its vacuum deletes no deletion vector files: the sink deletes those itself). On tables
delta-rs refuses to commit to (column defaults, in-commit timestamps: ``DELTA_RS_REFUSES``),
the sink deletes those files too and the vacuum leaves no commit, which the protocol allows
(delta-spark's VACUUM commits are its audit log, ``vacuum.logging.enabled``).
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass, field
from urllib.parse import unquote

from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties
from deltalake.exceptions import DeltaError

from committers.delta.commit._sequence import delta_rs_commits
from committers.delta.spark._spark_staging import is_run_directory
from committers.delta.storage._staging import STAGING_DIR
from committers.delta.storage._storage import TableLocation
from committers.delta.table._change_feed import CHANGE_DATA_DIR
from committers.delta.table._table import (
    COMMIT_RUN_ID,
    MIN_ORPHAN_RETENTION_SECONDS,
    check_cleanable,
    cleanup_candidates,
    delete_files,
    live_paths,
    open_existing_table,
    plain_error_text,
    removal_times,
)
from framework.errors import ConfigurationError, DestinationError

__all__ = [
    "DEFAULT_DELETED_FILE_RETENTION_SECONDS",
    "VacuumFile",
    "VacuumReport",
    "interval_seconds",
    "vacuum_table",
]

log = logging.getLogger("committers.delta")

#: The protocol's default of ``delta.deletedFileRetentionDuration``: one week.
DEFAULT_DELETED_FILE_RETENTION_SECONDS = 7 * 86400.0
RETENTION_PROPERTY = "delta.deletedFileRetentionDuration"
#: commitInfo keys of a vacuum's commits (with ``sink.runId``).
COMMIT_OPERATION = "sink.operation"
COMMIT_OTHER_FILES = "sink.otherFilesDeleted"
_POST_COMMIT = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)
_INTERVAL_UNITS = {
    "nanosecond": 1e-9,
    "microsecond": 1e-6,
    "millisecond": 1e-3,
    "second": 1.0,
    "minute": 60.0,
    "hour": 3600.0,
    "day": 86400.0,
    "week": 7 * 86400.0,
}


@dataclass(frozen=True)
class VacuumFile:
    """A file a vacuum deletes (or would, in a dry run).

    ``kind``: ``"removed"`` (no longer in the table, removed before the retention),
    ``"unreferenced"`` (a data file no version names), ``"change"`` (a change file under
    ``_change_data/`` older than the retention) or ``"staging"`` (an entry of the staging
    directory). ``removed_at``: when a ``"removed"`` file was removed (ISO 8601 UTC).
    """

    path: str
    kind: str
    bytes: int
    removed_at: str | None = None


@dataclass(frozen=True)
class VacuumReport:
    """What a vacuum found (``dry_run``) or deleted; ``log_versions`` are the versions of the
    ``VACUUM START``/``VACUUM END`` commits it made (none in a dry run, or when it deleted no
    file the snapshot lists as removed)."""

    table: str
    dry_run: bool
    retention_seconds: float
    table_retention_seconds: float
    count: int
    bytes: int
    files: list[VacuumFile] = field(default_factory=list)
    log_versions: list[int] = field(default_factory=list)


def interval_seconds(text: str) -> float:
    """Seconds in a Delta interval property, e.g. ``"interval 7 days"``, ``"interval 1 hour
    30 minutes"`` (units from nanoseconds to weeks, singular or plural).

    Raises:
        ValueError: not such an interval.
    """
    words = text.strip().lower().split()
    if words[:1] == ["interval"]:
        words = words[1:]
    if not words or len(words) % 2:
        raise ValueError(f"not an interval: {text!r}")
    total = 0.0
    for number, unit in zip(words[::2], words[1::2], strict=True):
        factor = _INTERVAL_UNITS.get(unit) or _INTERVAL_UNITS.get(unit.removesuffix("s"))
        if factor is None:
            raise ValueError(f"not an interval: {text!r} (unknown unit {unit!r})")
        total += float(number) * factor
    return total


def table_retention_seconds(table: DeltaTable, location: TableLocation) -> float:
    """The table's ``delta.deletedFileRetentionDuration`` in seconds (7 days if not set).

    Raises:
        DestinationError: the property is set to something that is not an interval.
    """
    text = (table.metadata().configuration or {}).get(RETENTION_PROPERTY)
    if text is None:
        return DEFAULT_DELETED_FILE_RETENTION_SECONDS
    try:
        return interval_seconds(str(text))
    except ValueError as err:
        raise DestinationError(
            f"{location.uri} has {RETENTION_PROPERTY}={text!r}, which is not an interval "
            "(e.g. 'interval 7 days'), so how long removed files must stay is unknown; fix the "
            "property before vacuuming."
        ) from err


def _check_retention(retention: float, table_retention: float, forced: bool) -> None:
    """Raises ConfigurationError for a retention the table or running writers forbid."""
    if retention < 0 or math.isnan(retention):
        raise ConfigurationError(f"retention must be a duration >= 0, got {retention}s")
    if forced:
        return
    if retention < table_retention:
        raise ConfigurationError(
            f"retention of {_duration(retention)} is shorter than the table's "
            f"{RETENTION_PROPERTY} ({_duration(table_retention)}): a reader of a version within "
            "that time (time travel, a stream behind) would lose the files it reads, so it is "
            "refused as delta-spark's retentionDurationCheck refuses it. Use a retention of at "
            f"least {_duration(table_retention)}, or pass unsafe_allow_short_retention=True "
            "when nothing reads older versions and no writer is running."
        )
    if retention < MIN_ORPHAN_RETENTION_SECONDS:
        raise ConfigurationError(
            f"retention of {_duration(retention)} is shorter than one hour: files a running "
            "writer staged but has not committed yet could be deleted. Use a longer retention, "
            "or pass unsafe_allow_short_retention=True when no writer is running."
        )


def vacuum_table(
    location: TableLocation,
    *,
    retention_seconds: float | None = None,
    dry_run: bool = True,
    unsafe_allow_short_retention: bool = False,
) -> VacuumReport:
    """Delete (or, by default, only list) the files the table no longer needs; see the
    module docstring for which.

    Args:
        retention_seconds: how long removed and unreferenced files are kept; ``None``: the
            table's ``delta.deletedFileRetentionDuration`` (7 days if not set).
        dry_run: list only (the default); ``False`` deletes.
        unsafe_allow_short_retention: allow a retention shorter than the table's (or than an
            hour): only when nothing reads older versions and no writer is running.

    Raises:
        NotATableError: there is no Delta table at ``location``.
        ConfigurationError: a negative retention, or one shorter than the table's or than an
            hour without ``unsafe_allow_short_retention``; nothing deleted.
        DestinationError: the table uses v2 checkpoints, has a malformed
            retention property, or the storage cannot be read or written (files deleted up to
            that point stay deleted; the table's versions within the retention stay readable).
    """
    table = open_existing_table(location)
    table_retention = table_retention_seconds(table, location)
    retention = table_retention if retention_seconds is None else float(retention_seconds)
    _check_retention(retention, table_retention, unsafe_allow_short_retention)
    check_cleanable(table, location, "vacuum")
    try:
        files, paths = _plan(location, table, time.time() - retention)
        versions: list[int] = []
        if not dry_run and files:
            versions = _delete(location, table, files, paths, retention)
    except (OSError, DeltaError) as err:
        raise DestinationError(f"cannot vacuum {location.uri}: {plain_error_text(err)}") from err
    return VacuumReport(
        table=location.uri,
        dry_run=dry_run,
        retention_seconds=retention,
        table_retention_seconds=table_retention,
        count=len(files),
        bytes=sum(f.bytes for f in files),
        files=files,
        log_versions=versions,
    )


def _plan(
    location: TableLocation, table: DeltaTable, cutoff: float
) -> tuple[list[VacuumFile], dict[str, str]]:
    """The files to delete, and their fsspec paths. The snapshot and the log are read after
    the listing, so a file committed meanwhile is live, not deleted."""
    listing = cleanup_candidates(
        location, cutoff=cutoff, partition_columns=table.metadata().partition_columns
    )
    table.update_incremental()
    live = live_paths(table, location)
    removed_at = removal_times(location)
    cutoff_ms = cutoff * 1000
    files: list[VacuumFile] = []
    for relative in sorted(listing.files):
        if relative in live or relative in listing.claimed:
            continue
        when = removed_at.get(relative)
        if when is not None and when >= cutoff_ms:
            continue  # a version within the retention reads it
        size = int(listing.files[relative][1].get("size") or 0)
        top = relative.split("/", 1)[0]
        if top == STAGING_DIR:
            files.append(VacuumFile(relative, "staging", size))
        elif top == CHANGE_DATA_DIR:  # as delta-spark: change files expire by their age
            files.append(VacuumFile(relative, "change", size))
        elif when is None:
            files.append(VacuumFile(relative, "unreferenced", size))
        else:
            files.append(VacuumFile(relative, "removed", size, _iso(when)))
    return files, {relative: entry[0] for relative, entry in listing.files.items()}


def _delete(
    location: TableLocation,
    table: DeltaTable,
    files: list[VacuumFile],
    paths: dict[str, str],
    retention: float,
) -> list[int]:
    """Delete ``files``: the ones the snapshot lists as removed through delta-rs's vacuum,
    which records it in the log, after the others. Returns the versions it committed."""
    planned = {f.path for f in files}
    hours = math.ceil(retention / 3600)  # delta-rs takes whole hours: never less than ours
    tombstoned: set[str] = set()
    # (delta-rs refuses to commit to some tables: the sink deletes all, and commits nothing)
    if any(f.kind == "removed" for f in files) and delta_rs_commits(table):
        found = table.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False)
        tombstoned = {unquote(path) for path in found}
        if not tombstoned <= planned:
            log.warning(
                "vacuum of %s: delta-rs would delete %s, which this vacuum keeps; deleting "
                "without delta-rs, so the log records no VACUUM commit",
                location.uri,
                sorted(tombstoned - planned)[:3],
            )
            tombstoned = set()
    others = [paths[path] for path in sorted(planned - tombstoned)]
    delete_files(location.filesystem(), others)
    versions = _vacuum_tombstones(table, hours, len(others)) if tombstoned else []
    if location.is_local:
        _remove_emptied_run_directories(location, planned)
    return versions


def _vacuum_tombstones(table: DeltaTable, hours: int, others: int) -> list[int]:
    """delta-rs's vacuum of the files the snapshot lists as removed; the versions it
    committed."""
    run_id = str(uuid.uuid4())
    before = table.version()
    table.vacuum(
        retention_hours=hours,
        dry_run=False,
        enforce_retention_duration=False,
        commit_properties=CommitProperties(
            custom_metadata={
                COMMIT_OPERATION: "vacuum",
                COMMIT_RUN_ID: run_id,
                COMMIT_OTHER_FILES: str(others),
            }
        ),
        post_commithook_properties=_POST_COMMIT,
    )
    table.update_incremental()
    history = table.history(limit=max(1, table.version() - before))
    return sorted(int(info["version"]) for info in history if info.get(COMMIT_RUN_ID) == run_id)


def _remove_emptied_run_directories(location: TableLocation, deleted: set[str]) -> None:
    """Remove the directories of the sink's runs (and the ones inside them) that deleting
    ``deleted`` (relative paths) left empty, deepest first; a directory that is not empty
    stays."""
    emptied = set()
    for path in deleted:
        parts = path.split("/")[:-1]
        if parts and is_run_directory(parts[0]):
            emptied |= {"/".join(parts[:depth]) for depth in range(1, len(parts) + 1)}
    for directory in sorted(emptied, key=lambda d: -d.count("/")):
        with contextlib.suppress(OSError):
            os.rmdir(location.path(directory))


def _duration(seconds: float) -> str:
    """``7 days``, ``36 hours``, ``90 minutes``, ``0 seconds``: the largest whole unit."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds:g} seconds"


def _iso(milliseconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(milliseconds / 1000, tz=datetime.timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
