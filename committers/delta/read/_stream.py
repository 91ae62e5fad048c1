"""A Delta table as an unbounded input: the files its commits append, in log order.

:class:`DeltaLogTail` is the :class:`~framework.spark.connector.FileDiscovery` of
``spark.readStream.format("deltalake")``. Its offsets are positions in the table's history::

    {"tableId": <metaData id>, "version": v, "index": i, "snapshot": false}

meaning "the next file to read is file ``i`` of version ``v``" (of the snapshot of version
``v`` when ``"snapshot"`` is true). A commit's files are its ``add`` actions with
``dataChange`` true, in the order the commit lists them; a snapshot's files are in
delta-spark's order (by ``modificationTime``, then path); a version may be split over
micro-batches.

Where a new query starts is fixed when it starts (the first offset Spark asks for), as
delta-spark fixes it; the table's latest version then is the *start version*:

* no ``startingVersion`` / ``startingTimestamp``: the snapshot of the start version, then
  every later commit;
* ``startingVersion=N``: the commits from version N on; ``latest``: the commits after the start
  version;
* ``startingTimestamp=T``: the commits from the first one committed at or after T (commit
  times as ``timestampAsOf`` reads them: the commit files' modification times); a T after the
  latest commit is an error, as in delta-spark.

Spark does not keep a query's initial offset: when it replays the first micro-batch after a
crash, it asks for the initial offset again, which then names a later start. So the initial
offset is marked (``"initial": true``), the first batch's end offset records where the batch
began (``"from": {"version", "index", "snapshot"}``), and a batch whose start is marked is read
from there: a replayed batch reads exactly the files its logged offsets name.

The stream reads with the schema the DataFrame was defined with (``load()``), which must still
be the table's at the start version. Commits and snapshots it crosses are followed as
delta-spark follows them; what it cannot follow is never skipped silently:

* files removed with ``dataChange`` true (DELETE, UPDATE, MERGE, overwrite): an error, or the
  whole commit is skipped with ``skipChangeCommits`` (as delta-spark does);
* compaction (``dataChange`` false on both sides): nothing to read, passed over;
* a schema change: files written with a schema the read schema can read (the same columns, or
  fewer: columns added later read as null; see ``_stream_schema.py``) are read, so an ADD
  COLUMN before the start version is followed; a change after the start version that the
  stream's schema cannot represent (a new column, a dropped or retyped one) or any other
  partitioning stops the stream: restart the query to read with the new schema;
* a protocol the reader cannot honour (a reader version or feature it does not support), at
  any version the stream crosses: an error, before that version is read;
* deletion vectors: the rows they delete are dropped from the snapshot's files and from any
  appended file that comes with one (a commit that changes a vector also removes the file, so
  it is a change commit, above);
* a commit removed by log cleanup, a table replaced by another at the same path: errors.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from deltalake import DeltaTable

from committers.delta.read._log_commits import (
    LogPartitionValues,
    commit_operation,
    read_commit_actions,
)
from committers.delta.read._source import (
    DeltaFileReader,
    list_data_files,
    spell_partition_value,
    vector_metadata,
)
from committers.delta.read._stream_schema import describe_difference, read_compatible
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor
from committers.delta.table._delta_schema import without_field_metadata
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._snapshot import (
    Snapshot,
    SnapshotSpec,
    check_readable,
    first_version_at_or_after,
    list_log,
    open_snapshot,
    parse_timestamp,
    protocol_reader_features,
)
from framework.errors import ConfigurationError, DestinationError, SinkError
from framework.source import FileGroupSource, FileSourceConfig, FileSplit
from framework.spark.connector import AdmissionLimit

__all__ = ["DeltaLogTail", "SourceTableChangedError", "StreamStart"]

log = logging.getLogger("committers.delta")

#: Commits whose files are kept in memory (they never change; re-reading costs a GET each).
_CACHED_VERSIONS = 256


class SourceTableChangedError(DestinationError):
    """The table a stream reads changed in a way an append-only reader cannot follow."""


@dataclass(frozen=True)
class StreamStart:
    """Where a new query starts: ``version`` None (and no ``timestamp``) reads the snapshot of
    the start version, then the commits after it; an int reads the commits from that version
    on; ``latest`` reads only commits made after the query starts; ``timestamp`` reads the
    commits from the first one committed at or after it."""

    version: int | None = None
    latest: bool = False
    timestamp: dt.datetime | None = None

    @classmethod
    def of(cls, version: object = None, timestamp: object = None) -> StreamStart:
        """From the options ``startingVersion`` and ``startingTimestamp`` (at most one).

        Raises:
            ConfigurationError: both are given, or one is malformed.
        """
        if version is not None and timestamp is not None:
            raise ConfigurationError(
                "give startingVersion or startingTimestamp, not both: each names where the "
                "stream starts"
            )
        if timestamp is not None:
            when = (
                timestamp
                if isinstance(timestamp, dt.datetime)
                else parse_timestamp(str(timestamp), "startingTimestamp")
            )
            if when.tzinfo is None:
                when = when.replace(tzinfo=dt.timezone.utc)
            return cls(timestamp=when)
        if version is None:
            return cls()
        raw = str(version).strip().lower()
        if raw == "latest":
            return cls(latest=True)
        if not raw.isdigit():
            raise ConfigurationError(
                f"startingVersion must be a version number >= 0 or 'latest', got {version!r}"
            )
        return cls(version=int(raw))


@dataclass(frozen=True)
class _Started:
    """The table when the query started: its latest version and its id."""

    version: int
    table_id: str


def _position(offset: Mapping[str, Any]) -> tuple[int, int, bool]:
    try:
        return int(offset["version"]), int(offset["index"]), bool(offset["snapshot"])
    except (KeyError, TypeError, ValueError) as err:
        raise SinkError(
            f"{dict(offset)!r} is not an offset of the deltalake stream source (was the "
            "checkpoint written by another source?)"
        ) from err


class DeltaLogTail:
    """The files a Delta table's commits append (see the module docstring). Pickles without
    its caches; tasks only use :meth:`source`.

    Args:
        snapshot: the version the stream's DataFrame was defined with (``load()``): its schema
            and layout are what the stream reads with.
        start: where a new query starts.
        skip_change_commits: skip commits that remove data instead of failing on them.
        config: split sizing of each micro-batch.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        start: StreamStart,
        *,
        skip_change_commits: bool,
        config: FileSourceConfig,
    ) -> None:
        self._snapshot = snapshot
        self._start = start
        self._skip_change_commits = skip_change_commits
        self._config = config
        self._schema = without_field_metadata(json.loads(snapshot.schema_json))
        self._partition_values = LogPartitionValues(snapshot)
        self._started: _Started | None = None
        self._initial: dict[str, Any] | None = None
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._units: OrderedDict[tuple[int, bool], list[FileSplit]] = OrderedDict()
        self._known_next: int | None = None  # a version known not to be committed yet

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_units"] = OrderedDict()
        return state

    @property
    def _uri(self) -> str:
        return self._snapshot.location.uri

    # -- the query's start -----------------------------------------------------------------

    def _at_start(self) -> _Started:
        """The table's latest version and id when the query started (resolved on the first
        call, which Spark makes as the query starts).

        Raises:
            SourceTableChangedError: the table's schema or partitioning is no longer the one
                the stream's DataFrame was defined with.
            UnsupportedTableFeatureError: the table now needs a reader feature this reader
                cannot honour.
        """
        if self._started is None:
            table, snapshot = open_snapshot(self._snapshot.location, SnapshotSpec())
            schema = without_field_metadata(json.loads(snapshot.schema_json))
            if (schema, snapshot.shape.partition_by) != (
                self._schema,
                self._snapshot.shape.partition_by,
            ):
                raise SourceTableChangedError(
                    f"the schema or partitioning of {self._uri} changed between the stream's "
                    f"definition (load(), version {self._snapshot.version}) and its start "
                    f"(version {snapshot.version}): {describe_difference(schema, self._schema)}"
                    ". Define the stream again (call load() again) to read with the new schema."
                )
            self._started = _Started(snapshot.version, str(table.metadata().id))
        return self._started

    def _initial_position(self, started: _Started) -> tuple[int, bool]:
        if self._start.latest:
            return started.version + 1, False
        if self._start.timestamp is not None:
            return (
                first_version_at_or_after(
                    self._snapshot.location, self._start.timestamp, "startingTimestamp"
                ),
                False,
            )
        if self._start.version is None:
            return started.version, True
        wanted = self._start.version
        if wanted > started.version:
            raise ConfigurationError(
                f"startingVersion={wanted} does not exist in {self._uri}: its latest version "
                f"is {started.version}"
            )
        commits = list_log(self._snapshot.location).commits
        if wanted not in commits:
            raise ConfigurationError(
                f"startingVersion={wanted} of {self._uri} is no longer available: log cleanup "
                f"removed its commit (delta.logRetentionDuration). The earliest commit still "
                f"there is {min(commits) if commits else 'none'}."
            )
        return wanted, False

    # -- offsets ---------------------------------------------------------------------------

    def _offset(self, version: int, index: int, snapshot: bool) -> dict[str, Any]:
        return {
            "tableId": self._at_start().table_id,
            "version": version,
            "index": index,
            "snapshot": snapshot,
        }

    def initial_offset(self) -> dict[str, Any]:
        """Where the query starts, the same on every call of this object; marked
        ``"initial"`` (see the module docstring)."""
        if self._initial is None:
            version, snapshot = self._initial_position(self._at_start())
            self._initial = {**self._offset(version, 0, snapshot), "initial": True}
        return dict(self._initial)

    def _check_table(self, offset: Mapping[str, Any]) -> None:
        stored = offset.get("tableId")
        current = self._at_start().table_id
        if stored is not None and stored != current:
            raise SourceTableChangedError(
                f"the table at {self._uri} is not the one this query started reading (table "
                f"id {current}, was {stored}): it was deleted and created again. Start the "
                "query from a new checkpoint."
            )

    def discover(
        self, start: dict[str, Any], limit: AdmissionLimit, *, up_to: dict[str, Any] | None
    ) -> dict[str, Any]:
        self._check_table(start)
        version, index, snapshot = _position(start)
        stop = None if up_to is None else _position(up_to)[:2]
        files = size = 0
        while stop is None or (version, index) < stop:
            unit = self._unit(version, snapshot)
            if unit is None:
                break
            while index < len(unit):
                if stop is not None and (version, index) >= stop:
                    return self._end(start, version, index, snapshot)
                if not limit.admits(files, size):
                    return self._end(start, version, index, snapshot)
                taken = unit[index:] if index == 0 and self._indivisible(unit) else unit[index:][:1]
                files += len(taken)
                size += sum(f.size_bytes for f in taken)
                index += len(taken)
            version, index, snapshot = version + 1, 0, False
        return self._end(start, version, index, snapshot)

    def _end(
        self, start: dict[str, Any], version: int, index: int, snapshot: bool
    ) -> dict[str, Any]:
        """The end offset of a micro-batch from ``start``: ``start`` itself when nothing is
        new; after an initial offset, with the position the batch starts from."""
        if (version, index, snapshot) == _position(start):
            return start
        end = self._offset(version, index, snapshot)
        if start.get("initial"):
            began, at, in_snapshot = _position(start)
            end["from"] = {"version": began, "index": at, "snapshot": in_snapshot}
        return end

    def _indivisible(self, unit: list[FileSplit]) -> bool:
        """Whether a micro-batch takes all of a commit's files or none (it still takes them
        while the limit has room, as for one file). Every file stands alone here."""
        return False

    def latest_offset(self) -> dict[str, Any]:
        return self.discover(self.initial_offset(), AdmissionLimit(), up_to=None)

    def files_between(self, start: dict[str, Any], end: dict[str, Any]) -> list[FileSplit]:
        """The files from ``start`` up to ``end``. A ``start`` marked initial is where this
        run would start a new query; the batch began where ``end`` says (``"from"``)."""
        self._check_table(start)
        self._check_table(end)
        origin = end.get("from")
        if start.get("initial") and isinstance(origin, Mapping):
            start = {**origin, "tableId": end.get("tableId")}
        version, index, snapshot = _position(start)
        stop = _position(end)[:2]
        files: list[FileSplit] = []
        while (version, index) < stop:
            unit = self._unit(version, snapshot)
            if unit is None:
                raise SinkError(
                    f"version {version} of {self._uri} is not committed, but the micro-batch's "
                    f"end offset {end} lies past it"
                )
            upto = len(unit) if version < stop[0] else stop[1]
            files.extend(unit[index:upto])
            version, index, snapshot = version + 1, 0, False
        return files

    def source(self, files: Sequence[FileSplit]) -> FileGroupSource[Any, Any]:
        chosen = list(files)
        return FileGroupSource(
            _Listed(chosen),
            self._file_reader(),
            config=self._config,
            total_bytes=sum(f.size_bytes for f in chosen),
            split_id_prefix="stream",
        )

    def _file_reader(self) -> DeltaFileReader:
        """How the stream's tasks read a file."""
        return DeltaFileReader(self._snapshot)

    # -- the log ---------------------------------------------------------------------------

    def _unit(self, version: int, snapshot: bool) -> list[FileSplit] | None:
        """The files of one position's version: a snapshot's, or a commit's appended files;
        None while the version is not committed."""
        key = (version, snapshot)
        cached = self._units.get(key)
        if cached is not None:
            self._units.move_to_end(key)
            return cached
        unit = self._snapshot_files(version) if snapshot else self._commit_files(version)
        if unit is None:
            return None
        self._units[key] = unit
        while len(self._units) > _CACHED_VERSIONS:
            self._units.popitem(last=False)
        return unit

    def _snapshot_files(self, version: int) -> list[FileSplit]:
        """The snapshot's files in delta-spark's order: by modification time, then path.
        Raises if the reader cannot read that version, or not with the stream's schema."""
        if version == self._snapshot.version:
            snapshot = self._snapshot
            table = DeltaTable(
                self._uri,
                storage_options=snapshot.location.delta_storage_options(),
                version=version,
            )
        else:
            table, snapshot = open_snapshot(self._snapshot.location, SnapshotSpec(version=version))
            self._check_metadata(
                f"version {version} of {self._uri}",
                version,
                {
                    "id": str(table.metadata().id),
                    "schemaString": snapshot.schema_json,
                    "partitionColumns": list(snapshot.shape.partition_by),
                },
            )
        files = sorted(
            list_data_files(table, snapshot), key=lambda f: (f.modification_time, f.path)
        )
        return [
            FileSplit(
                path=f.path,
                size_bytes=f.size_bytes,
                partition_values={
                    name: spell_partition_value(value) for name, value in f.partition_values.items()
                },
                metadata=vector_metadata(f.deletion_vector),
            )
            for f in files
        ]

    def _commit_files(self, version: int) -> list[FileSplit] | None:
        actions = read_commit_actions(self._snapshot.location, version)
        if actions is None:
            self._check_not_cleaned_up(version)
            return None
        self._known_next = None
        return self._commit_unit(version, actions)

    def _check_not_cleaned_up(self, version: int) -> None:
        """A missing commit is either not made yet or removed by log cleanup; list the log
        once per missing version to tell which (polls of a caught-up stream then cost one
        GET, not a listing)."""
        if self._known_next == version:
            return
        latest = list_log(self._snapshot.location).latest
        if latest is not None and latest >= version:
            raise SourceTableChangedError(
                f"version {version} of {self._uri} is no longer available: log cleanup removed "
                "its commit before this stream read it (delta.logRetentionDuration), so its rows "
                f"cannot be read. Start the query from a new checkpoint (startingVersion up to "
                f"{latest})."
            )
        self._known_next = version

    def _check_commit(self, version: int, actions: list[dict[str, Any]]) -> str:
        """Check the protocol and metadata a commit sets (see :meth:`_check_protocol` and
        :meth:`_check_metadata`); returns how to name the commit in messages."""
        operation = commit_operation(actions)
        what = f"version {version} of {self._uri}" + (f" ({operation})" if operation else "")
        for action in actions:
            if "protocol" in action:
                self._check_protocol(what, action["protocol"])
            metadata = action.get("metaData")
            if metadata is not None:
                self._check_metadata(what, version, metadata)
        return what

    def _commit_unit(self, version: int, actions: list[dict[str, Any]]) -> list[FileSplit]:
        """The files a stream reads of one commit: the appended ones."""
        what = self._check_commit(version, actions)
        removes = [
            a["remove"] for a in actions if "remove" in a and a["remove"].get("dataChange", True)
        ]
        if removes:
            if self._skip_change_commits:
                log.info("skipping %s: it removes %d files (skipChangeCommits)", what, len(removes))
                return []
            raise SourceTableChangedError(
                f"{what} removes {len(removes)} data file(s) (an update, delete, merge or "
                "overwrite); a stream reads appended rows only and would otherwise miss or "
                "repeat rows. Set the option skipChangeCommits=true to skip such commits, or "
                f"start a new query with startingVersion={version + 1}."
            )
        files: list[FileSplit] = []
        for action in actions:
            add = action.get("add")
            if add is None or not add.get("dataChange", True):
                continue
            vector, path = add.get("deletionVector"), unquote(add["path"])
            files.append(
                FileSplit(
                    path=path,
                    size_bytes=int(add["size"]),
                    partition_values=self._partition_values(add.get("partitionValues") or {}),
                    # An appended file with a vector already (a copy of another table's file,
                    # say): its deleted rows are dropped like a snapshot's.
                    metadata=vector_metadata(
                        None if vector is None else DeletionVectorDescriptor.from_json(vector, path)
                    ),
                )
            )
        return files

    def _check_protocol(self, what: str, protocol: Mapping[str, Any]) -> None:
        """A commit that changes the protocol: the reader must still honour it."""
        reader_version = int(protocol.get("minReaderVersion", 1))
        features = protocol_reader_features(reader_version, protocol.get("readerFeatures"))
        try:
            check_readable(self._uri, reader_version, features)
        except UnsupportedTableFeatureError as err:
            raise UnsupportedTableFeatureError(
                f"{what} changes the table's protocol, and the stream stops before it: {err}"
            ) from err

    def _check_metadata(self, what: str, version: int, metadata: Mapping[str, Any]) -> None:
        """Files written under ``metadata`` must be readable with the stream's schema (see
        ``_stream_schema.py``); after the start version, a schema the stream's cannot
        represent (a new, dropped or retyped column) stops the stream for a restart."""
        started = self._at_start()
        table_id = metadata.get("id")
        if table_id is not None and table_id != started.table_id:
            raise SourceTableChangedError(
                f"{what} belongs to another table (id {table_id}, this stream reads "
                f"{started.table_id}): the table was replaced. Start the query from a new "
                "checkpoint."
            )
        schema = without_field_metadata(json.loads(metadata.get("schemaString", "{}")))
        partition_by = tuple(metadata.get("partitionColumns") or ())
        if partition_by != self._snapshot.shape.partition_by:
            raise SourceTableChangedError(
                f"{what} changes the table's partitioning from "
                f"{list(self._snapshot.shape.partition_by)} to {list(partition_by)}; a stream "
                f"cannot follow it. Start a new query (new checkpoint) with "
                f"startingVersion={version}."
            )
        after_start = version > started.version
        readable = read_compatible(schema, self._schema)
        dropped = {f["name"] for f in self._schema.get("fields", ())} - {
            f["name"] for f in schema.get("fields", ())
        }
        if readable and not (after_start and dropped):
            return
        difference = describe_difference(schema, self._schema)
        if after_start:
            raise SourceTableChangedError(
                f"{what} changes the table's schema after this query started: its schema has "
                f"{difference}. Restart the query to read with the new schema (the files read "
                "so far stay read; earlier files read added columns as null)."
            )
        raise SourceTableChangedError(
            f"{what} holds files written with a schema that the stream's (the table's when the "
            f"query started) cannot read: {difference} (a column dropped, renamed or retyped "
            f"since). Start a new query (new checkpoint) with a startingVersion after {version}."
        )


class _Listed:
    """A fixed file list as a source's ``list_files``."""

    def __init__(self, files: list[FileSplit]) -> None:
        self._files = files

    def __call__(self) -> list[FileSplit]:
        return self._files
