"""The ``"deltalake"`` Spark format: Delta tables read through Spark's Python Data Source API.

``spark.read.format("deltalake").load(uri)`` (after :func:`committers.delta.register`) reads
one snapshot of the table: the latest, or the one named by ``versionAsOf`` / ``timestampAsOf``.
The version is resolved once, when Spark asks for the schema, and pinned for the whole read.

Rows are read by Python tasks (pyarrow) and handed to Spark as Arrow batches; ``df.explain()``
shows the scan as ``BatchScan deltalake[...] (Python)``. :func:`committers.delta.read_table`
hands the files to Spark's own Parquet reader instead, where the table allows it.

Options (names as delta-spark spells them, case-insensitive):

``path``            the table URI (what ``load(uri)`` sets)
``versionAsOf``     an integer version
``timestampAsOf``   an ISO timestamp (UTC unless it has an offset)
``maxSplitBytes``   bytes of files per Spark partition (default 128 MiB, at least 1 MiB)
``filterPushdown``  ``true``: prune partitions and skip files with the filters Spark pushes
                    (default ``false``; read the caveat below)

Streaming reads (``spark.readStream``) take ``startingVersion``, ``startingTimestamp``,
``maxFilesPerTrigger``, ``maxBytesPerTrigger`` and ``skipChangeCommits`` instead of the
snapshot and pushdown options (see ``_stream.py``). ``readChangeFeed`` (or its older name
``readChangeData``) reads the table's change data feed instead of its rows: in a batch read
from ``startingVersion`` / ``startingTimestamp`` to ``endingVersion`` / ``endingTimestamp``
(see ``_change_feed.py``), in a stream commit after commit (see ``_change_stream.py``). Every
other option is a storage option of the table location (``AWS_ENDPOINT_URL``, ...; see
``_storage.py``). delta-spark's read options this format does not support
(``ignoreChanges``, ``failOnDataLoss``, ...) are refused by name, with what to use instead.
Spark resolves the schema (and with it the options) at ``load()`` without saying whether the
read is a stream, so an unknown option's error lists the options of both kinds of read.

Filter pushdown is off by default because of a Spark 4.1/4.2 defect: Spark keeps the plan of
the last query whose filters it pushed to a Python data source, on the DataFrame returned by
``load()``, and reuses it for a later query on that DataFrame that pushes no filter (no
``where``, or only ``OR`` / expressions) - that query would then read only the files the
earlier filters kept. With ``filterPushdown`` on, build each query from its own ``load()``.
A filter the pruning applies exactly (partition columns) is taken off Spark's hands; every
other one Spark evaluates again on the rows read.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringContains,
    StringEndsWith,
    StringStartsWith,
)
from pyspark.sql.pandas.types import from_arrow_type
from pyspark.sql.types import StructType

from committers.delta.read._change_feed import (
    CHANGE_COLUMNS,
    ChangeFileReader,
    ChangeListing,
    ChangeRange,
    ChangeRangeSpec,
)
from committers.delta.read._change_stream import ChangeFeedTail
from committers.delta.read._source import FETCH_BATCHES, DeltaScan, delta_source
from committers.delta.read._stream import DeltaLogTail, StreamStart
from committers.delta.storage._storage import TableLocation
from committers.delta.table._delta_schema import without_field_metadata
from committers.delta.table._schema import FORMAT_NAME
from committers.delta.table._skipping import Op, Predicate, is_exact
from committers.delta.table._snapshot import Snapshot, SnapshotSpec, open_snapshot
from framework.errors import ConfigurationError
from framework.source import FileGroupSource, FileSourceConfig
from framework.spark.connector import (
    AdmissionLimit,
    BoundedSourceReader,
    FileStreamReader,
    SinkBatchWriter,
    SinkStreamWriter,
)

__all__ = [
    "FORMAT_NAME",
    "READ_OPTIONS",
    "ChangeFeedReader",
    "DeltaDataSource",
    "DeltaScanReader",
    "PruningDeltaScanReader",
    "ReadOptions",
    "StreamOptions",
    "change_feed_schema",
    "parse_byte_string",
    "parse_options",
    "parse_stream_options",
    "spark_schema",
]

#: The options of a read that are not storage options.
READ_OPTIONS = ("path", "versionAsOf", "timestampAsOf", "maxSplitBytes", "filterPushdown")
#: The options only a streaming read takes.
STREAM_OPTIONS = (
    "startingVersion",
    "startingTimestamp",
    "maxFilesPerTrigger",
    "maxBytesPerTrigger",
    "skipChangeCommits",
)
#: The options of a change data feed read (besides startingVersion / startingTimestamp).
CHANGE_FEED_OPTIONS = ("readChangeFeed", "readChangeData", "endingVersion", "endingTimestamp")
#: The options only a batch read takes.
_BATCH_ONLY = ("versionAsOf", "timestampAsOf", "filterPushdown")
#: The options a stream of the change data feed does not take.
_NOT_IN_CHANGE_STREAMS = ("endingVersion", "endingTimestamp", "skipChangeCommits")
_USE_SKIP_CHANGE_COMMITS = (
    "use skipChangeCommits=true, which skips every commit that removes data (its added files "
    "too), as delta-spark recommends; without it such a commit stops the stream"
)
_SCHEMA_TRACKING = (
    "this source does not track schema changes: a column dropped, renamed or retyped stops "
    "the stream, and a new query (new checkpoint) with a startingVersion after the change "
    "goes on"
)
#: delta-spark read options this format refuses by name, and what to use instead.
UNSUPPORTED_DELTA_OPTIONS = {
    "ignoreChanges": "it re-emits every row of a rewritten file, duplicates included; "
    + _USE_SKIP_CHANGE_COMMITS,
    "ignoreDeletes": _USE_SKIP_CHANGE_COMMITS,
    "ignoreFileDeletion": _USE_SKIP_CHANGE_COMMITS,
    "failOnDataLoss": "a commit removed by log cleanup before the stream read it always stops "
    "the stream (its rows cannot be read); start a new query from a new checkpoint",
    "excludeRegex": "every appended file is read; filter the rows instead",
    "withEventTimeOrder": "files are read in commit order",
    "schemaTrackingLocation": _SCHEMA_TRACKING,
    "schemaLocation": _SCHEMA_TRACKING,
    "allowSourceColumnRename": _SCHEMA_TRACKING,
    "allowSourceColumnDrop": _SCHEMA_TRACKING,
    "allowSourceColumnTypeChange": _SCHEMA_TRACKING,
}
#: Files per micro-batch unless ``maxFilesPerTrigger`` says otherwise (delta-spark's default).
DEFAULT_MAX_FILES_PER_TRIGGER = 1000
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no", ""})

_COMPARISONS: dict[type, Op] = {
    EqualTo: "eq",
    EqualNullSafe: "eq_null_safe",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
    StringStartsWith: "starts_with",
    StringEndsWith: "ends_with",
    StringContains: "contains",
}


def spark_schema(snapshot: Snapshot) -> StructType:
    """The snapshot's schema as Spark's: Delta's schema JSON is Spark's, so names, types and
    nullability (nested included) are the table's exactly."""
    return StructType.fromJson(without_field_metadata(json.loads(snapshot.schema_json)))


