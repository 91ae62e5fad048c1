"""Writes through the ``"deltalake"`` format: ``df.write.format("deltalake")`` and
``df.writeStream.format("deltalake")``, exactly once, on :class:`DeltaSink` (Arrow staging).

Options (names as delta-spark spells them, case-insensitive):

``path``                the table URI (what ``save(uri)`` / ``start(uri)`` sets)
``txnAppId``,           a batch write's idempotence key: a write whose (app id, version) the
``txnVersion``          table already records is skipped (``app_id`` is a synonym of txnAppId)
``app_id``              a stream's app id; by default the query id in its checkpoint
``mergeSchema``         ``true``: add the input's new columns to the table
``partitionBy``         partition columns of a table the write creates (comma-separated, or
                        Spark's JSON list)
``replaceWhere``        with ``mode("overwrite")``: replace only the rows it matches
``userMetadata``        text recorded with the commit
``overwriteSchema``     ``true`` with ``mode("overwrite")``: the table's schema becomes the
                        input's and its partitioning ``partitionBy``, in the same commit as
                        the rows (``DeltaSink(schema_mode="overwrite")``)

Every other option is a storage option of the table location (see ``_storage.py``). Errors
name the format's own options (``.option("mergeSchema", "true")``, ``partitionBy``), not
``DeltaSink``'s keyword arguments.

Spark hands a Python data source its rows as they are, so the rules :class:`DeltaSink` runs
as Spark SQL under ``TwoPhaseSink`` are checked here in Arrow instead: NOT NULL columns,
partition values Delta cannot keep (``''``, ``__HIVE_DEFAULT_PARTITION__``, years outside
1..9999) and ``replaceWhere`` coverage. Tables with rules that need SQL (CHECK constraints,
generated columns, invariants, NOT NULL nested fields) or column mapping are refused before
anything is written, with the way to write them (``TwoPhaseSink``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType as SparkStructType

from committers.delta._sink import DeltaSink
from committers.delta.storage._storage import TableLocation
from committers.delta.table._delta_schema import ArrayType, DeltaField, MapType, StructType, walk
from committers.delta.table._replace_where import ReplaceWhere
from committers.delta.table._rules import MAX_MICROS, MIN_MICROS, TableShape
from committers.delta.table._schema import FORMAT_NAME, FORMAT_SPELLING, HIVE_NULL
from framework.errors import (
    ConfigurationError,
    ConstraintViolationError,
    NullConstraintError,
)
from framework.sink import Epoch
from framework.spark.connector import SinkBatchWriter, SinkStreamWriter, arrow_schema_of

__all__ = [
    "FORMAT_NAME",
    "WRITE_OPTIONS",
    "DeltaBatchCheck",
    "WriteOptions",
    "batch_writer",
    "stream_writer",
]

log = logging.getLogger("committers.delta")

#: The options of a write that are not storage options.
WRITE_OPTIONS = (
    "path",
    "txnAppId",
    "txnVersion",
    "app_id",
    "mergeSchema",
    "partitionBy",
    "replaceWhere",
    "userMetadata",
    "checkpointLocation",
    "overwriteSchema",
)
_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no", ""})
_MIN_YEAR, _MAX_YEAR = 1, 9999
_TXN_PAIR = (
    "options txnAppId and txnVersion go together: txnAppId names the job, txnVersion the run, "
    "and a run the table already records is skipped"
)


class FormatDeltaSink(DeltaSink):
    """The :class:`DeltaSink` of a format write: the same checks, with errors that name the
    format's options (``.option("mergeSchema", "true")``, ``partitionBy``)."""

    option_spelling = FORMAT_SPELLING


_OVERWRITE_SCHEMA_NEEDS_OVERWRITE = (
    "option overwriteSchema replaces the table's schema together with all its rows: it needs "
    'mode("overwrite"). To add the input\'s new columns in an append, set '
    '.option("mergeSchema", "true") instead.'
)
_OVERWRITE_SCHEMA_WITH_REPLACE_WHERE = (
    "options overwriteSchema and replaceWhere cannot go together (as delta-spark refuses "
    "them): the rows replaceWhere keeps would not fit the new schema. Overwrite the whole "
    "table, or keep its schema."
)


@dataclass(frozen=True)
class WriteOptions:
    """A write's options, validated."""

    location: TableLocation
    app_id: str | None
    txn_version: int | None
    merge_schema: bool
    overwrite_schema: bool
    partition_by: tuple[str, ...]
    replace_where: str | None
    user_metadata: str | None
    checkpoint: str | None

    def sink(self, overwrite: bool) -> DeltaSink:
        return FormatDeltaSink(
            self.location.uri,
            app_id=self.app_id,
            partition_by=self.partition_by,
            storage_options=dict(self.location.storage_options),
            # (overwriteSchema wins over mergeSchema, as in delta-spark)
            schema_mode="overwrite"
            if self.overwrite_schema
            else "merge"
            if self.merge_schema
            else "strict",
            staging="arrow",
            user_metadata=self.user_metadata,
            mode="overwrite" if overwrite else "append",
            replace_where=self.replace_where,
            # Its commits run in a Python worker without a SparkContext, which compaction needs.
            auto_compact=False,
        )


