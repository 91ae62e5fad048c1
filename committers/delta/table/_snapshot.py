"""Which version of a Delta table a read sees, and whether this reader can read it correctly.

A read names its snapshot as delta-spark does: the latest version, ``versionAsOf`` (an integer)
or ``timestampAsOf`` (an ISO timestamp: the newest version committed at or before it, where a
commit's time is its ``inCommitTimestamp`` on a table with in-commit timestamps, else the
modification time of its ``_delta_log/NNN.json`` file, as delta-spark defines it; see
:class:`CommitClock`). :func:`open_snapshot` opens it with delta-rs and refuses, with the reason,
every table whose reader features this reader would get wrong.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from committers.delta.storage._storage import TableLocation
from committers.delta.table._delta_schema import arrow_type, spark_type
from committers.delta.table._protocol import (
    UnsupportedTableFeatureError,
    protocol_reader_features,
    reader_features,
    recorded_in_commit_timestamp,
)
from committers.delta.table._rules import TableShape
from committers.delta.table._table import file_mtime, plain_error_text
from committers.delta.table._type_widening import check_type_changes
from framework.errors import (
    ConfigurationError,
    DestinationError,
    NotATableError,
    UnsupportedTypeError,
)

__all__ = [
    "READABLE_FEATURES",
    "CommitClock",
    "LogListing",
    "Snapshot",
    "SnapshotSpec",
    "check_readable",
    "commit_file_time",
    "commit_times",
    "first_version_at_or_after",
    "last_version_at_or_before",
    "list_log",
    "open_snapshot",
    "parse_timestamp",
    "protocol_reader_features",
    "reader_features",
]

#: Reader features this reader honours, and how.
READABLE_FEATURES = {
    "columnMapping": "the files' physical column names (or field ids) are mapped to the table's",
    "deletionVectors": "the rows a file's deletion vector marks are dropped (checksum checked)",
    "timestampNtz": "read as TIMESTAMP_NTZ",
    "typeWidening": "files written before a column's type was widened are read as the wider "
    "type (each recorded change checked against the protocol's widenings)",
    "typeWidening-preview": "files written before a column's type was widened are read as the "
    "wider type (each recorded change checked against the protocol's widenings)",
    "v2Checkpoint": "the log, checkpoints included, is read by delta-rs",
    "vacuumProtocolCheck": "it only restricts VACUUM",
    # delta-rs lists it on every table it upgrades to reader version 3; a variant column itself
    # is refused by type.
    "variantType": "variant columns are refused by type",
    "variantType-preview": "variant columns are refused by type",
}

# Why the others are refused.
_REFUSED_READER_FEATURES = {
    "variantShredding-preview": "variant columns may be stored shredded, which this reader "
    "does not reassemble",
    "catalogManaged": "the table's commits are owned by a catalog this reader does not ask",
    "catalogOwned-preview": "the table's commits are owned by a catalog this reader does not ask",
}

_EPOCH_UTC = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_MILLISECOND = dt.timedelta(milliseconds=1)
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT_FILE = re.compile(r"^(\d{20})\.checkpoint(\..+)?\.(parquet|json)$")
_ISO_FRACTION = re.compile(r"\.(\d{1,6})(?=[+-]\d\d:\d\d$|$)")


def parse_timestamp(text: str, option: str = "timestampAsOf") -> dt.datetime:
    """An ISO timestamp (``2026-11-21``, ``2026-11-21 10:00:00``, ``...T10:00:00.5Z``,
    ``...+01:00``) as an aware datetime; without an offset it is UTC.

    Raises:
        ConfigurationError: the text is not such a timestamp (the message names ``option``).
    """
    raw = text.strip()
    normalized = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    # Python 3.10's fromisoformat takes 3 or 6 fraction digits only: pad to 6.
    normalized = _ISO_FRACTION.sub(lambda m: "." + m.group(1).ljust(6, "0"), normalized)
    try:
        parsed = dt.datetime.fromisoformat(normalized)
    except ValueError:
        raise ConfigurationError(
            f"{option} must be an ISO timestamp such as '2026-11-21 10:00:00', "
            f"'2026-11-21T10:00:00Z' or '2026-11-21', got {text!r}"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.timezone.utc)


@dataclass(frozen=True, kw_only=True)
class SnapshotSpec:
    """The version a read asks for: the latest (neither set), a version or a timestamp.

    Raises:
        ConfigurationError: both are set, the version is not an integer >= 0, or the
            timestamp is not a datetime.
    """

    version: int | None = None
    timestamp: dt.datetime | None = None

    def __post_init__(self) -> None:
        if self.version is not None and self.timestamp is not None:
            raise ConfigurationError(
                "give versionAsOf or timestampAsOf, not both: each names one version of the table"
            )
        if self.version is not None and (
            isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0
        ):
            raise ConfigurationError(f"versionAsOf must be an integer >= 0, got {self.version!r}")
        if self.timestamp is not None:
            if not isinstance(self.timestamp, dt.datetime):
                raise ConfigurationError(
                    f"timestampAsOf must be a datetime or an ISO string, got {self.timestamp!r}"
                )
            if self.timestamp.tzinfo is None:
                object.__setattr__(
                    self, "timestamp", self.timestamp.replace(tzinfo=dt.timezone.utc)
                )

    @classmethod
    def of(cls, version: object = None, timestamp: object = None) -> SnapshotSpec:
        """From user values: ``version`` an int or a string of digits, ``timestamp`` a
        datetime or an ISO string (see :func:`parse_timestamp`)."""
        if isinstance(version, str):
            text = version.strip()
            if not text.isdigit():
                raise ConfigurationError(f"versionAsOf must be an integer >= 0, got {version!r}")
            version = int(text)
        if isinstance(timestamp, str):
            timestamp = parse_timestamp(timestamp)
        return cls(version=version, timestamp=timestamp)  # type: ignore[arg-type]

    def describe(self) -> str:
        if self.version is not None:
            return f"version {self.version}"
        if self.timestamp is not None:
            return f"timestamp {self.timestamp.isoformat()}"
        return "the latest version"


@dataclass(frozen=True)
class Snapshot:
    """One resolved version of a table: plain values, picklable (no delta-rs handle)."""

    location: TableLocation
    version: int
    shape: TableShape
    reader_features: frozenset[str]
    schema_json: str  # the table schema as the log spells it (Spark's StructType JSON)

    @property
    def column_mapping_mode(self) -> str:
        """``"name"``, ``"id"`` or ``"none"``."""
        if "columnMapping" not in self.reader_features:
            return "none"
        mode = dict(self.shape.configuration).get("delta.columnMapping.mode", "none")
        return mode if mode in ("name", "id") else "none"


def check_readable(uri: str, reader_version: int, features: Iterable[str]) -> None:
    """Refuse a table this reader would read wrongly.

    Raises:
        UnsupportedTableFeatureError: a reader feature other than :data:`READABLE_FEATURES`
            (or a reader version above 3), naming each feature and why.
    """
    if reader_version > 3:
        raise UnsupportedTableFeatureError(
            f"table {uri} requires reader version {reader_version}, which this reader does not "
            "know (it reads up to version 3). Read it with an engine that supports it."
        )
    refused = sorted(set(features) - READABLE_FEATURES.keys())
    if not refused:
        return
    reasons = "; ".join(
        f"{name}: {_REFUSED_READER_FEATURES.get(name, 'unknown to this reader')}"
        for name in refused
    )
    raise UnsupportedTableFeatureError(
        f"table {uri} requires the reader feature(s) {', '.join(refused)}, which this reader "
        f"cannot honour ({reasons}). Reading it anyway could return wrong rows, so nothing was "
        "read. Read it with an engine that supports the feature (delta-spark)."
    )


@dataclass(frozen=True)
class LogListing:
    """Versions found in ``_delta_log``: commit files with their times, and checkpoints."""

    commits: Mapping[int, float]  # version -> commit time (seconds, made increasing)
    checkpoints: frozenset[int]

    @property
    def latest(self) -> int | None:
        versions = set(self.commits) | self.checkpoints
        return max(versions) if versions else None

    @property
    def earliest(self) -> int | None:
        """The oldest version that can still be reconstructed: version 0 with every commit
        after it, or a checkpoint followed by every commit after it."""
        latest = self.latest
        if latest is None:
            return None
        lowest = latest
        while lowest - 1 in self.commits:
            lowest -= 1
        if lowest == 0 and 0 in self.commits:
            return 0
        usable = [c for c in self.checkpoints if c >= lowest - 1]
        return min(usable) if usable else None


def list_log(location: TableLocation) -> LogListing:
    """The commit files and checkpoints in the table's ``_delta_log`` (empty: no log)."""
    fs = location.filesystem()
    try:
        entries = fs.ls(location.path("_delta_log"), detail=True, refresh=True)
    except FileNotFoundError:
        return LogListing({}, frozenset())
    raw: dict[int, float] = {}
    checkpoints: set[int] = set()
    for info in entries:
        name = str(info["name"]).rstrip("/").rsplit("/", 1)[-1]
        commit = _COMMIT_FILE.match(name)
        if commit:
            raw[int(commit.group(1))] = commit_file_time(info)
            continue
        checkpoint = _CHECKPOINT_FILE.match(name)
        if checkpoint:
            checkpoints.add(int(checkpoint.group(1)))
    commits: dict[int, float] = {}
    previous: float | None = None
    for version in sorted(raw):
        # delta-spark makes commit times strictly increasing (clock skew between writers).
        stamp = raw[version] if previous is None else max(raw[version], previous + 0.001)
        commits[version] = previous = stamp
    return LogListing(commits, frozenset(checkpoints))


