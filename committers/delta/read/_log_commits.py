"""One commit of a Delta log read directly (its ``_delta_log/NNN.json``), without delta-rs.

Readers that follow a range of versions (a stream, a change data feed) read each commit file
once, with one GET, instead of opening the table at every version. The partition values the
log records are turned into the spelling :class:`~committers.delta.read._source.DeltaFileReader`
reads back (see :func:`~committers.delta.read._source.spell_partition_value`).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from committers.delta.storage._storage import TableLocation
from committers.delta.table._snapshot import Snapshot, parse_timestamp
from framework.errors import ConfigurationError, SinkError

__all__ = ["LogPartitionValues", "commit_operation", "read_commit_actions"]

_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MICROSECOND = dt.timedelta(microseconds=1)


def read_commit_actions(location: TableLocation, version: int) -> list[dict[str, Any]] | None:
    """The actions of commit ``version``, in the order the file lists them; None when the
    commit file does not exist (not committed yet, or removed by log cleanup: the caller
    tells which).

    Raises:
        json.JSONDecodeError: a line of the file is not JSON (a torn or foreign file).
        OSError: the storage cannot be read.
    """
    path = location.path(f"_delta_log/{version:020d}.json")
    try:
        with location.filesystem().open(path, "rb") as handle:
            lines = handle.read().decode("utf-8").splitlines()
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in lines if line.strip()]


def commit_operation(actions: list[dict[str, Any]]) -> str | None:
    """The ``commitInfo.operation`` of a commit (``WRITE``, ``MERGE``, ...), if recorded."""
    return next((a["commitInfo"].get("operation") for a in actions if "commitInfo" in a), None)


class LogPartitionValues:
    """The partition values of a log action, by logical column name, spelled as the file
    reader expects (the log keys them by physical name under column mapping; timestamps become
    microseconds since the epoch; an empty string is null)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._types = {f.name: f.type for f in snapshot.shape.schema.fields}
        mapped = snapshot.column_mapping_mode != "none"
        self._names = {
            (f.physical_name if mapped else f.name): f.name
            for f in snapshot.shape.schema.fields
            if f.name in snapshot.shape.partition_by
        }

    def __call__(self, raw: Mapping[str, Any]) -> dict[str, str | None]:
        """The values of one action's ``partitionValues``.

        Raises:
            SinkError: a timestamp partition value that is not a timestamp.
        """
        values: dict[str, str | None] = {}
        for key, text in raw.items():
            name = self._names.get(key, key)
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
