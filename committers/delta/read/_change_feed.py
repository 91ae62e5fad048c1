"""Delta's change data feed: the rows each commit of a version range inserted, deleted or
updated, with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``, as delta-spark's
``table_changes`` gives them.

The commits of the range are read directly (one GET of each ``_delta_log/NNN.json``), never by
opening the table at every version. Each commit contributes *change files*, as PROTOCOL.md
("Reader Requirements for AddCDCFile") and delta-spark's ``CDCReader`` derive them:

* a commit with ``cdc`` actions: only those files; they hold ``_change_type``
  (``insert``, ``delete``, ``update_preimage``, ``update_postimage``), their partition values
  come from the action;
* otherwise its ``add`` actions with ``dataChange`` true are ``insert`` s of the file's rows and
  its ``remove`` actions with ``dataChange`` true ``delete`` s of the removed file's rows;
  ``dataChange`` false (compaction, OPTIMIZE) contributes nothing, nor does a MERGE whose
  metrics say it inserted, updated and deleted no row (delta-spark skips such commits);
* deletion vectors, as delta-spark's ``CDCReader`` applies them: an added file's rows are those
  its vector keeps, a removed file's deleted rows those its vector still kept. A file removed
  and added again in one commit with another vector (DELETE, UPDATE or MERGE with deletion
  vectors, RESTORE) changed only the rows the two vectors disagree on: the rows the new vector
  marks and the old did not are ``delete`` s, the rows the old one marked and the new does not
  are ``insert`` s (re-added). The vectors are read by the tasks that read the file.

A commit's time (``_commit_timestamp``) is its ``inCommitTimestamp`` when it records one
(tables with in-commit timestamps), otherwise its commit file's modification time in whole
milliseconds, made strictly increasing as delta-spark makes it
(:func:`~committers.delta.table._snapshot.list_log`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa

from committers.delta.read._log_commits import (
    LogPartitionValues,
    commit_operation,
    read_commit_actions,
)
from committers.delta.read._source import DELETION_VECTOR, DeltaFileReader
from committers.delta.read._stream_schema import describe_difference, read_compatible
from committers.delta.storage._storage import TableLocation
from committers.delta.table._delta_schema import without_field_metadata
from committers.delta.table._snapshot import (
    Snapshot,
    SnapshotSpec,
    check_readable,
    first_version_at_or_after,
    last_version_at_or_before,
    list_log,
    open_snapshot,
    parse_timestamp,
    protocol_reader_features,
)
from framework.errors import ConfigurationError, SinkError
from framework.source import FileSplit

__all__ = [
    "CHANGE_COLUMNS",
    "CHANGE_FEED_KEY",
    "ChangeFileReader",
    "ChangeListing",
    "ChangeRange",
    "ChangeRangeSpec",
    "change_feed_enabled",
    "commit_changes",
    "commit_timestamp_us",
    "insert_of",
    "is_cdc_file",
]

CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
#: The columns a change data feed adds to the table's, in delta-spark's order and types.
CHANGE_COLUMNS = (
    (CHANGE_TYPE, pa.string()),
    (COMMIT_VERSION, pa.int64()),
    (COMMIT_TIMESTAMP, pa.timestamp("us", tz="UTC")),
)
#: The table property that makes writers record the change data feed.
CHANGE_FEED_KEY = "delta.enableChangeDataFeed"

# The metadata keys of a change file's FileSplit (besides DELETION_VECTOR: rows not read).
_KIND = "change"  # "cdc", "insert" or "delete"
_VERSION = "version"
_TIMESTAMP = "timestamp"  # microseconds since the epoch
# A file removed and added again: only the rows in the first vector and not in the second.
_ROWS_IN = "rowsIn"
_ROWS_NOT_IN = "rowsNotIn"
_CDC = "cdc"
_MERGE_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")


def insert_of(file: FileSplit, version: int, timestamp_us: int) -> FileSplit:
    """``file`` (of a snapshot) read as an ``insert`` of every row at ``version``."""
    return replace(
        file,
        metadata={
            **file.metadata,
            _KIND: "insert",
            _VERSION: str(version),
            _TIMESTAMP: str(timestamp_us),
        },
    )


def is_cdc_file(file: FileSplit) -> bool:
    """Whether a change file is a ``cdc`` file (its rows say their change type)."""
    return file.metadata.get(_KIND) == _CDC


def change_feed_enabled(configuration: Mapping[str, Any]) -> bool:
    """Whether a table configuration records the change data feed."""
    return str(configuration.get(CHANGE_FEED_KEY, "false")).strip().lower() == "true"


def commit_timestamp_us(actions: Sequence[Mapping[str, Any]], file_time: float) -> int:
    """A commit's ``_commit_timestamp`` in microseconds since the epoch: its in-commit
    timestamp when it records one, otherwise ``file_time`` (seconds, whole milliseconds: the
    commit file's modification time, made increasing)."""
    for action in actions:
        info = action.get("commitInfo")
        if info is not None and info.get("inCommitTimestamp") is not None:
            return int(info["inCommitTimestamp"]) * 1000
    return round(file_time * 1000) * 1000


def _skipped_merge(actions: Sequence[Mapping[str, Any]]) -> bool:
    """A MERGE whose metrics say it changed no row: delta-spark reads no change from it."""
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
    if info is None or info.get("operation") != "MERGE":
        return False
    metrics = info.get("operationMetrics") or {}
    return all(str(metrics.get(name)) == "0" for name in _MERGE_METRICS)


def _change_file(
    action: Mapping[str, Any],
    kind: str,
    version: int,
    timestamp_us: int,
    partition_values: Callable[[Mapping[str, Any]], dict[str, str | None]],
    rows: Mapping[str, str],
) -> FileSplit:
    return FileSplit(
        path=unquote(str(action["path"])),
        size_bytes=int(action.get("size") or 0),
        partition_values=partition_values(action.get("partitionValues") or {}),
        metadata={**rows, _KIND: kind, _VERSION: str(version), _TIMESTAMP: str(timestamp_us)},
    )


def _vector(action: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """An action's deletion vector descriptor, None without one (or an empty one)."""
    vector = action.get("deletionVector")
    return vector if vector and int(vector.get("cardinality", 1)) > 0 else None


def _rows_of(action: Mapping[str, Any]) -> dict[str, str]:
    """The metadata that reads the rows an action's deletion vector keeps."""
    vector = _vector(action)
    return {} if vector is None else {DELETION_VECTOR: json.dumps(vector)}


def _rows_between(
    marked: Mapping[str, Any] | None, unmarked: Mapping[str, Any] | None
) -> dict[str, str] | None:
    """The metadata that reads the rows ``marked`` marks and ``unmarked`` does not (None when
    ``marked`` marks none)."""
    if marked is None:
        return None
    rows = {_ROWS_IN: json.dumps(marked)}
    if unmarked is not None:
        rows[_ROWS_NOT_IN] = json.dumps(unmarked)
    return rows


def commit_changes(
    what: str,
    version: int,
    timestamp_us: int,
    actions: Sequence[Mapping[str, Any]],
    partition_values: Callable[[Mapping[str, Any]], dict[str, str | None]],
) -> list[FileSplit]:
    """The change files of one commit (see the module docstring), in the order it lists them
    (a file removed and added again where it is first named: its deletes, then its re-added
    rows).

    Args:
        what: the commit, as error messages name it.
        version: its version.
        timestamp_us: its ``_commit_timestamp``.
        actions: its actions.
        partition_values: turns an action's ``partitionValues`` into the reader's spelling.

    Raises:
        SinkError: a file removed and added again in the commit without a deletion vector on
            either side (no writer does that; its changes cannot be told).
    """
    stamp = (version, timestamp_us, partition_values)
    cdc = [a["cdc"] for a in actions if "cdc" in a]
    if cdc:
        return [_change_file(c, _CDC, *stamp, rows={}) for c in cdc]
    if _skipped_merge(actions):
        return []
    changed = [
        (kind, action[kind])
        for action in actions
        for kind in ("add", "remove")
        if kind in action and action[kind].get("dataChange", True)
    ]
    added = {f["path"]: f for kind, f in changed if kind == "add"}
    removed = {f["path"]: f for kind, f in changed if kind == "remove"}
    files: list[FileSplit] = []
    paired: set[str] = set()
    for kind, action in changed:
        path = action["path"]
        if path not in added or path not in removed:
            change = "insert" if kind == "add" else "delete"
            files.append(_change_file(action, change, *stamp, rows=_rows_of(action)))
            continue
        if path in paired:
            continue
        paired.add(path)
        add, remove = added[path], removed[path]
        old, new = _vector(remove), _vector(add)
        if old is None and new is None:
            raise SinkError(
                f"{what} removes {path} and adds it again without a deletion vector; which of "
                "its rows changed cannot be told"
            )
        for change, rows in (
            ("delete", _rows_between(new, old)),
            ("insert", _rows_between(old, new)),
        ):
            if rows is not None:
                files.append(_change_file(add, change, *stamp, rows=rows))
    return files


@dataclass(frozen=True)
class ChangeRangeSpec:
    """The versions a batch read of the change data feed asks for: ``startingVersion`` or
    ``startingTimestamp`` (one of them), ``endingVersion`` or ``endingTimestamp`` (at most
    one; neither reads to the latest version).

    Raises:
        ConfigurationError: no start, both spellings of one end, a malformed value.
    """

    start_version: int | None = None
    start_timestamp: dt.datetime | None = None
    end_version: int | None = None
    end_timestamp: dt.datetime | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any]) -> ChangeRangeSpec:
        """From a read's options (lower-case names)."""
        start_version = _version_option("startingVersion", options.get("startingversion"))
        end_version = _version_option("endingVersion", options.get("endingversion"))
        start_timestamp = _timestamp_option("startingTimestamp", options.get("startingtimestamp"))
        end_timestamp = _timestamp_option("endingTimestamp", options.get("endingtimestamp"))
        if start_version is None and start_timestamp is None:
            raise ConfigurationError(
                "a batch read of the change data feed (readChangeFeed=true) needs "
                "startingVersion or startingTimestamp: the first version whose changes it reads"
            )
        for side, version, timestamp in (
            ("starting", start_version, start_timestamp),
            ("ending", end_version, end_timestamp),
        ):
            if version is not None and timestamp is not None:
                raise ConfigurationError(
                    f"give {side}Version or {side}Timestamp, not both: each names the same end "
                    "of the range"
                )
        return cls(start_version, start_timestamp, end_version, end_timestamp)


