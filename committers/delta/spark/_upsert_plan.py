"""An upsert's plan, made on the driver before anything runs: which input and table columns
are keys, sequences and the delete predicate, checked against the input and the table. See
:mod:`committers.delta.spark._upsert` for how an upsert runs."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from committers.delta.table._delta_schema import DeltaField, walk
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._rules import TableShape, WritePlan
from committers.delta.table._schema import SchemaMode
from committers.delta.table._snapshot import reader_features
from committers.delta.table._stats import has_min_max_stats
from committers.delta.write._upsert_spec import UpsertSpec
from framework.errors import (
    ConfigurationError,
    SchemaMismatchError,
    UnsupportedTypeError,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "REPEATED_KEY",
    "REPEATED_KEY_HINT",
    "UPSERT_UNDER_CONNECT",
    "UpsertPlan",
    "check_upsert_table",
    "classic_session",
    "plan_upsert",
    "repeated_key",
    "repeated_key_message",
]

UPSERT_UNDER_CONNECT = (
    "mode='upsert' cannot run under Spark Connect: it rewrites files with Spark's own Parquet "
    "reader and writer, which need classic Spark in this process, and this is a Spark Connect "
    "session (or DataFrame). Run the upsert with a classic SparkSession (e.g. in a job "
    "submitted with spark-submit), or use delta-rs's DeltaTable.merge()."
)

log = logging.getLogger("committers.delta")

_KEY_TYPES = frozenset(
    {"byte", "short", "integer", "long", "string", "binary", "boolean", "date", "timestamp"}
    | {"timestamp_ntz"}
)
APPEND_ONLY = "delta.appendOnly"


@dataclass(frozen=True)
class UpsertPlan:
    """How a batch of the input becomes changes by key. Plain data: it pickles with the sink.

    Attributes:
        keys: the key columns as the input spells them.
        table_keys: the same as the table spells them.
        sequence: the ``sequence_by`` columns as the input spells them.
        tie_break: the input's other columns compared on a tie, each with whether it is
            compared by its JSON text (it holds maps, which Spark cannot order).
        written: the input columns the table gets (all but the change-only ones).
        dropped: the change-only columns (read by ``delete_when``, not table columns): used,
            never written.
        delete_when: the delete predicate, or ``None``.
        table_sequence: the ``sequence_by`` columns as the table spells them (each change is
            compared with the stored row's values of them).
        filled: with ``partial_updates``, the table columns the input lacks (generated ones
            aside): an updated row keeps its stored values, an inserted row gets the
            column's default (delta-spark's ``DEFAULT``), else NULL.
    """

    keys: tuple[str, ...]
    table_keys: tuple[str, ...]
    sequence: tuple[str, ...]
    tie_break: tuple[tuple[str, bool], ...]
    written: tuple[str, ...]
    dropped: tuple[str, ...]
    delete_when: str | None
    table_sequence: tuple[str, ...] = ()
    filled: tuple[str, ...] = ()


def plan_upsert(
    session: SparkSession,
    spec: UpsertSpec,
    input_schema: pa.Schema,
    table: TableShape | None,
    table_uri: str,
    schema_mode: SchemaMode = "strict",
) -> tuple[UpsertPlan, pa.Schema]:
    """The upsert plan for input of ``input_schema`` into ``table`` (``None``: the first commit
    creates it), and the schema of what is written to the table.

    Which input columns are written: every one, except the columns ``delete_when`` reads that
    are not columns of the table (nor keys or ``sequence_by`` columns): ``op`` of
    ``delete_when="op = 'D'"`` is not written, ``ts`` of ``sequence_by="ts"`` always is (each
    change is compared with the stored row's). With ``partial_updates``, the table's columns
    the input lacks follow, typed as the table (the stager fills them in).

    Raises:
        SchemaMismatchError: a key or ``sequence_by`` column is missing from the input, or from
            the table (a ``sequence_by`` column may be added by ``schema_mode="merge"``); the
            input lacks table columns and ``partial_updates`` is off.
        UnsupportedTypeError: a key or ``sequence_by`` column of a type that cannot be
            compared as the upsert must.
        ConfigurationError: ``delete_when`` does not parse, names columns the input lacks, or
            is not a deterministic boolean predicate (analyzed by ``session``, no job runs); a
            ``sequence_by`` column partitions the table.
    """
    fields = {f.name.lower(): f for f in input_schema}

    def find(name: str, option: str) -> pa.Field:
        found = fields.get(name.lower())
        if found is None:
            raise SchemaMismatchError(
                f"{option} names {name!r}, which is not a column of the input (columns: "
                f"{input_schema.names}). Every {option} column must be in the DataFrame."
            )
        return found

    keys = tuple(find(k, "keys").name for k in spec.keys)
    sequence = tuple(find(s, "sequence_by").name for s in spec.sequence_by)
    for name in sequence:
        _check_sequence_type(name, input_schema.field(name).type)
    read_by_delete = _delete_when_columns(session, spec.delete_when, input_schema)
    lower_keys = {k.lower() for k in keys}
    lower_sequence = {s.lower() for s in sequence}
    table_names = {} if table is None else {f.name.lower(): f.name for f in table.schema.fields}
    dropped = {c.lower() for c in read_by_delete} - lower_keys - lower_sequence - set(table_names)
    written = pa.schema([f for f in input_schema if f.name.lower() not in dropped])
    filled: list[pa.Field] = []
    if table is not None:
        _check_table_columns(keys, sequence, table, table_uri, schema_mode)
        filled = _filled_columns(spec, written, table, table_uri)
    plan = UpsertPlan(
        keys=keys,
        table_keys=tuple(table_names.get(k.lower(), k) for k in keys),
        sequence=sequence,
        tie_break=tuple(
            (f.name, _holds_maps(f.type))
            for f in input_schema
            if f.name.lower() not in lower_keys and f.name.lower() not in lower_sequence
        ),
        written=tuple(written.names),
        dropped=tuple(f.name for f in input_schema if f.name.lower() in dropped),
        delete_when=spec.delete_when,
        table_sequence=tuple(table_names.get(s.lower(), s) for s in sequence),
        filled=tuple(f.name for f in filled),
    )
    return plan, pa.schema([*written, *filled])


def _check_table_columns(
    keys: Sequence[str],
    sequence: Sequence[str],
    table: TableShape,
    table_uri: str,
    schema_mode: SchemaMode,
) -> None:
    """Keys must be columns of the table, ``sequence_by`` columns data columns of it (or
    columns ``schema_mode="merge"`` adds).

    Raises:
        SchemaMismatchError: a key or ``sequence_by`` column the table lacks.
        ConfigurationError: a ``sequence_by`` column that partitions the table.
    """
    names = {f.name.lower() for f in table.schema.fields}
    columns = [f.name for f in table.schema.fields]
    missing = [k for k in keys if k.lower() not in names]
    if missing:
        raise SchemaMismatchError(
            f"keys {missing} are not columns of {table_uri} (its columns: {columns}): an "
            "upsert finds the rows to change by their keys, so the table must have them."
        )
    unstored = [s for s in sequence if s.lower() not in names]
    if unstored and schema_mode != "merge":
        raise SchemaMismatchError(
            f"sequence_by names {unstored}, not {'a column' if len(unstored) == 1 else 'columns'} "
            f"of {table_uri} (its columns: {columns}): an upsert compares each change's "
            "sequence with the row the table holds for its key, so the table must store it. "
            "Add the column to the table (schema_mode='merge' adds it with this write; the "
            "rows already there then have no sequence value and count as older than any "
            "change), or leave sequence_by out."
        )
    partitioned = [s for s in sequence if s.lower() in {p.lower() for p in table.partition_by}]
    if partitioned:
        raise ConfigurationError(
            f"sequence_by names {partitioned}, partition column(s) of {table_uri}: the upsert "
            "compares each change's sequence with the stored row's, read from the data "
            "files. Sequence by a data column (a change timestamp, a log position)."
        )


def _filled_columns(
    spec: UpsertSpec, written: pa.Schema, table: TableShape, table_uri: str
) -> list[pa.Field]:
    """The table's columns the input lacks (generated ones aside: the table's rules compute
    them), typed as the table and nullable; ``[]`` unless ``partial_updates``.

    Raises:
        SchemaMismatchError: the input lacks such columns and ``partial_updates`` is off.
    """
    given = {n.lower() for n in written.names}
    lacking = [
        f
        for f in table.arrow_schema()
        if f.name.lower() not in given and f.name not in table.generated_columns
    ]
    if lacking and not spec.partial_updates:
        raise SchemaMismatchError(
            f"the input lacks column(s) {[f.name for f in lacking]} of {table_uri}: an upsert "
            "replaces the whole row of each key it updates, so these columns would become "
            "NULL in every updated row. Add them to the DataFrame, or pass "
            "partial_updates=True to keep the stored values of the columns the input lacks "
            "(a row it inserts gets their defaults, or NULL)."
        )
    return [f.with_nullable(True) for f in lacking] if spec.partial_updates else []


def check_upsert_table(
    upsert: UpsertPlan,
    plan: WritePlan,
    table: DeltaTable | None,
    table_uri: str,
    *,
    log_writable: bool,
) -> None:
    """Refuse tables an upsert cannot rewrite exactly (see the Raises). ``log_writable``:
    whether the sink's own log writer can commit to the table's storage (the removes of files
    with deletion vectors need it: delta-rs cannot spell them).

    Raises:
        UnsupportedTypeError: a key column of a type the upsert does not match on.
        UnsupportedTableFeatureError: an append-only table, deletion vectors
            on storage the log writer cannot commit to.
        ConfigurationError: NOT NULL fields inside structs (Spark's writer cannot keep them).
    """
    shape = plan.shape
    for name in upsert.table_keys:
        _check_key_type(name, shape.schema.field(name))
    configuration = dict(shape.configuration)
    problem = None
    if table is not None and not log_writable and "deletionVectors" in reader_features(table)[1]:
        problem = (
            "it uses deletion vectors, and the remove of a rewritten file must name its vector, "
            "which delta-rs cannot write; the sink writes such commits itself only on local "
            "and S3 storage"
        )
    elif configuration.get(APPEND_ONLY, "false").lower() == "true":
        problem = f"it is append-only ({APPEND_ONLY}=true): its rows may not be changed"
    if problem:
        raise UnsupportedTableFeatureError(
            f"mode='upsert' cannot write {table_uri}: {problem}. Nothing was written. Use "
            "delta-spark's MERGE for this table."
        )
    if any(len(path) > 1 and not f.nullable for path, f in walk(shape.schema)):
        raise ConfigurationError(
            "mode='upsert' rewrites files with Spark's Parquet writer, which cannot keep NOT "
            "NULL fields inside structs (deltalake's reader then refuses the files); nothing "
            "was written. Use delta-rs's DeltaTable.merge() for this table."
        )


def _holds_maps(t: pa.DataType) -> bool:
    if pa.types.is_map(t):
        return True
    if pa.types.is_struct(t):
        return any(_holds_maps(t.field(i).type) for i in range(t.num_fields))
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return _holds_maps(t.value_type)
    return False


def _check_sequence_type(name: str, t: pa.DataType) -> None:
    if has_min_max_stats(t):
        return
    raise UnsupportedTypeError(
        f"sequence_by column {name!r} is {t}: the changes of a key are ordered by it, so it "
        "must be a number, string, date or timestamp. To order by several columns (e.g. a "
        "timestamp, then a log position), pass sequence_by=['ts', 'lsn']."
    )


def _check_key_type(name: str, f: DeltaField) -> None:
    t = f.type
    if isinstance(t, str) and (t in _KEY_TYPES or t.startswith("decimal")):
        return
    shown = t if isinstance(t, str) else type(t).__name__.removesuffix("Type").lower()
    raise UnsupportedTypeError(
        f"key column {name!r} is of type {shown}: upsert keys must be integers, decimals, "
        "strings, binary, booleans, dates or timestamps (floating-point numbers compare "
        "inexactly; nested values cannot be matched by key)."
    )


def classic_session() -> SparkSession | None:
    """The classic SparkSession of this process (``None`` without a SparkContext here, as in a
    Spark Connect client, or when the active session is a Spark Connect one)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if SparkContext._active_spark_context is None:
        return None
    session = SparkSession.getActiveSession() or SparkSession.builder.getOrCreate()
    # A Spark Connect session, even with a JVM here (a local Connect server in this process):
    # its DataFrames cannot reach Spark's writer.
    return None if type(session).__module__.startswith("pyspark.sql.connect") else session


def _delete_when_columns(
    session: SparkSession, delete_when: str | None, input_schema: pa.Schema
) -> tuple[str, ...]:
    """The input columns ``delete_when`` reads, found by Spark's analyzer on an empty
    DataFrame of ``input_schema`` (no job runs).

    Raises:
        ConfigurationError: ``delete_when`` does not parse, does not analyze over the input
            (an unknown column, an aggregate), is not boolean, or is not deterministic.
    """
    if delete_when is None:
        return ()
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema
    from pyspark.sql.types import BooleanType

    empty = session.createDataFrame([], from_arrow_schema(input_schema))
    try:
        probe = empty.select(F.expr(delete_when).alias("delete_when"))
        data_type = probe.schema[0].dataType
        analyzed: Any = probe._jdf.queryExecution().analyzed()
        deterministic = bool(analyzed.expressions().apply(0).deterministic())
        references = analyzed.references().toSeq()
        names = [str(references.apply(i).name()) for i in range(references.size())]
    except Exception as err:  # ParseException, AnalysisException (Py4J-wrapped)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigurationError(
            f"delete_when {delete_when!r} is not a Spark SQL predicate over the input's "
            f"columns ({input_schema.names}): {type(err).__name__}: {first}"
        ) from err
    if not isinstance(data_type, BooleanType):
        raise ConfigurationError(
            f"delete_when {delete_when!r} is of type {data_type.simpleString()}, not a boolean "
            "predicate: write it as a condition, e.g. \"op = 'D'\""
        )
    if not deterministic:
        raise ConfigurationError(
            f"delete_when {delete_when!r} is not deterministic: a replayed batch must delete "
            "the same rows"
        )
    spelled = {n.lower(): n for n in input_schema.names}
    return tuple(dict.fromkeys(spelled[n.lower()] for n in names if n.lower() in spelled))


REPEATED_KEY = (
    "a key appears more than once in one upsert batch, and no sequence_by orders its changes"
)
REPEATED_KEY_HINT = (
    "Give each key one change per batch, or pass sequence_by=... to keep the latest."
)


def repeated_key(collected: pa.Table, names: list[str]) -> tuple[Any, ...] | None:
    """A key that appears more than once in ``collected`` (its key columns ``names``), or
    ``None``. Keys compare as their values (no collation): as the table's files are matched."""
    if collected.num_rows == 0:
        return None
    counted = collected.group_by(names).aggregate([([], "count_all")])
    if counted.num_rows == collected.num_rows:
        return None
    first = pc.index(pc.greater(counted.column("count_all"), 1), True).as_py()
    return tuple(counted.column(n)[first].as_py() for n in names)


def repeated_key_message(keys: Sequence[str], values: tuple[Any, ...]) -> str:
    shown = ", ".join(f"{k} = {v}" for k, v in zip(keys, values, strict=True))
    return f"{REPEATED_KEY}: {shown}. {REPEATED_KEY_HINT}"