def _partition_by(raw: object) -> tuple[str, ...]:
    text = str(raw).strip()
    if text.startswith("["):
        try:
            names = json.loads(text)
        except ValueError as err:
            raise ConfigurationError(f"option partitionBy={raw!r} is not a JSON list") from err
    else:
        names = [n.strip() for n in text.split(",") if n.strip()]
    if not all(isinstance(n, str) and n for n in names):
        raise ConfigurationError(f"option partitionBy must name columns, got {raw!r}")
    return tuple(names)


def _flag(given: dict[str, Any], name: str) -> bool:
    """Pop the boolean option ``name`` (keys of ``given`` are lower-case); absent is false.

    Raises:
        ConfigurationError: the value is not a boolean.
    """
    value = str(given.pop(name.lower(), "false")).strip().lower()
    if value not in _TRUE | _FALSE:
        raise ConfigurationError(f"option {name} must be true or false, got {value!r}")
    return value in _TRUE


def parse_write_options(options: Mapping[str, str], *, overwrite: bool) -> WriteOptions:
    """Raises: ConfigurationError: no path, a malformed or contradictory option, or an option
    that is neither a write option nor a storage option of the location."""
    given = {str(k).lower(): v for k, v in options.items()}
    path = given.pop("path", None)
    if not path:
        raise ConfigurationError(
            f"the {FORMAT_NAME} format needs the table's path: "
            f"df.write.format({FORMAT_NAME!r}).mode('append').save('/path/to/table')"
        )
    txn_app = given.pop("txnappid", None)
    app_id = given.pop("app_id", None)
    if txn_app is not None and app_id is not None and txn_app != app_id:
        raise ConfigurationError("give txnAppId or app_id, not both (they name the same thing)")
    app_id = txn_app if txn_app is not None else app_id
    raw_version = given.pop("txnversion", None)
    txn_version = None
    if raw_version is not None:
        text = str(raw_version).strip()
        if not text.isdigit():
            raise ConfigurationError(
                f"option txnVersion must be an integer >= 0, got {raw_version!r}"
            )
        txn_version = int(text)
    if txn_version is not None and app_id is None:
        raise ConfigurationError(_TXN_PAIR)
    merge = _flag(given, "mergeSchema")
    overwrite_schema = _flag(given, "overwriteSchema")
    if overwrite_schema and not overwrite:
        raise ConfigurationError(_OVERWRITE_SCHEMA_NEEDS_OVERWRITE)
    replace_where = given.pop("replacewhere", None)
    if replace_where is not None and not overwrite:
        raise ConfigurationError("option replaceWhere needs mode('overwrite')")
    if replace_where is not None and overwrite_schema:
        raise ConfigurationError(_OVERWRITE_SCHEMA_WITH_REPLACE_WHERE)
    partition_by = _partition_by(given.pop("partitionby", ""))
    user_metadata = given.pop("usermetadata", None)
    checkpoint = given.pop("checkpointlocation", None)
    try:
        location = TableLocation.of(path, given)
    except ConfigurationError as err:
        raise ConfigurationError(
            f"{err}. The {FORMAT_NAME} writer's own options are {', '.join(WRITE_OPTIONS)}; every "
            "other option is a storage option of the table."
        ) from err
    return WriteOptions(
        location,
        app_id,
        txn_version,
        merge,
        overwrite_schema,
        partition_by,
        replace_where,
        user_metadata,
        checkpoint,
    )


def _rules_needing_sql(shape: TableShape) -> list[str]:
    rules = []
    if shape.constraints:
        rules.append("CHECK constraints " + ", ".join(name for name, _ in shape.constraints))
    if shape.generated_columns:
        rules.append("generated columns " + ", ".join(sorted(shape.generated_columns)))
    if shape.identity_columns:
        rules.append("identity columns " + ", ".join(c.name for c in shape.identity_columns))
    if shape.defaulted_columns:
        rules.append("column defaults of " + ", ".join(sorted(shape.defaulted_columns)))
    if shape.column_mapping:
        rules.append("column mapping")
    if "invariants" in shape.features and any(f.invariant for _, f in walk(shape.schema)):
        rules.append("column invariants")
    nested = [".".join(path) for path, f in walk(shape.schema) if len(path) > 1 and not f.nullable]
    nested += [f.name for f in shape.schema.fields if _strict_elements(f)]
    if nested:
        rules.append("NOT NULL nested fields or elements in " + ", ".join(nested))
    return rules