def commit_file_time(info: Mapping[str, Any]) -> float:
    """The modification time of a commit file's fsspec entry, cut to whole milliseconds (in
    seconds), as Hadoop (and so delta-spark) reports it: a commit time printed to the
    millisecond names that commit exactly. (Not yet made increasing: see :func:`list_log`.)"""
    seconds = file_mtime(info)
    return (round(seconds * 1_000_000) // 1000) / 1000


def commit_times(location: TableLocation) -> dict[int, float]:
    """Each version's commit file's modification time (seconds since the epoch, whole
    milliseconds), made strictly increasing: the time ``timestampAsOf`` resolves it by on a
    table without in-commit timestamps (see :class:`CommitClock`). Versions whose commit file
    log cleanup removed are absent. Raises what the listing raises."""
    return dict(list_log(location).commits)


class CommitClock:
    """When each version in ``log`` was committed, as time travel by timestamp resolves it:
    its ``inCommitTimestamp`` where its commitInfo records one (PROTOCOL.md, "In-Commit
    Timestamps": every commit from the version that enabled them on, strictly increasing, the
    first one after the commit before it), else its commit file's modification time (see
    :func:`list_log`); seconds since the epoch, whole milliseconds.

    A table whose latest commit records none is timed by the listing alone; otherwise the
    commit files are read as the binary searches below probe them (a few per search, not the
    whole log)."""

    def __init__(self, location: TableLocation, log: LogListing) -> None:
        self._location = location
        self._log = log
        self._recorded: dict[int, float | None] = {}
        latest = max(log.commits) if log.commits else None
        self.in_commit_timestamps = latest is not None and self._recorded_time(latest) is not None

    def __call__(self, version: int) -> float:
        if self.in_commit_timestamps:
            recorded = self._recorded_time(version)
            if recorded is not None:
                return recorded
        return self._log.commits[version]

    def _recorded_time(self, version: int) -> float | None:
        if version not in self._recorded:
            self._recorded[version] = _in_commit_timestamp(self._location, version)
        return self._recorded[version]

    def last_at_or_before(self, versions: list[int], seconds: float) -> int | None:
        """The newest of ``versions`` (ascending) committed at or before ``seconds``."""
        index = bisect.bisect_right(versions, seconds, key=self)
        return versions[index - 1] if index else None

    def first_at_or_after_ms(self, versions: list[int], millis: int) -> int | None:
        """The oldest of ``versions`` (ascending) committed at or after ``millis`` (commit
        times truncated to the millisecond, as delta-spark compares them)."""
        index = bisect.bisect_left(versions, millis, key=lambda v: math.floor(self(v) * 1000))
        return versions[index] if index < len(versions) else None


def _in_commit_timestamp(location: TableLocation, version: int) -> float | None:
    """The ``inCommitTimestamp`` (seconds) commit ``version`` records first thing, if any."""
    try:
        with location.filesystem().open(location.path(f"_delta_log/{version:020d}.json")) as f:
            first = f.readline()
    except FileNotFoundError:
        return None
    stamp = recorded_in_commit_timestamp(first)
    return None if stamp is None else stamp / 1000


def _not_a_table(location: TableLocation, err: BaseException | None = None) -> NotATableError:
    detail = f" ({plain_error_text(err)})" if err is not None else ""
    return NotATableError(
        f"{location.uri} is not a Delta table: it has no _delta_log with commits{detail}. "
        "Check the path (a table's root, not one of its partition directories)."
    )


def _version_error(
    location: TableLocation, version: int, log: LogListing
) -> ConfigurationError | NotATableError:
    latest, earliest = log.latest, log.earliest
    if latest is None:
        return _not_a_table(location)
    if version > latest:
        return ConfigurationError(
            f"versionAsOf={version} does not exist in {location.uri}: its latest version is "
            f"{latest}"
        )
    return ConfigurationError(
        f"versionAsOf={version} of {location.uri} is no longer available: log cleanup removed "
        f"the commits needed to rebuild it (delta.logRetentionDuration). The earliest version "
        f"that can be read is {earliest}."
    )


def _utc(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).isoformat(timespec="milliseconds")


def _version_at(
    location: TableLocation, when: dt.datetime, log: LogListing, option: str = "timestampAsOf"
) -> int:
    latest, earliest = log.latest, log.earliest
    if latest is None:
        raise _not_a_table(location)
    available = sorted(v for v in log.commits if earliest is not None and earliest <= v <= latest)
    if not available:
        raise ConfigurationError(
            f"{option} cannot be resolved for {location.uri}: the commit files of its "
            "readable versions are gone (log cleanup). Use a version instead."
        )
    clock = CommitClock(location, log)
    wanted = when.timestamp()
    first = available[0]
    if wanted < clock(first):
        what = (
            "the first commit" if first == 0 else f"the earliest version still available ({first})"
        )
        raise ConfigurationError(
            f"{option}={when.isoformat()} is before {what} of {location.uri}, committed at "
            f"{_utc(clock(first))}. Use a later timestamp."
        )
    last = available[-1]
    if wanted > clock(last) + 0.001:  # commit times have millisecond precision
        raise ConfigurationError(
            f"{option}={when.isoformat()} is after the latest version ({last}) of "
            f"{location.uri}, committed at {_utc(clock(last))}: a later commit could still "
            "change what it reads. Use a timestamp at or before that, a version, or neither "
            "for the latest version."
        )
    found = clock.last_at_or_before(available, wanted + 0.0005)
    assert found is not None  # wanted is at or after the first version's time
    return found


def last_version_at_or_before(location: TableLocation, when: dt.datetime, option: str) -> int:
    """The newest version committed at or before ``when``, as ``timestampAsOf`` resolves it
    (the error messages name ``option``; commit times as :class:`CommitClock` gives them).

    Raises:
        NotATableError: the location holds no Delta table.
        ConfigurationError: ``when`` is before the earliest available commit or after the
            latest one.
    """
    return _version_at(location, when, list_log(location), option)


def first_version_at_or_after(location: TableLocation, when: dt.datetime, option: str) -> int:
    """The first version committed at or after ``when`` (commit times as for
    ``timestampAsOf``, to the millisecond), as delta-spark resolves ``startingTimestamp``: the
    earliest commit still in the log when ``when`` is before it.

    Raises:
        NotATableError: the location holds no Delta table.
        ConfigurationError: ``when`` is after the latest commit (the version it names does not
            exist yet).
    """
    log = list_log(location)
    if log.latest is None or not log.commits:
        raise _not_a_table(location)
    clock = CommitClock(location, log)
    # Milliseconds, truncated, as delta-spark compares them (Hadoop's modification times).
    wanted_ms = (when - _EPOCH_UTC) // _MILLISECOND
    found = clock.first_at_or_after_ms(sorted(log.commits), wanted_ms)
    if found is None:
        last = max(log.commits)
        raise ConfigurationError(
            f"{option}={when.isoformat()} is after the latest version ({last}) of "
            f"{location.uri}, committed at {_utc(clock(last))}: no version is committed at "
            f"or after it yet. Use a timestamp at or before that, or startingVersion='latest' "
            "to read only the commits made after the query starts."
        )
    return found


def open_snapshot(location: TableLocation, spec: SnapshotSpec) -> tuple[DeltaTable, Snapshot]:
    """Open the version of the table ``spec`` names, after checking that it can be read.

    Returns:
        The delta-rs handle (driver only: it does not pickle) and the snapshot's plain values.

    Raises:
        NotATableError: the location holds no Delta table.
        ConfigurationError: the version does not exist or log cleanup removed it; the
            timestamp is before the first available commit or after the latest one.
        UnsupportedTableFeatureError: a reader feature this reader cannot honour.
        UnsupportedTypeError: a column has a type this reader cannot read.
        DestinationError: the storage cannot be read (credentials, network).
    """
    options = location.delta_storage_options()
    version = spec.version
    if spec.timestamp is not None:
        version = _version_at(location, spec.timestamp, list_log(location))
    try:
        table = DeltaTable(location.uri, storage_options=options, version=version)
    except (TableNotFoundError, DeltaError) as err:
        log = list_log(location)
        if log.latest is None:
            raise _not_a_table(location, err) from err
        if version is not None:
            raise _version_error(location, version, log) from err
        raise DestinationError(
            f"cannot read the Delta log of {location.uri}: {plain_error_text(err)}"
        ) from err
    except OSError as err:
        raise DestinationError(
            f"cannot read {location.uri}: {plain_error_text(err)}. Check the path, the storage "
            "options and this process's credentials."
        ) from err
    reader_version, features = reader_features(table)
    check_readable(location.uri, reader_version, features)
    shape = TableShape.of_table(table)
    _check_types(location.uri, shape)
    return table, Snapshot(location, table.version(), shape, features, table.schema().to_json())


def _check_types(uri: str, shape: TableShape) -> None:
    check_type_changes(uri, shape.schema)
    for field in shape.schema.fields:
        try:
            arrow_type(field.type, physical=False)
            spark_type(field.type, physical=False)
        except ValueError:
            raise UnsupportedTypeError(
                f"column {field.name!r} of {uri} has a type this reader cannot read "
                f"({field.type!r}); read the table with an engine that supports it"
            ) from None
    for name in shape.partition_by:
        if shape.schema.field(name).type == "binary":
            raise UnsupportedTypeError(
                f"partition column {name!r} of {uri} is binary, which this reader does not "
                "read as a partition value"
            )