def _version_option(name: str, raw: object) -> int | None:
    if raw is None:
        return None
    text = str(raw).strip()
    if not text.isdigit():
        raise ConfigurationError(f"{name} must be a version number >= 0, got {raw!r}")
    return int(text)


def _timestamp_option(name: str, raw: object) -> dt.datetime | None:
    return None if raw is None else parse_timestamp(str(raw), name)


@dataclass(frozen=True)
class ChangeRange:
    """The commits a batch read of the change data feed reads: ``start`` to ``end``, both
    included; ``end`` is ``start - 1`` for an empty range."""

    start: int
    end: int

    @classmethod
    def resolve(cls, snapshot: Snapshot, spec: ChangeRangeSpec) -> ChangeRange:
        """The range ``spec`` names in the table of ``snapshot`` (its latest version when the
        read was defined), as delta-spark resolves it: ``startingTimestamp`` names the first
        commit at or after it, ``endingTimestamp`` the last one at or before it (two
        timestamps between the same two commits name an empty range); an ``endingVersion``
        past the latest version reads to the latest one.

        Raises:
            ConfigurationError: the start is after the latest version; the end is before the
                start; a timestamp outside the table's history.
        """
        location, latest = snapshot.location, snapshot.version
        start, named_start = _version_named(
            location, "starting", spec.start_version, spec.start_timestamp
        )
        if start is None:  # ChangeRangeSpec.of refuses it
            raise ConfigurationError("a change data feed read needs a starting version")
        if start > latest:
            raise ConfigurationError(
                f"{named_start} is after the latest version of {location.uri} ({latest}): "
                "there are no changes to read yet. Give a start at or before it."
            )
        end, named_end = _version_named(location, "ending", spec.end_version, spec.end_timestamp)
        if end is None:
            return cls(start, latest)
        first, last = spec.start_timestamp, spec.end_timestamp
        backwards = first is not None and last is not None and first > last
        if first is not None and last is not None and not backwards and end == start - 1:
            return cls(start, end)  # both timestamps between the same two commits
        if backwards or end < start:
            raise ConfigurationError(
                f"the change data feed range from {named_start} to {named_end} ends before it "
                "starts; give an end at or after the start"
            )
        return cls(start, min(end, latest))

    @property
    def empty(self) -> bool:
        return self.end < self.start


