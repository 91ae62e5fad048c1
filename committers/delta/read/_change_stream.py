"""The change data feed of a Delta table as an unbounded input:
``spark.readStream.format("deltalake").option("readChangeFeed", "true")``.

:class:`ChangeFeedTail` is :class:`~committers.delta.read._stream.DeltaLogTail` with other
files per version: where the query starts, the offsets, the replay of a first batch after a
restart, the schema, protocol and table checks and the log cleanup errors are that stream's
(see ``_stream.py``). As delta-spark streams the change data feed:

* without ``startingVersion`` / ``startingTimestamp``, the snapshot of the start version comes
  first, every row an ``insert`` of that version (split over micro-batches by files);
* then each commit's change files (see ``_change_feed.py``); commits that remove data are
  read, not refused, and ``skipChangeCommits`` does not apply;
* a commit whose changes are recorded in ``cdc`` files is never split over micro-batches
  (the pre- and post-images of an update stay together); it is taken whole while the
  micro-batch's limit has room, so a micro-batch may exceed ``maxFilesPerTrigger`` by the rest
  of such a commit. Other commits are split by files, as delta-spark splits them;
* a version where the change data feed was not recorded stops the stream.
"""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable

from committers.delta.read._change_feed import (
    ChangeFileReader,
    change_feed_enabled,
    commit_changes,
    commit_timestamp_us,
    insert_of,
    is_cdc_file,
)
from committers.delta.read._log_commits import read_commit_actions
from committers.delta.read._source import DeltaFileReader
from committers.delta.read._stream import DeltaLogTail, SourceTableChangedError, StreamStart
from committers.delta.table._snapshot import Snapshot, commit_file_time, list_log
from framework.source import FileSourceConfig, FileSplit

__all__ = ["ChangeFeedTail"]


class ChangeFeedTail(DeltaLogTail):
    """The change files of a Delta table's commits (see the module docstring). Pickles
    without its caches.

    Args:
        snapshot: the version the stream's DataFrame was defined with (``load()``).
        start: where a new query starts.
        config: split sizing of each micro-batch.
    """

    def __init__(self, snapshot: Snapshot, start: StreamStart, *, config: FileSourceConfig) -> None:
        super().__init__(snapshot, start, skip_change_commits=False, config=config)
        self._times: dict[int, float] = {}
        self._recorded: tuple[int, bool] | None = None  # (version, change feed on after it)

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_times": {}, "_recorded": None}

    def _indivisible(self, unit: list[FileSplit]) -> bool:
        return bool(unit) and is_cdc_file(unit[0])

    def _file_reader(self) -> DeltaFileReader:
        return ChangeFileReader(self._snapshot)

    def _snapshot_files(self, version: int) -> list[FileSplit]:
        if not self._recorded_at(version, None):
            raise SourceTableChangedError(
                f"the change data feed of {self._uri} was not recorded at version {version}, "
                "where the stream starts (table property delta.enableChangeDataFeed not true "
                "then); start from a version after it was enabled (startingVersion)"
            )
        actions = read_commit_actions(self._snapshot.location, version) or []
        stamp = commit_timestamp_us(actions, self._commit_time(version))
        return [insert_of(f, version, stamp) for f in super()._snapshot_files(version)]

    def _commit_unit(self, version: int, actions: list[dict[str, Any]]) -> list[FileSplit]:
        what = self._check_commit(version, actions)
        if not self._recorded_at(version, actions):
            raise SourceTableChangedError(
                f"the change data feed of {self._uri} was not recorded at {what} (table "
                "property delta.enableChangeDataFeed not true then): the stream cannot read "
                "its changes. Start a new query (new checkpoint) with a startingVersion after "
                "the feed was enabled again."
            )
        stamp = commit_timestamp_us(actions, self._commit_time(version))
        return commit_changes(what, version, stamp, actions, self._partition_values)

    def _recorded_at(self, version: int, actions: list[dict[str, Any]] | None) -> bool:
        """Whether the change data feed is on at ``version`` (after its commit's metadata,
        ``actions`` when read). Follows the commits one after the other; opens the table once
        where it cannot (the start, after a restart)."""
        metadata = next((a["metaData"] for a in actions or () if "metaData" in a), None)
        if metadata is not None:
            on = change_feed_enabled(metadata.get("configuration") or {})
        elif self._recorded is not None and self._recorded[0] in (version, version - 1):
            on = self._recorded[1]
        elif version == self._snapshot.version:
            on = change_feed_enabled(dict(self._snapshot.shape.configuration))
        else:
            table = DeltaTable(
                self._uri,
                storage_options=self._snapshot.location.delta_storage_options(),
                version=version,
            )
            on = change_feed_enabled(table.metadata().configuration)
        self._recorded = (version, on)
        return on

    def _commit_time(self, version: int) -> float:
        """The commit time of ``version`` (see ``_change_feed.py``): from its file's
        modification time and the previous commit's time; the log is listed once where the
        previous time is not known yet."""
        if version not in self._times:
            previous = self._times.get(version - 1)
            if previous is not None:
                location = self._snapshot.location
                info = location.filesystem().info(location.path(f"_delta_log/{version:020d}.json"))
                self._times[version] = max(commit_file_time(info), previous + 0.001)
            else:
                self._times.update(list_log(self._snapshot.location).commits)
        if version not in self._times:
            raise SourceTableChangedError(
                f"the commit of version {version} of {self._uri} is gone (log cleanup): its "
                "commit time, the _commit_timestamp of its changes, cannot be read. Start the "
                "query from a new checkpoint with a later startingVersion."
            )
        return self._times[version]