@dataclass(frozen=True)
class ReadOptions:
    """A read's options, validated: where, which version, how to split, whether to prune."""

    location: TableLocation
    snapshot: SnapshotSpec
    config: FileSourceConfig
    filter_pushdown: bool = False
    change_feed: bool = False


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """Split a read's options into the location, the snapshot, the split sizing, the
    pushdown switch and, with ``readChangeFeed``, the options of the change data feed (those
    of a batch read are checked by :meth:`ChangeRangeSpec.of` when the read is planned; a
    stream's by :func:`parse_stream_options`).

    Raises:
        ConfigurationError: no path; a malformed or contradictory option; an option that is
            neither a read option nor a storage option of the location's scheme.
    """
    given = {str(k).lower(): v for k, v in options.items()}
    _refuse_unsupported(given)
    change_feed = _change_feed_options(given)
    for name in (*STREAM_OPTIONS, *CHANGE_FEED_OPTIONS):
        given.pop(name.lower(), None)  # validated by parse_stream_options / ChangeRangeSpec
    path = given.pop("path", None)
    if not path:
        raise ConfigurationError(
            f"the {FORMAT_NAME} format needs the table's path: "
            f"spark.read.format({FORMAT_NAME!r}).load('/path/to/table')"
        )
    spec = SnapshotSpec.of(given.pop("versionasof", None), given.pop("timestampasof", None))
    config = FileSourceConfig(fetch_size=FETCH_BATCHES)
    if "maxsplitbytes" in given:
        raw = str(given.pop("maxsplitbytes")).strip()
        try:
            config = FileSourceConfig(max_split_bytes=int(raw), fetch_size=FETCH_BATCHES)
        except ValueError as err:  # ConfigurationError is a ValueError too
            raise ConfigurationError(f"option maxSplitBytes={raw!r}: {err}") from err
    pushdown = str(given.pop("filterpushdown", "false")).strip().lower()
    if pushdown not in _TRUE | _FALSE:
        raise ConfigurationError(f"option filterPushdown must be true or false, got {pushdown!r}")
    try:
        location = TableLocation.of(path, given)
    except ConfigurationError as err:
        raise ConfigurationError(f"{err}.{_suggestion(options)} {_OPTIONS_HELP}") from err
    return ReadOptions(
        location, spec, config, filter_pushdown=pushdown in _TRUE, change_feed=change_feed
    )