def _strict_elements(f: DeltaField) -> bool:
    def strict(t: Any) -> bool:
        if isinstance(t, ArrayType):
            return not t.contains_null or strict(t.element)
        if isinstance(t, MapType):
            return not t.value_contains_null or strict(t.key) or strict(t.value)
        if isinstance(t, StructType):
            return any(strict(child.type) for child in t.fields)
        return False

    return strict(f.type)


class DeltaBatchCheck:
    """What :class:`DeltaSink`'s input plan would enforce, in Arrow, for tables whose rules
    need no SQL (see the module docstring): column names matched ignoring case, NOT NULL
    columns, partition values Delta can spell, ``replaceWhere`` coverage.

    Raises (on creation):
        ConfigurationError: the table has a rule that needs SQL, or column mapping.
    """

    def __init__(
        self,
        shape: TableShape,
        input_schema: pa.Schema,
        replace_where: ReplaceWhere | None,
        uri: str,
    ) -> None:
        needing_sql = _rules_needing_sql(shape)
        if needing_sql:
            raise ConfigurationError(
                f"df.write.format({FORMAT_NAME!r}) cannot enforce the {'; '.join(needing_sql)} of "
                f"{uri}: Spark hands a Python data source its rows without running the SQL "
                "these rules need. Write with TwoPhaseSink(DeltaSink(...)).write(df) (or "
                "write_stream), which enforces them in Spark."
            )
        table_names = {f.name.lower(): f.name for f in shape.schema.fields}
        self._names = [table_names.get(n.lower(), n) for n in input_schema.names]
        self._not_null = [f.name for f in shape.schema.fields if not f.nullable]
        self._partitions = {name: shape.schema.field(name).type for name in shape.partition_by}
        self._replace_where = replace_where

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        batch = batch.rename_columns(self._names)
        names = set(batch.schema.names)
        for name in self._not_null:
            if name not in names or batch.column(name).null_count:
                raise NullConstraintError(
                    f"NOT NULL column {name!r} is violated by a row (it is null or missing). "
                    "Filter or fill the nulls before writing (df.na.drop(subset=[...]) or "
                    "coalesce())."
                )
        for name, delta_type in self._partitions.items():
            if name in names:
                _check_partition_values(name, delta_type, batch.column(name))
        if self._replace_where is not None:
            self._check_covered(batch)
        return batch

    def _check_covered(self, batch: pa.RecordBatch) -> None:
        """Every row makes ``replaceWhere`` TRUE (a NULL refuses the row, as delta-spark's
        constraint on the written rows does)."""
        where = self._replace_where
        assert where is not None
        outside = pc.invert(where.mask(batch))
        if not pc.any(outside).as_py():
            return
        row = batch.filter(outside).slice(0, 1).to_pylist()[0]
        values = {c: row.get(c) for c in where.columns}  # a missing column is null
        raise ConstraintViolationError(
            f"replaceWhere ({where.text}) is violated by a row with {values}. An overwrite "
            "may only write rows its replaceWhere covers: filter the DataFrame with the same "
            "predicate, or widen replaceWhere."
        )


def _check_partition_values(name: str, delta_type: object, column: pa.Array) -> None:
    if delta_type == "string":
        if pc.any(pc.equal(column, "")).as_py():
            raise ConstraintViolationError(
                f"partition column {name!r} must not hold an empty string (Delta stores '' as "
                "null). Write NULL, or a non-empty value such as a placeholder."
            )
        if pc.any(pc.equal(column, HIVE_NULL)).as_py():
            raise ConstraintViolationError(
                f"partition column {name!r} must not hold the string {HIVE_NULL!r} (the "
                "directory name of a null partition value: Spark's writer, delta-spark and "
                "readers of Hive-style directories take it for null). Write NULL, or another "
                "placeholder value."
            )
        return
    if delta_type == "timestamp":
        micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
        low, high = pc.min_max(micros).values()
        bad = low.is_valid and (low.as_py() < MIN_MICROS or high.as_py() > MAX_MICROS)
    elif delta_type in ("date", "timestamp_ntz"):
        years = pc.year(column)
        low, high = pc.min_max(years).values()
        bad = low.is_valid and (low.as_py() < _MIN_YEAR or high.as_py() > _MAX_YEAR)
    else:
        return
    if bad:
        raise ConstraintViolationError(
            f"partition column {name!r} must hold a year between 1 and 9999: Delta spells "
            "partition values with four-digit years; filter or clamp the value."
        )


def _prepared(
    options: WriteOptions, schema: SparkStructType, overwrite: bool
) -> tuple[DeltaSink, DeltaBatchCheck]:
    sink = options.sink(overwrite)
    arrow = arrow_schema_of(schema)
    sink.prepare(arrow)
    check = DeltaBatchCheck(sink.table_shape, arrow, sink.replace_where, sink.table_uri)
    return sink, check


