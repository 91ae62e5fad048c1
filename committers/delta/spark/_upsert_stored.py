"""The stored rows an upsert reads from the files it touches (moved out of ``_upsert``): the
columns ``partial_updates`` keeps, the rows a rewrite keeps, and the rows its changes replace,
for the change files of a table with the change data feed on. Mixed into
:class:`~committers.delta.spark._upsert.UpsertStager`, with the positional column names and
helpers both use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from committers.delta.read._row_lineage import RowLineage
from committers.delta.spark._arrow_rewrite import (
    Rewritten,
    file_group,
    rewrite_groups,
    rewrite_vectors,
)
from committers.delta.spark._change_data import stage_changes
from committers.delta.spark._deleted_rows import decoded_path, drop_deleted_rows
from committers.delta.spark._scan import (
    BASE_ROW_ID,
    DEFAULT_ROW_COMMIT_VERSION,
    logical_columns,
    scan_root_path,
    stable_row_lineage,
)
from committers.delta.spark._spark_staging import spark_uri
from committers.delta.spark._upsert_plan import UpsertPlan
from committers.delta.spark._upsert_touched import KeysToDrop
from committers.delta.storage._storage import TableLocation
from committers.delta.table._change_feed import (
    CHANGE_TYPE,
    DELETE,
    INSERT,
    UPDATE_POSTIMAGE,
    UPDATE_PREIMAGE,
)
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor, deleted_rows_of
from committers.delta.table._delta_schema import quote, spark_type
from committers.delta.table._rules import WritePlan, as_column_type
from committers.delta.table._schema import serialize_partition_value
from committers.delta.table._snapshot import Snapshot, reader_features
from committers.delta.write._committable import StagedFile
from committers.delta.write._options import WriterOptions
from framework.sink import Epoch, InputPlan, PlannedColumn
from framework.spark.connector import apply_input_plan, parquet_files

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["StoredRows"]

_DELETE = "__sparksink_delete__"
_FILE = "__sparksink_file__"
_APPLIES = "__sparksink_applies__"
_FILLED = "__sparksink_filled__"
_STORED = "__sparksink_stored__"  # set where the key has a stored row
_ROW_INDEX = "__sparksink_row_index__"


def _key(index: int) -> str:
    return f"__sparksink_key_{index}__"


def _sequence(index: int) -> str:
    """A change's ``sequence_by`` value, by position (as :mod:`._upsert_touched` names it)."""
    return f"__sparksink_sequence_{index}__"


def _stored(index: int) -> str:
    """A stored row's ``sequence_by`` value, by position."""
    return f"__sparksink_stored_{index}__"


@dataclass(frozen=True)
class _LiveFile:
    """A live file of snapshot V, with its ranges per key column (``None``: unknown)."""

    index: int  # row in the snapshot's add actions
    logged_path: str
    path: str
    size: int
    records: int | None  # live rows: its deletion vector's are not counted
    bounds: tuple[tuple[Any, Any] | None, ...]  # per key column; (lo, hi), None if unknown
    deletion_vector: DeletionVectorDescriptor | None = None
    # As its add logs them, where the log was replayed (tables with deletion vectors): what a
    # re-add with a new vector repeats.
    logged_stats: str | None = None
    modification_time: int | None = None


def _applies(sequence: Sequence[str]) -> Any:
    """Spark's :func:`~committers.delta.spark._upsert_touched.change_applies` on a join of stored
    rows (``_stored(i)`` for the table's ``sequence`` columns) with changes (``_sequence(i)``,
    ``_DELETE``): Spark orders NULL and NaN as that function does. Every change applies
    without ``sequence``."""
    from pyspark.sql import functions as F

    if not sequence:
        return F.lit(True)
    applies = ~F.col(_DELETE)
    for i in reversed(range(len(sequence))):
        new, old = F.col(_sequence(i)), F.col(_stored(i))
        greater = F.coalesce(new > old, F.lit(True))  # (a NULL stored value: True)
        applies = greater | (F.coalesce(new == old, F.lit(False)) & applies)
    return applies