def _change_feed_options(given: Mapping[str, object]) -> bool:
    """Whether a read's options (names in lower case) read the change data feed. Its range
    is checked when the read is planned (a stream does not need one).

    Raises:
        ConfigurationError: an end of a range without ``readChangeFeed``; a snapshot or
            pushdown option with it.
    """
    flags = [name for name in CHANGE_FEED_OPTIONS[:2] if name.lower() in given]
    if not any(_flag(name, given[name.lower()]) for name in flags):
        for name in CHANGE_FEED_OPTIONS[2:]:
            if name.lower() in given:
                raise ConfigurationError(
                    f"option {name} ends the range of a change data feed read; set "
                    "readChangeFeed=true to read the change data feed"
                )
        return False
    for name in _BATCH_ONLY:
        if name.lower() in given:
            raise ConfigurationError(
                f"option {name} is not taken by a change data feed read (readChangeFeed=true), "
                "which reads the changes of a range of versions (startingVersion / "
                "startingTimestamp to endingVersion / endingTimestamp), not one snapshot"
            )
    return True


_OPTIONS_HELP = (
    f"Streaming reads of the {FORMAT_NAME} format take the options "
    f"{', '.join(STREAM_OPTIONS)} and maxSplitBytes; batch reads take "
    f"{', '.join(_BATCH_ONLY)} and maxSplitBytes; reads of the change data feed take "
    "readChangeFeed=true, startingVersion or startingTimestamp, endingVersion or "
    "endingTimestamp (batch reads); every other option is a storage option of the table."
)


def _refuse_unsupported(given: Mapping[str, object]) -> None:
    """delta-spark's read options this format does not support, refused by name."""
    for name, instead in UNSUPPORTED_DELTA_OPTIONS.items():
        if name.lower() in given:
            raise ConfigurationError(
                f"option {name} is a delta-spark streaming read option that the {FORMAT_NAME} "
                f"format does not support: {instead}. {_OPTIONS_HELP}"
            )


def _suggestion(options: Mapping[str, object]) -> str:
    """`` Did you mean 'x'?`` for a given name close to one of the format's options."""
    known = {name.lower(): name for name in (*READ_OPTIONS, *STREAM_OPTIONS, *CHANGE_FEED_OPTIONS)}
    for raw in options:
        name = str(raw)
        if name.lower() in known:
            continue
        close = difflib.get_close_matches(name.lower(), known, n=1, cutoff=0.8)
        if close:
            return f" Did you mean {known[close[0]]!r} (not {name!r})?"
    return ""


@dataclass(frozen=True)
class StreamOptions:
    """A streaming read's own options, validated."""

    start: StreamStart
    skip_change_commits: bool
    limit: AdmissionLimit


def _positive_int(name: str, raw: object) -> int:
    text = str(raw).strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigurationError(f"option {name} must be a positive integer, got {raw!r}")
    return int(text)


def _flag(name: str, raw: object) -> bool:
    text = str(raw).strip().lower()
    if text not in _TRUE | _FALSE:
        raise ConfigurationError(f"option {name} must be true or false, got {raw!r}")
    return text in _TRUE


_BYTE_STRING = re.compile(r"([0-9]+)([a-z]*)")
_BYTE_UNITS: dict[str, int] = {
    "": 1,
    "b": 1,
    **{
        suffix: 1024**power
        for power, unit in enumerate("kmgtp", 1)
        for suffix in (unit, unit + "b")
    },
}


