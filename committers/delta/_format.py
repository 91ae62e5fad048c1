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

Every other option is a storage option of the table location (``AWS_ENDPOINT_URL``, ...; see
``_storage.py``). A later change adds the writer methods to :class:`DeltaDataSource`.

Filter pushdown is off by default because of a Spark 4.1/4.2 defect: Spark keeps the plan of
the last query whose filters it pushed to a Python data source, on the DataFrame returned by
``load()``, and reuses it for a later query on that DataFrame that pushes no filter (no
``where``, or only ``OR`` / expressions) - that query would then read only the files the
earlier filters kept. With ``filterPushdown`` on, build each query from its own ``load()``.
A filter the pruning applies exactly (partition columns) is taken off Spark's hands; every
other one Spark evaluates again on the rows read.
"""

from __future__ import annotations

import json
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
from pyspark.sql.types import StructType

from committers.delta._skipping import Op, Predicate, is_exact
from committers.delta._snapshot import Snapshot, SnapshotSpec, open_snapshot
from committers.delta._source import FETCH_BATCHES, DeltaScan, delta_source
from committers.delta._storage import TableLocation
from framework.errors import ConfigurationError
from framework.source import FileGroupSource, FileSourceConfig
from framework.spark._source import BoundedSourceReader

__all__ = [
    "FORMAT_NAME",
    "READ_OPTIONS",
    "DeltaDataSource",
    "DeltaScanReader",
    "PruningDeltaScanReader",
    "ReadOptions",
    "parse_options",
    "spark_schema",
]

FORMAT_NAME = "deltalake"
#: The options of a read that are not storage options.
READ_OPTIONS = ("path", "versionAsOf", "timestampAsOf", "maxSplitBytes", "filterPushdown")
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


def _strip_metadata(raw: Any) -> Any:
    """A Delta schema JSON without field metadata (column mapping ids, generation expressions:
    the table's business, not the reader's)."""
    if isinstance(raw, dict):
        out = {k: _strip_metadata(v) for k, v in raw.items()}
        if "metadata" in out and "name" in out:
            out["metadata"] = {}
        return out
    if isinstance(raw, list):
        return [_strip_metadata(v) for v in raw]
    return raw


def spark_schema(snapshot: Snapshot) -> StructType:
    """The snapshot's schema as Spark's: Delta's schema JSON is Spark's, so names, types and
    nullability (nested included) are the table's exactly."""
    return StructType.fromJson(_strip_metadata(json.loads(snapshot.schema_json)))


@dataclass(frozen=True)
class ReadOptions:
    """A read's options, validated: where, which version, how to split, whether to prune."""

    location: TableLocation
    snapshot: SnapshotSpec
    config: FileSourceConfig
    filter_pushdown: bool = False


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """Split a read's options into the location, the snapshot, the split sizing and the
    pushdown switch.

    Raises:
        ConfigurationError: no path; a malformed or contradictory option; an option that is
            neither a read option nor a storage option of the location's scheme.
    """
    given = {str(k).lower(): v for k, v in options.items()}
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
        raise ConfigurationError(
            f"{err}. The {FORMAT_NAME} format's own options are {', '.join(READ_OPTIONS)}; "
            "every other option is a storage option of the table."
        ) from err
    return ReadOptions(location, spec, config, filter_pushdown=pushdown in _TRUE)


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
        _, snapshot = open_snapshot(options.location, options.snapshot)
        self._scan = DeltaScan(snapshot, config=options.config)
        self._pushdown = options.filter_pushdown
        return spark_schema(snapshot)

    def reader(self, schema: StructType) -> DeltaScanReader:
        scan: DeltaScan | None = getattr(self, "_scan", None)
        if scan is None:
            raise ConfigurationError(
                f"the {FORMAT_NAME} format takes its schema from the table; read it without "
                ".schema(...) (select or cast the columns afterwards)"
            )
        if getattr(self, "_pushdown", False):
            return PruningDeltaScanReader(schema, scan)
        return DeltaScanReader(schema, scan)