def batch_writer(
    raw_options: Mapping[str, str], schema: SparkStructType, overwrite: bool
) -> SinkBatchWriter:
    """The writer of ``df.write.format("deltalake")`` (runs on the driver, before any task).

    With ``txnAppId``/``txnVersion`` the write is one epoch of that app id, skipped when the
    table already records it; without, a one-off epoch of its own identity, whose commit
    records no txn (as delta-spark's plain ``df.write`` records none).

    Raises:
        ConfigurationError, SchemaMismatchError, ...: as :meth:`DeltaSink.prepare`, and for
            tables whose rules this writer cannot enforce; nothing is written.
        EpochRegressionError: ``txnVersion`` is below the version the table records for the
            app id and was never committed.
    """
    options = parse_write_options(raw_options, overwrite=overwrite)
    if options.app_id is not None and options.txn_version is None:
        raise ConfigurationError(_TXN_PAIR)
    sink, check = _prepared(options, schema, overwrite)
    if options.app_id is None or options.txn_version is None:
        app_id = f"{FORMAT_NAME}-write-{uuid.uuid4()}"
        epoch = Epoch(
            app_id=app_id,
            epoch_id=0,
            writer_identity=f"write-{app_id}",
            run_id=str(uuid.uuid4()),
            bounded=True,
            one_off=True,  # nothing can replay it: its commit records no txn
        )
        return SinkBatchWriter(sink, epoch, check_batch=check)
    epoch = Epoch(
        app_id=options.app_id,
        epoch_id=options.txn_version,
        writer_identity=f"write-{options.app_id}",  # stable: a re-run of a version is a replay
        run_id=str(uuid.uuid4()),
        bounded=True,
    )
    committer = sink.create_global_committer()
    try:
        skip = committer.is_committed(epoch)
    finally:
        committer.close()
    if skip:
        log.info(
            "txnAppId %r txnVersion %d is already in %s: the write is skipped",
            options.app_id,
            options.txn_version,
            sink.table_uri,
        )
    return SinkBatchWriter(sink, epoch, check_batch=check, skip=skip)


def _query_id(checkpoint: str | None) -> str | None:
    """The query id Spark keeps in ``<checkpoint>/metadata`` (written before the sink is made)."""
    if checkpoint is None:
        return None
    import fsspec

    path = checkpoint.rstrip("/") + "/metadata"
    try:
        fs, local = fsspec.core.url_to_fs(path.replace("s3a://", "s3://", 1))
        with fs.open(local, "rb") as handle:
            return str(json.loads(handle.readline().decode("utf-8"))["id"])
    except (OSError, ValueError, KeyError):
        return None


def stream_writer(
    raw_options: Mapping[str, str], schema: SparkStructType, overwrite: bool
) -> SinkStreamWriter:
    """The writer of ``df.writeStream.format("deltalake")``: each micro-batch one epoch, with
    the batch id as epoch id and the query id in the checkpoint (or ``app_id``) as app id.

    A new checkpoint with an ``app_id`` under which another query (or an earlier checkpoint)
    committed batches fails its first commit with ``ConcurrentWriterError``: its batch ids
    start again at 0, and the table knows those batches were another writer's.

    Raises:
        ConfigurationError: ``outputMode("complete")`` (a whole-table replacement per batch
            is ``TwoPhaseSink``'s), ``txnAppId``/``txnVersion`` (batch options), neither a
            readable checkpoint nor ``app_id``, or what :func:`batch_writer` raises for the
            table.
    """
    if overwrite:
        raise ConfigurationError(
            f"writeStream.format({FORMAT_NAME!r}) appends; for outputMode('complete') use "
            "TwoPhaseSink(DeltaSink(...)).write_stream(df, output_mode='complete')"
        )
    given = {str(k).lower() for k in raw_options}
    if "txnversion" in given or "txnappid" in given:
        raise ConfigurationError(
            "txnAppId/txnVersion are for batch writes; a stream is keyed by its batch ids "
            "(set app_id to name it, or leave it to the query id in the checkpoint)"
        )
    options = parse_write_options(raw_options, overwrite=False)
    query_id = _query_id(options.checkpoint)
    app_id = options.app_id or query_id
    if app_id is None:
        raise ConfigurationError(
            f"writeStream.format({FORMAT_NAME!r}) needs the query's checkpoint (option "
            "checkpointLocation) or an app_id option: its commits are keyed by them"
        )
    sink, check = _prepared(options, schema, False)
    return SinkStreamWriter(
        sink,
        app_id=app_id,
        writer_identity=query_id or f"stream-{app_id}",
        query_id=query_id,
        check_batch=check,
    )