def parse_byte_string(name: str, raw: object) -> int:
    """A positive size as Spark's ``JavaUtils.byteStringAsBytes`` reads it (what delta-spark
    reads ``maxBytesPerTrigger`` with): digits, then ``b``, ``k``/``kb``, ``m``/``mb``,
    ``g``/``gb``, ``t``/``tb`` or ``p``/``pb`` (powers of 1024), bytes without a unit.

    Raises:
        ConfigurationError: anything else (fractions, negative or zero sizes, other units).
    """
    text = str(raw).strip().lower()
    match = _BYTE_STRING.fullmatch(text)
    if match is None or match.group(2) not in _BYTE_UNITS or int(match.group(1)) < 1:
        raise ConfigurationError(
            f"option {name} must be a positive size such as '10m', '1g', '512k' or a number "
            f"of bytes (units b, k, m, g, t, p: powers of 1024), got {raw!r}"
        )
    return int(match.group(1)) * _BYTE_UNITS[match.group(2)]


def parse_stream_options(options: Mapping[str, str]) -> StreamOptions:
    """The options of ``spark.readStream.format("deltalake")`` beyond those of a batch read.
    As in delta-spark, ``maxFilesPerTrigger`` defaults to 1000 unless ``maxBytesPerTrigger``
    is given alone.

    Raises:
        ConfigurationError: a malformed value, ``startingVersion`` with
            ``startingTimestamp``, or an option that names a snapshot (``versionAsOf``,
            ``timestampAsOf``) or filter pushdown, which a stream has not.
    """
    given = {str(k).lower(): v for k, v in options.items()}
    for name in _BATCH_ONLY:
        if name.lower() in given:
            raise ConfigurationError(
                f"option {name} is for batch reads; a stream reads every version from where it "
                "starts (use startingVersion or startingTimestamp)"
            )
    max_bytes = None
    if "maxbytespertrigger" in given:
        max_bytes = parse_byte_string("maxBytesPerTrigger", given["maxbytespertrigger"])
    max_files = None if max_bytes is not None else DEFAULT_MAX_FILES_PER_TRIGGER
    if "maxfilespertrigger" in given:
        max_files = _positive_int("maxFilesPerTrigger", given["maxfilespertrigger"])
    return StreamOptions(
        start=StreamStart.of(given.get("startingversion"), given.get("startingtimestamp")),
        skip_change_commits=_flag("skipChangeCommits", given.get("skipchangecommits", "false")),
        limit=AdmissionLimit(max_files=max_files, max_bytes=max_bytes),
    )


def to_predicate(spark_filter: Filter) -> Predicate | None:
    """The predicate of a pushed Spark filter on one top-level column, or None."""
    if isinstance(spark_filter, Not):
        inner = to_predicate(spark_filter.child)
        return None if inner is None or inner.negated else replace(inner, negated=True)
    attribute: tuple[str, ...] = tuple(getattr(spark_filter, "attribute", ()))
    if len(attribute) != 1:
        return None  # nested fields are not pruned
    column = attribute[0]
    if isinstance(spark_filter, IsNull):
        return Predicate(column, "is_null")
    if isinstance(spark_filter, IsNotNull):
        return Predicate(column, "is_not_null")
    if isinstance(spark_filter, In):
        return Predicate(column, "in", tuple(spark_filter.value))
    op = _COMPARISONS.get(type(spark_filter))
    return None if op is None else Predicate(column, op, getattr(spark_filter, "value", None))


class DeltaScanReader(BoundedSourceReader):
    """Reads every file of one pinned snapshot (Spark applies the query's filters)."""

    def __init__(self, schema: StructType, scan: DeltaScan) -> None:
        super().__init__(schema)
        self._scan = scan

    def source(self) -> FileGroupSource[Any, Any]:
        return delta_source(self._scan)


class PruningDeltaScanReader(DeltaScanReader):
    """Reads the files of one pinned snapshot that the filters Spark pushes may match
    (``filterPushdown``; see the module docstring for Spark's caveat)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        """Use every filter on a top-level column for pruning; hand back to Spark every filter
        the pruning does not apply exactly (or at all)."""
        predicates: list[Predicate] = []
        remaining: list[Filter] = []
        for spark_filter in filters:
            predicate = to_predicate(spark_filter)
            if predicate is None:
                remaining.append(spark_filter)
                continue
            predicates.append(predicate)
            if not is_exact(predicate, self._scan.snapshot.shape):
                remaining.append(spark_filter)
        self._scan = replace(self._scan, predicates=tuple(predicates))
        return remaining


def change_feed_schema(snapshot: Snapshot) -> StructType:
    """The schema of the snapshot's change data feed: its columns, then ``_change_type``
    (string), ``_commit_version`` (long) and ``_commit_timestamp`` (timestamp), as
    delta-spark's."""
    schema = spark_schema(snapshot)
    for name, kind in CHANGE_COLUMNS:
        schema = schema.add(name, from_arrow_type(kind))
    return schema