def _version_named(
    location: TableLocation, side: str, version: int | None, timestamp: dt.datetime | None
) -> tuple[int | None, str]:
    """The version one end (``side``: ``starting`` or ``ending``) of a range names, and how
    to name it in messages: a timestamp's is the first commit at or after it (start) or the
    last one at or before it (end); None when that end is not given."""
    if timestamp is None:
        return version, f"{side}Version={version}"
    find = first_version_at_or_after if side == "starting" else last_version_at_or_before
    found = find(location, timestamp, f"{side}Timestamp")
    return found, f"{side}Timestamp={timestamp.isoformat()} (version {found})"


def _spans(versions: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``0-2, 5``."""
    spans: list[list[int]] = []
    for v in sorted(versions):
        if spans and spans[-1][1] == v - 1:
            spans[-1][1] = v
        else:
            spans.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


class ChangeListing:
    """The ``list_files`` of a batch read of the change data feed: the change files of every
    commit of the range, in version order, read from the commit files once per instance
    (pickles without them: tasks never list).

    Args:
        snapshot: the table when the read was defined: its schema is the read schema.
        changes: the range to read.
    """

    def __init__(self, snapshot: Snapshot, changes: ChangeRange) -> None:
        self._snapshot = snapshot
        self._range = changes
        self._files: list[FileSplit] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_files": None}

    @property
    def snapshot(self) -> Snapshot:
        """The table when the read was defined."""
        return self._snapshot

    def __call__(self) -> list[FileSplit]:
        """The change files.

        Raises:
            ConfigurationError: a commit of the range was removed by log cleanup; the change
                data feed was not enabled at some version of the range (all are named); a
                commit changes the schema or partitioning to one the read schema cannot read.
            UnsupportedTableFeatureError: a protocol or a file this reader cannot honour.
        """
        if self._files is None:
            self._files = self._list() if not self._range.empty else []
        return self._files

    def _list(self) -> list[FileSplit]:
        snapshot, (start, end) = self._snapshot, (self._range.start, self._range.end)
        uri = snapshot.location.uri
        listing = list_log(snapshot.location)
        times = listing.commits
        missing = [v for v in range(start, end + 1) if v not in times]
        if missing:
            raise ConfigurationError(
                f"the change data feed of {uri} from version {start} to {end} cannot be read: "
                f"log cleanup removed the commit(s) of version(s) {_spans(missing)} "
                f"(delta.logRetentionDuration). The earliest commit still there is "
                f"{min(times) if times else 'none'}; read from a later startingVersion."
            )
        unbuildable = ConfigurationError(
            f"the change data feed of {uri} from version {start} cannot be read: the table as "
            f"of version {start} cannot be rebuilt (log cleanup removed the commits before it, "
            "and no checkpoint is left at or before it). The earliest version it can start "
            f"from is {listing.earliest}."
        )
        if listing.earliest is None or start < listing.earliest:
            raise unbuildable
        try:
            _table, at_start = open_snapshot(snapshot.location, SnapshotSpec(version=start))
        except ConfigurationError as err:
            raise unbuildable from err
        self._check_schema(start, at_start.schema_json, at_start.shape.partition_by)
        enabled = change_feed_enabled(dict(at_start.shape.configuration))
        partition_values = LogPartitionValues(snapshot)
        not_recorded: list[int] = []
        files: list[FileSplit] = []
        for version in range(start, end + 1):
            actions = read_commit_actions(snapshot.location, version)
            if actions is None:
                raise ConfigurationError(
                    f"version {version} of {uri} was removed by log cleanup while being read; "
                    "read from a later startingVersion"
                )
            operation = commit_operation(actions)
            what = f"version {version} of {uri}" + (f" ({operation})" if operation else "")
            for action in actions:
                protocol = action.get("protocol")
                if protocol is not None:
                    reader_version = int(protocol.get("minReaderVersion", 1))
                    check_readable(
                        uri,
                        reader_version,
                        protocol_reader_features(reader_version, protocol.get("readerFeatures")),
                    )
                metadata = action.get("metaData")
                if metadata is not None:
                    enabled = change_feed_enabled(metadata.get("configuration") or {})
                    if version > start:
                        self._check_schema(
                            version,
                            metadata.get("schemaString", "{}"),
                            tuple(metadata.get("partitionColumns") or ()),
                        )
            if not enabled:
                not_recorded.append(version)
                continue
            stamp = commit_timestamp_us(actions, times[version])
            files.extend(commit_changes(what, version, stamp, actions, partition_values))
        if not_recorded:
            raise ConfigurationError(
                f"the change data feed of {uri} from version {start} to {end} cannot be read: "
                f"it was not recorded at version(s) {_spans(not_recorded)} (table property "
                f"{CHANGE_FEED_KEY} not true then). DESCRIBE HISTORY shows when it was "
                "enabled; read a range from a version after that."
            )
        return files

    def _check_schema(self, version: int, schema_json: str, partition_by: tuple[str, ...]) -> None:
        """Files written under a version's schema must be readable with the read schema."""
        read = without_field_metadata(json.loads(self._snapshot.schema_json))
        written = without_field_metadata(json.loads(schema_json))
        if partition_by != self._snapshot.shape.partition_by:
            raise ConfigurationError(
                f"version {version} of {self._snapshot.location.uri} is partitioned by "
                f"{list(partition_by)}, the table now by "
                f"{list(self._snapshot.shape.partition_by)}: the change data feed cannot be "
                "read across that change; read a range that starts after it"
            )
        if not read_compatible(written, read):
            raise ConfigurationError(
                f"version {version} of {self._snapshot.location.uri} has a schema the table's "
                f"current one cannot read ({describe_difference(written, read)}): the change "
                "data feed cannot be read across that change; read a range that starts after it"
            )


class ChangeFileReader(DeltaFileReader):
    """The ``read_file`` of a change data feed: one change file as record batches of the
    table's columns followed by ``_change_type``, ``_commit_version`` and
    ``_commit_timestamp`` (see :data:`CHANGE_COLUMNS`)."""

    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__(snapshot)
        self._change_schema = pa.schema(
            [*super().schema, *(pa.field(name, kind) for name, kind in CHANGE_COLUMNS)]
        )

    @property
    def schema(self) -> pa.Schema:
        return self._change_schema

    def _extra_columns(self, file: FileSplit, file_schema: pa.Schema) -> list[str]:
        if file.metadata.get(_KIND) != _CDC:
            return []
        if CHANGE_TYPE not in file_schema.names:
            raise SinkError(
                f"change data file {file.path} has no {CHANGE_TYPE} column; it is not a "
                "change data file a Delta writer wrote"
            )
        return [CHANGE_TYPE]

    def _row_filter(self, file: FileSplit) -> Callable[[int, int], np.ndarray | None]:
        """A file removed and added again: only the rows one vector marks and the other does
        not; any other file: the rows its deletion vector keeps."""
        if _ROWS_IN not in file.metadata:
            return super()._row_filter(file)
        selected = np.setdiff1d(
            self._vector_rows(file, _ROWS_IN),
            self._vector_rows(file, _ROWS_NOT_IN),
            assume_unique=True,
        )

        def keep(first_row: int, rows: int) -> np.ndarray:
            return np.isin(np.arange(first_row, first_row + rows, dtype=np.uint64), selected)

        return keep

    def _finish(
        self, file: FileSplit, batch: pa.RecordBatch, raw: pa.RecordBatch | None, first_row: int
    ) -> pa.RecordBatch:
        rows = batch.num_rows
        kind = file.metadata[_KIND]
        if kind == _CDC and raw is not None:
            change_type = raw.column(CHANGE_TYPE).cast(pa.string())
        else:
            change_type = pa.repeat(pa.scalar(kind, pa.string()), rows)
        version = pa.repeat(pa.scalar(int(file.metadata[_VERSION]), pa.int64()), rows)
        stamp = pa.repeat(pa.scalar(int(file.metadata[_TIMESTAMP]), CHANGE_COLUMNS[2][1]), rows)
        return pa.RecordBatch.from_arrays(
            [*batch.columns, change_type, version, stamp], schema=self._change_schema
        )