class StoredRows:
    """Reads of the touched files' stored rows, mixed into
    :class:`~committers.delta.spark._upsert.UpsertStager` (which defines these attributes)."""

    _location: TableLocation
    _plan: WritePlan
    _upsert: UpsertPlan
    _options: WriterOptions
    _vector_rows: dict[tuple[str, str], np.ndarray]  # (path, vector's unique id) -> deleted rows
    #: The touched files' row ids and commit versions, on a table that tracks them (else None).
    _lineage: RowLineage | None

    def _with_stored_values(
        self,
        session: SparkSession,
        rows: DataFrame,
        touched: list[_LiveFile],
        actions: pa.Table | None,
    ) -> DataFrame:
        """``rows`` (changes) with the ``filled`` columns of the stored row of their key, read
        from the touched files; for a key the table does not hold (a row the upsert inserts),
        the column's default (``DEFAULT`` of delta-spark) or NULL. A key the table holds
        twice (a blind append racing an upsert) takes them from its row of the highest
        sequence (without ``sequence_by``, from one of them)."""
        from pyspark.sql import functions as F

        upsert = self._upsert
        if not touched:
            return rows.select("*", *[self._inserted(c).alias(c) for c in upsert.filled])
        assert actions is not None
        partition_by = set(self._plan.shape.partition_by)
        needed = list(dict.fromkeys([*upsert.table_keys, *upsert.filled, *upsert.table_sequence]))
        data = [c for c in needed if c not in partition_by]
        scan, by_key = self._scan(session, touched, data or self._data_columns()[:1])
        if len(data) < len(needed):
            scan = scan.join(self._partitions(session, by_key, actions), on=_FILE)
        value = F.struct(*[F.col(quote(c)) for c in upsert.filled])
        one = (
            F.max_by(value, F.struct(*[F.col(quote(c)) for c in upsert.table_sequence]))
            if upsert.table_sequence
            else F.any_value(value)
        )
        names = [_key(i) for i in range(len(upsert.keys))]
        stored = (
            scan.groupBy(
                *[F.col(quote(k)).alias(names[i]) for i, k in enumerate(upsert.table_keys)]
            )
            .agg(one.alias(_FILLED))
            .select(
                *names,
                *[F.col(_FILLED).getField(c).alias(c) for c in upsert.filled],
                F.lit(True).alias(_STORED),
            )
        )
        joined = rows.join(stored, on=names, how="left")
        return joined.select(
            *[F.col(quote(c)) for c in rows.columns],
            *[
                F.when(F.col(_STORED).isNull(), self._inserted(c))
                .otherwise(F.col(quote(c)))
                .alias(c)
                for c in upsert.filled
            ],
        )

    def _data_columns(self) -> list[str]:
        """The table's data columns (not partition columns), by their names."""
        partition_by = set(self._plan.shape.partition_by)
        return [f.name for f in self._plan.shape.schema.fields if f.name not in partition_by]

    def _inserted(self, column: str) -> Column:
        """The value a row the upsert inserts gets in ``column``, which the input lacks: its
        default where the table has one (NULL stored stays NULL), else NULL."""
        from pyspark.sql import functions as F

        shape = self._plan.shape
        f = shape.schema.field(column)
        default = f.default_expression if column in shape.defaulted_columns else None
        return F.expr(as_column_type(default, f))

    def _scan(
        self,
        session: SparkSession,
        files: list[_LiveFile],
        columns: list[str],
        row_index: bool = False,
        lineage: bool = False,
    ) -> tuple[DataFrame, dict[str, _LiveFile]]:
        """The live rows of ``files`` (``columns`` of their data, typed and named as the
        table's: read by their physical names under column mapping; the rows their deletion
        vectors delete dropped) with the decoded path of their file in ``_FILE`` (and, with
        ``row_index``, each row's index in its file in ``_ROW_INDEX``; with ``lineage``, each
        row's id and commit version in the :attr:`_lineage` columns); and the files by that
        path.

        Raises:
            DeletionVectorError: a file's deletion vector is missing or damaged.
        """
        root = spark_uri(self._location.uri.rstrip("/"))
        root_path = scan_root_path(session, root)
        shape = self._plan.shape
        fields = {f.name: f for f in shape.schema.fields}
        mapped = shape.column_mapping
        ddl = ", ".join(
            f"{quote(shape.stored_name(c))} {spark_type(fields[c].type, physical=mapped)}"
            for c in columns
        )
        if lineage:
            assert self._lineage is not None
            ddl += "".join(f", {quote(f.name)} BIGINT" for f in self._lineage.fields)
        scan = parquet_files(session, [f"{root}/{f.path}" for f in files], schema=ddl)
        metadata = scan.metadataColumn("_metadata")
        kept = [quote(f.name) for f in self._lineage.fields] if lineage and self._lineage else []
        scan = scan.select(
            *logical_columns(shape, columns),
            *kept,
            decoded_path(metadata.getField("file_path")).alias(_FILE),
            metadata.getField("row_index").alias(_ROW_INDEX),
        )
        by_key = {f"{root_path}/{f.path}": f for f in files}
        if lineage:
            scan = self._with_row_lineage(session, scan, by_key)
        deleted = self._deleted_rows(files)
        vectors = {key: deleted[f.path] for key, f in by_key.items() if f.path in deleted}
        # Every file is mapped: a row of a file the map does not spell fails the query.
        scan = drop_deleted_rows(session, scan, _FILE, _ROW_INDEX, vectors, every_file=list(by_key))
        return (scan if row_index else scan.drop(_ROW_INDEX)), by_key

    def _with_row_lineage(
        self, session: SparkSession, scan: DataFrame, by_key: dict[str, _LiveFile]
    ) -> DataFrame:
        """``scan`` (its files' rows, with ``_FILE``, ``_ROW_INDEX`` and the materialized
        columns as the files hold them) with each row's stable id and commit version in the
        materialized columns (:func:`~committers.delta.spark._scan.stable_row_lineage`)."""
        from pyspark.sql import functions as F

        lineage = self._lineage
        assert lineage is not None
        files = {path: (base, default) for path, base, default in lineage.files}
        ids = pa.table(
            {
                _FILE: list(by_key),
                BASE_ROW_ID: [files[f.path][0] for f in by_key.values()],
                DEFAULT_ROW_COMMIT_VERSION: [files[f.path][1] for f in by_key.values()],
            }
        )
        replaced = {f.name for f in lineage.fields} | {BASE_ROW_ID, DEFAULT_ROW_COMMIT_VERSION}
        joined = scan.join(F.broadcast(session.createDataFrame(ids)), on=_FILE)
        return joined.select(
            *[F.col(quote(c)) for c in joined.columns if c not in replaced],
            *stable_row_lineage(lineage, _ROW_INDEX),
        )

    def _stored_row_ids(
        self, session: SparkSession, touched: list[_LiveFile], actions: pa.Table
    ) -> DataFrame:
        """The stable row id of each key the touched files hold (positional key names, the
        id in the materialized id column): an update keeps its row's id. A key held twice (a
        blind append racing an upsert) takes the id of its row of the highest sequence."""
        from pyspark.sql import functions as F

        lineage = self._lineage
        assert lineage is not None
        rows = self._stored_rows(session, touched, actions, lineage=True)
        names = [_key(i) for i in range(len(self._upsert.table_keys))]
        row_id = F.col(quote(lineage.id_column))
        sequence = [_stored(i) for i in range(len(self._upsert.table_sequence))]
        one = F.max_by(row_id, F.struct(*sequence)) if sequence else F.any_value(row_id)
        return rows.groupBy(*names).agg(one.alias(lineage.id_column))

    def _deleted_rows(self, files: Sequence[_LiveFile]) -> dict[str, np.ndarray]:
        """Decoded path -> sorted row indexes its deletion vector deletes, of those of
        ``files`` with one (read once per vector by this stager)."""
        cache = self._vector_rows
        wanted = {
            f.path: f.deletion_vector
            for f in files
            if f.deletion_vector is not None and (f.path, f.deletion_vector.unique_id) not in cache
        }
        for path, rows in deleted_rows_of(self._location, wanted).items():
            cache[(path, wanted[path].unique_id)] = rows
        return {
            f.path: cache[(f.path, f.deletion_vector.unique_id)]
            for f in files
            if f.deletion_vector is not None
        }

    def _partitions(
        self, session: SparkSession, by_key: dict[str, _LiveFile], actions: pa.Table
    ) -> DataFrame:
        """``_FILE`` and the typed partition values of each file of ``by_key``."""
        from pyspark.sql import functions as F

        partition_by = list(self._plan.shape.partition_by)
        rows = actions.take([f.index for f in by_key.values()])
        struct = rows.column("partition").combine_chunks()
        table = pa.table(
            [pa.array(list(by_key), pa.string())] + [struct.field(c) for c in partition_by],
            names=[_FILE, *partition_by],
        )
        fields = {f.name: f for f in self._plan.shape.schema.fields}
        return F.broadcast(session.createDataFrame(table)).select(
            F.col(_FILE),
            *[
                F.col(quote(c)).cast(spark_type(fields[c].type, physical=False)).alias(c)
                for c in partition_by
            ],
        )

    def _kept_rows(
        self,
        session: SparkSession,
        touched: list[_LiveFile],
        actions: pa.Table,
        changes: DataFrame,
    ) -> DataFrame:
        """The touched files' rows that the batch's ``changes`` do not replace (their key is
        not the batch's, or its change is stale), shaped as the table's rules shape written
        rows (partition values spelled, no checks: they are the table's)."""
        from pyspark.sql import functions as F

        lineage = self._lineage is not None
        rows = self._stored_rows(session, touched, actions, lineage=lineage)
        names = [_key(i) for i in range(len(self._upsert.table_keys))]
        sequence = self._upsert.table_sequence
        if sequence:
            joined = rows.join(changes, on=names, how="left")
            kept = joined.where(F.col(_DELETE).isNull() | ~_applies(sequence))
        else:
            kept = rows.join(changes.select(*names), on=names, how="left_anti")
        return self._shaped(kept, *self._lineage_names())

    def _stored_rows(
        self,
        session: SparkSession,
        touched: list[_LiveFile],
        actions: pa.Table,
        lineage: bool = False,
    ) -> DataFrame:
        """The touched files' rows (the table's columns), with their keys in positional
        names and their ``sequence_by`` values as ``_stored(i)`` (and with ``lineage``, their
        ids and commit versions in the materialized columns, last)."""
        from pyspark.sql import functions as F

        shape = self._plan.shape
        scan, by_key = self._scan(session, touched, self._data_columns(), lineage=lineage)
        if shape.partition_by:
            scan = scan.join(self._partitions(session, by_key, actions), on=_FILE)
        names = [_key(i) for i in range(len(self._upsert.table_keys))]
        return scan.select(
            *[F.col(quote(f.name)) for f in shape.schema.fields],
            *[F.col(quote(k)).alias(names[i]) for i, k in enumerate(self._upsert.table_keys)],
            *[F.col(quote(c)).alias(_stored(i)) for i, c in enumerate(self._upsert.table_sequence)],
            *[quote(c) for c in (self._lineage_names() if lineage else [])],
        )

    def _lineage_names(self) -> list[str]:
        """The materialized columns' names on a table that tracks row ids (else none)."""
        return [] if self._lineage is None else [f.name for f in self._lineage.fields]

    def _shaped(self, rows: DataFrame, *extra: str) -> DataFrame:
        """The table's rows ``rows`` shaped as the table's rules shape written rows (partition
        values spelled, no checks: they are the table's), with the ``extra`` columns after."""
        from pyspark.sql import functions as F

        fields = self._plan.shape.schema.fields
        identity = tuple(PlannedColumn(name=f.name, expression=quote(f.name)) for f in fields)
        passed = tuple(PlannedColumn(name=c, expression=quote(c)) for c in extra)
        return apply_input_plan(
            rows.select(*[F.col(quote(f.name)) for f in fields], *map(quote, extra)),
            InputPlan(
                columns=(*identity, *passed),
                checks=(),
                output=(*self._plan.input_plan.output, *passed),
            ),
        )

    def _stage_changes(
        self,
        session: SparkSession,
        touched: list[_LiveFile],
        actions: pa.Table,
        changes: DataFrame,
        new_rows: DataFrame,
        epoch: Epoch,
        expected_rows: int,
    ) -> tuple[StagedFile, ...]:
        """The batch's change files (see :mod:`committers.delta.spark._change_data`): the
        stored rows its applied changes replace, as ``delete`` (a delete) or
        ``update_preimage``, and its new rows, as ``update_postimage`` (their key held a row
        the batch replaced) or ``insert``. As delta-spark's MERGE, an update is reported even
        when it changes no value; a stale change, or a delete of an absent key, is none."""
        from pyspark.sql import functions as F

        names = [_key(i) for i in range(len(self._upsert.table_keys))]
        joined = self._stored_rows(session, touched, actions).join(changes, on=names)
        replaced = joined.where(_applies(self._upsert.table_sequence)).withColumn(
            CHANGE_TYPE, F.when(F.col(_DELETE), F.lit(DELETE)).otherwise(F.lit(UPDATE_PREIMAGE))
        )
        before = self._shaped(replaced, CHANGE_TYPE)
        keys = [
            self._plan.shape.stored_name(k) for k in self._upsert.table_keys
        ]  # (shaped: as received)
        updated = (
            before.where(F.col(CHANGE_TYPE) == UPDATE_PREIMAGE)
            .select(*map(quote, keys))
            .distinct()
            .withColumn(_APPLIES, F.lit(True))
        )
        after = new_rows.join(updated, on=keys, how="left").select(
            *[F.col(quote(c)) for c in new_rows.columns],
            F.when(F.col(_APPLIES), F.lit(UPDATE_POSTIMAGE))
            .otherwise(F.lit(INSERT))
            .alias(CHANGE_TYPE),
        )
        return stage_changes(
            self._location,
            self._plan.layout,
            self._options,
            before.unionByName(after),
            epoch,
            expected_rows=expected_rows,
            what=f"the upsert into {self._location.uri}",
        )

    def _typed_partitions(self, files: list[_LiveFile], actions: pa.Table) -> list[list[Any]]:
        """Per partition column, the typed value of each of ``files`` (from the add actions)."""
        partition_by = list(self._plan.shape.partition_by)
        if not partition_by:  # (an unpartitioned table's actions have no partition column)
            return []
        struct = actions.take([f.index for f in files]).column("partition").combine_chunks()
        return [struct.field(c).to_pylist() for c in partition_by]

    def _logged_partitions(
        self, files: list[_LiveFile], actions: pa.Table
    ) -> list[dict[str, str | None]]:
        """The partition values of each of ``files`` as its add logs them (keyed by physical
        names under column mapping)."""
        partition_by = list(self._plan.shape.partition_by)
        typed = self._typed_partitions(files, actions)
        return [
            {
                self._plan.shape.stored_name(c): serialize_partition_value(typed[j][i])
                for j, c in enumerate(partition_by)
            }
            for i in range(len(files))
        ]

    def _rewrite_kept(
        self,
        session: SparkSession,
        table: DeltaTable,
        touched: list[_LiveFile],
        actions: pa.Table,
        drop: KeysToDrop,
        directory: str,
    ) -> Rewritten:
        """The touched files' rows whose key the batch does not name, rewritten by Python
        tasks (pyarrow) into ``directory``, a file for each touched file keeping a row."""
        shape = self._plan.shape
        typed = self._typed_partitions(touched, actions)
        groups = [
            replace(
                file_group(
                    i,
                    f.path,
                    f.size,
                    {c: typed[j][i] for j, c in enumerate(shape.partition_by)},
                    shape,
                ),
                vectors=rewrite_vectors([f]),
            )
            for i, f in enumerate(touched)
        ]
        snapshot = Snapshot(
            self._location,
            table.version(),
            self._plan.shape,
            reader_features(table)[1],
            table.schema().to_json(),
        )
        return rewrite_groups(
            session,
            snapshot,
            self._plan.layout,
            groups,
            self._options,
            directory,
            operation="the upsert",
            row_filter=drop,
            lineage=self._lineage,
        )
