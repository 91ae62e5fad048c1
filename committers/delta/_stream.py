"""A Delta table as an unbounded input: the files its commits append, in log order.

:class:`DeltaLogTail` is the :class:`~framework.spark._stream_source.FileDiscovery` of
``spark.readStream.format("deltalake")``. Its offsets are positions in the table's history::

    {"tableId": <metaData id>, "version": v, "index": i, "snapshot": false}

meaning "the next file to read is file ``i`` of version ``v``". Without ``startingVersion`` a
query first reads the whole snapshot of the version it started at (``"snapshot": true``, its
files in path order), then every later commit; with ``startingVersion`` it reads the commits
from that version on. A commit's files are its ``add`` actions with ``dataChange`` true, in the
order the commit lists them; a version may be split over micro-batches.

Commits an append-only reader cannot follow are never skipped silently:

* files removed with ``dataChange`` true (DELETE, UPDATE, MERGE, overwrite): an error, or the
  whole commit is skipped with ``skipChangeCommits`` (as delta-spark does);
* compaction (``dataChange`` false on both sides): nothing to read, passed over;
* a schema or partitioning other than the one the query reads with: an error (restart the
  query to read with the table's new schema);
* a deletion vector on an added file, a commit removed by log cleanup, a table replaced by
  another at the same path: errors.
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

from committers.delta._delta_schema import without_field_metadata
from committers.delta._protocol import UnsupportedTableFeatureError
from committers.delta._snapshot import (
    Snapshot,
    SnapshotSpec,
    _list_log,
    open_snapshot,
    parse_timestamp,
)
from committers.delta._source import DeltaFileReader, list_data_files, spell_partition_value
from framework.errors import ConfigurationError, DestinationError, SinkError
from framework.source import FileGroupSource, FileSourceConfig, FileSplit
from framework.spark._stream_source import AdmissionLimit

__all__ = ["DeltaLogTail", "SourceTableChangedError", "StreamStart"]

log = logging.getLogger("committers.delta")

_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)
#: Commits whose files are kept in memory (they never change; re-reading costs a GET each).
_CACHED_VERSIONS = 256


class SourceTableChangedError(DestinationError):
    """The table a stream reads changed in a way an append-only reader cannot follow."""


@dataclass(frozen=True)
class StreamStart:
    """Where a new query starts: ``version`` None reads the snapshot it starts at, then the
    commits after it; an int reads the commits from that version on; ``latest`` reads only
    commits made after the query starts."""

    version: int | None = None
    latest: bool = False

    @classmethod
    def of(cls, text: object) -> StreamStart:
        if text is None:
            return cls()
        raw = str(text).strip().lower()
        if raw == "latest":
            return cls(latest=True)
        if not raw.isdigit():
            raise ConfigurationError(
                f"startingVersion must be a version number >= 0 or 'latest', got {text!r}"
            )
        return cls(version=int(raw))


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
        snapshot: the version the query (re)started at: its schema and layout are what the
            stream reads with.
        table_id: the table's ``metaData.id`` at that version.
        start: where a new query starts.
        skip_change_commits: skip commits that remove data instead of failing on them.
        config: split sizing of each micro-batch.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        table_id: str,
        start: StreamStart,
        *,
        skip_change_commits: bool,
        config: FileSourceConfig,
    ) -> None:
        self._snapshot = snapshot
        self._table_id = table_id
        self._start = start
        self._skip_change_commits = skip_change_commits
        self._config = config
        self._schema = without_field_metadata(json.loads(snapshot.schema_json))
        self._types = {f.name: f.type for f in snapshot.shape.schema.fields}
        # The log keys partition values by physical name under column mapping.
        mapped = snapshot.column_mapping_mode != "none"
        self._partition_names = {
            (f.physical_name if mapped else f.name): f.name
            for f in snapshot.shape.schema.fields
            if f.name in snapshot.shape.partition_by
        }
        self._reset_caches()

    def _reset_caches(self) -> None:
        self._units: OrderedDict[tuple[int, bool], list[FileSplit]] = OrderedDict()
        self._known_next: int | None = None  # a version known not to be committed yet

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_units"] = OrderedDict()
        return state

    # -- offsets ---------------------------------------------------------------------------

    def _offset(self, version: int, index: int, snapshot: bool) -> dict[str, Any]:
        return {"tableId": self._table_id, "version": version, "index": index, "snapshot": snapshot}

    def initial_offset(self) -> dict[str, Any]:
        latest = self._snapshot.version
        if self._start.latest:
            return self._offset(latest + 1, 0, False)
        if self._start.version is None:
            return self._offset(latest, 0, True)
        wanted = self._start.version
        uri = self._snapshot.location.uri
        if wanted > latest:
            raise ConfigurationError(
                f"startingVersion={wanted} does not exist in {uri}: its latest version is {latest}"
            )
        commits = _list_log(self._snapshot.location).commits
        if wanted not in commits:
            raise ConfigurationError(
                f"startingVersion={wanted} of {uri} is no longer available: log cleanup removed "
                f"its commit (delta.logRetentionDuration). The earliest commit still there is "
                f"{min(commits) if commits else 'none'}."
            )
        return self._offset(wanted, 0, False)

    def _check_table(self, offset: Mapping[str, Any]) -> None:
        stored = offset.get("tableId")
        if stored is not None and stored != self._table_id:
            raise SourceTableChangedError(
                f"the table at {self._snapshot.location.uri} is not the one this query started "
                f"reading (table id {self._table_id}, was {stored}): it was deleted and "
                "created again. Start the query from a new checkpoint."
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
                    return self._offset(version, index, snapshot)
                file = unit[index]
                if not limit.admits(files, size, file.size_bytes):
                    return self._offset(version, index, snapshot)
                files, size, index = files + 1, size + file.size_bytes, index + 1
            version, index, snapshot = version + 1, 0, False
        return self._offset(version, index, snapshot)

    def latest_offset(self) -> dict[str, Any]:
        return self.discover(self.initial_offset(), AdmissionLimit(), up_to=None)

    def files_between(self, start: dict[str, Any], end: dict[str, Any]) -> list[FileSplit]:
        self._check_table(start)
        version, index, snapshot = _position(start)
        stop = _position(end)[:2]
        files: list[FileSplit] = []
        while (version, index) < stop:
            unit = self._unit(version, snapshot)
            if unit is None:
                raise SinkError(
                    f"version {version} of {self._snapshot.location.uri} is not committed, but "
                    f"the micro-batch's end offset {end} lies past it"
                )
            upto = len(unit) if version < stop[0] else stop[1]
            files.extend(unit[index:upto])
            version, index, snapshot = version + 1, 0, False
        return files

    def source(self, files: Sequence[FileSplit]) -> FileGroupSource[Any, Any]:
        chosen = list(files)
        return FileGroupSource(
            _Listed(chosen),
            DeltaFileReader(self._snapshot),
            config=self._config,
            total_bytes=sum(f.size_bytes for f in chosen),
            split_id_prefix="stream",
        )

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
        if version == self._snapshot.version:
            snapshot = self._snapshot
            table = DeltaTable(
                snapshot.location.uri,
                storage_options=snapshot.location.delta_storage_options(),
                version=version,
            )
        else:
            table, snapshot = open_snapshot(self._snapshot.location, SnapshotSpec(version=version))
        files = [
            FileSplit(
                path=f.path,
                size_bytes=f.size_bytes,
                partition_values={
                    name: spell_partition_value(value) for name, value in f.partition_values.items()
                },
            )
            for f in list_data_files(table, snapshot)
        ]
        return sorted(files, key=lambda f: f.path)

    def _commit_files(self, version: int) -> list[FileSplit] | None:
        location = self._snapshot.location
        path = location.path(f"_delta_log/{version:020d}.json")
        try:
            with location.filesystem().open(path, "rb") as handle:
                lines = handle.read().decode("utf-8").splitlines()
        except FileNotFoundError:
            self._check_not_cleaned_up(version)
            return None
        self._known_next = None
        actions = [json.loads(line) for line in lines if line.strip()]
        return self._appended(version, actions)

    def _check_not_cleaned_up(self, version: int) -> None:
        """A missing commit is either not made yet or removed by log cleanup; list the log
        once per missing version to tell which (polls of a caught-up stream then cost one
        GET, not a listing)."""
        if self._known_next == version:
            return
        latest = _list_log(self._snapshot.location).latest
        if latest is not None and latest >= version:
            raise SourceTableChangedError(
                f"version {version} of {self._snapshot.location.uri} is no longer available: "
                "log cleanup removed its commit before this stream read it "
                "(delta.logRetentionDuration), so its rows cannot be read. Start the query "
                f"from a new checkpoint (startingVersion up to {latest})."
            )
        self._known_next = version

    def _appended(self, version: int, actions: list[dict[str, Any]]) -> list[FileSplit]:
        uri = self._snapshot.location.uri
        operation = next(
            (a["commitInfo"].get("operation") for a in actions if "commitInfo" in a), None
        )
        what = f"version {version} of {uri}" + (f" ({operation})" if operation else "")
        for action in actions:
            metadata = action.get("metaData")
            if metadata is not None:
                self._check_metadata(what, metadata)
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
            if add.get("deletionVector"):
                raise UnsupportedTableFeatureError(
                    f"{what} adds {add['path']} with a deletion vector, which this reader does "
                    "not apply (it would return deleted rows)"
                )
            files.append(
                FileSplit(
                    path=unquote(add["path"]),
                    size_bytes=int(add["size"]),
                    partition_values=self._partition_values(add.get("partitionValues") or {}),
                )
            )
        return files

    def _check_metadata(self, what: str, metadata: Mapping[str, Any]) -> None:
        schema = without_field_metadata(json.loads(metadata.get("schemaString", "{}")))
        partition_by = tuple(metadata.get("partitionColumns") or ())
        if schema == self._schema and partition_by == self._snapshot.shape.partition_by:
            return
        raise SourceTableChangedError(
            f"{what} changes the table's schema or partitioning from the one this stream reads "
            "with (the table's at the query's start). Restart the query to read with the new "
            "schema; if a later change follows, start a new query after it."
        )

    def _partition_values(self, raw: Mapping[str, Any]) -> dict[str, str | None]:
        """The log's partition values, by logical name, spelled as the file reader expects."""
        values: dict[str, str | None] = {}
        for key, text in raw.items():
            name = self._partition_names.get(key, key)
            if text is None or text == "":
                values[name] = None
            elif str(self._types.get(name)) in ("timestamp", "timestamp_ntz"):
                try:
                    when = parse_timestamp(str(text))
                except ConfigurationError as err:
                    raise SinkError(f"partition value {name}={text!r} is not a timestamp") from err
                values[name] = str((when - _EPOCH_UTC) // _MICROSECOND)
            else:
                values[name] = str(text)
        return values


class _Listed:
    """A fixed file list as a source's ``list_files``."""

    def __init__(self, files: list[FileSplit]) -> None:
        self._files = files

    def __call__(self) -> list[FileSplit]:
        return self._files