class ChangeFeedReader(BoundedSourceReader):
    """Reads the change files of one range of versions (see ``_change_feed.py``)."""

    def __init__(self, schema: StructType, listing: ChangeListing, config: FileSourceConfig):
        super().__init__(schema)
        self._listing = listing
        self._config = config

    def source(self) -> FileGroupSource[Any, Any]:
        snapshot = self._listing.snapshot
        return FileGroupSource(
            self._listing,
            ChangeFileReader(snapshot),
            config=self._config,
            split_id_prefix=f"changes-v{snapshot.version}",
        )


def _refuse_in_change_stream(options: Mapping[str, str]) -> None:
    given = {str(k).lower() for k in options}
    for name in _NOT_IN_CHANGE_STREAMS:
        if name.lower() in given:
            raise ConfigurationError(
                f"option {name} is not taken by a stream of the change data feed: a stream "
                "reads every commit from where it starts, removals included (use a batch read "
                "with readChangeFeed=true for a bounded range)"
            )


class DeltaDataSource(DataSource):
    """The ``"deltalake"`` format (see the module docstring).

    Errors are raised in Spark's Python workers and reach the caller inside Spark's own
    exception (``AnalysisException`` / ``PythonException``), with this package's error class
    and message in its text: ``NotATableError``, ``ConfigurationError``,
    ``UnsupportedTableFeatureError``, ``UnsupportedTypeError``.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        """Resolve the snapshot (pinned for the rest of the read) and return its schema."""
        options = parse_options(self.options)
        _table, snapshot = open_snapshot(options.location, options.snapshot)
        self._scan = DeltaScan(snapshot, config=options.config)
        self._pushdown = options.filter_pushdown
        self._change_feed = options.change_feed
        return change_feed_schema(snapshot) if options.change_feed else spark_schema(snapshot)

    def _resolved_scan(self) -> DeltaScan:
        scan: DeltaScan | None = getattr(self, "_scan", None)
        if scan is None:
            raise ConfigurationError(
                f"the {FORMAT_NAME} format takes its schema from the table; read it without "
                ".schema(...) (select or cast the columns afterwards)"
            )
        return scan

    def reader(self, schema: StructType) -> DeltaScanReader | ChangeFeedReader:
        """A batch read of the pinned snapshot or, with ``readChangeFeed``, of the changes of
        the range the options name (resolved now, in the table as of ``load()``).

        Raises:
            ConfigurationError: see :meth:`ChangeRange.resolve` and :class:`ChangeListing`.
        """
        scan = self._resolved_scan()
        if getattr(self, "_change_feed", False):
            given = {str(k).lower(): v for k, v in self.options.items()}
            changes = ChangeRange.resolve(scan.snapshot, ChangeRangeSpec.of(given))
            listing = ChangeListing(scan.snapshot, changes)
            listing()  # the range's errors now, before any task starts
            return ChangeFeedReader(schema, listing, scan.config)
        if getattr(self, "_pushdown", False):
            return PruningDeltaScanReader(schema, scan)
        return DeltaScanReader(schema, scan)

    def streamReader(self, schema: StructType) -> FileStreamReader:
        """A stream of the files the table's commits append (see ``_stream.py``), read with
        the schema the stream was defined with; where it starts is fixed when it starts."""
        scan = self._resolved_scan()
        if getattr(self, "_change_feed", False):
            _refuse_in_change_stream(self.options)
            stream = parse_stream_options(self.options)
            return FileStreamReader(
                schema,
                ChangeFeedTail(scan.snapshot, stream.start, config=scan.config),
                stream.limit,
            )
        stream = parse_stream_options(self.options)
        tail = DeltaLogTail(
            scan.snapshot,
            stream.start,
            skip_change_commits=stream.skip_change_commits,
            config=scan.config,
        )
        return FileStreamReader(schema, tail, stream.limit)

    def writer(self, schema: StructType, overwrite: bool) -> SinkBatchWriter:
        """``df.write.format("deltalake")``: one exactly-once commit (see
        ``_format_writer.py`` for the options and the checks)."""
        # Loaded here, not at the top: the processes that only read (a streaming read's
        # Python runner, a scan's tasks) then never import the sink, 0.8 s of CPU each.
        from committers.delta.format._format_writer import batch_writer

        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> SinkStreamWriter:
        """``df.writeStream.format("deltalake")``: one exactly-once commit per micro-batch."""
        from committers.delta.format._format_writer import stream_writer

        return stream_writer(self.options, schema, overwrite)
