"""Upserts and deletes by key, copy-on-write: ``DeltaSink(mode="upsert", keys=[...], ...)``.

Each batch (a streaming micro-batch or a bounded ``write(df)``) becomes ONE Delta transaction
of removes, adds and the batch's ``txn``, computed in Spark:

1. **Changes** (Spark). Keys and ``sequence_by`` are checked on every row (a NULL fails the
   batch with ``NullConstraintError``); each row gets its delete flag, ``coalesce(delete_when,
   false)``; the batch is reduced to one change per key, the *latest*: the highest
   ``sequence_by`` (several columns compare left to right); on a tie, a change that is not a
   delete over a delete; then the greatest row, comparing the input's other columns left to
   right in Spark's order (NULL lowest; a column holding maps by its JSON text). Without
   ``sequence_by`` a key given twice fails the batch (``ConstraintViolationError``). The
   checked batch is cached and, up to ``PRUNE_KEYS_LIMIT`` rows, its keys collected (one
   job): a batch whose keys are all distinct is its own latest changes, with no shuffle.
   Otherwise Spark reduces it by key (a window over a shuffle), caches that, and collects its
   keys (or only their bounds, for more than ``PRUNE_KEYS_LIMIT`` keys).
2. **Candidates** (driver, on snapshot V; :mod:`._upsert_candidates`). A live file may hold a
   batch key only if, for every key column, some key of the batch lies in the file's range for
   it: its partition value for a partition column, its min/max stats otherwise. Missing stats
   make a file a candidate; bounds other writers may have truncated are widened (timestamps by
   a millisecond, long strings lose their upper bound).
3. **Touched files**. The candidates' key columns (and ``sequence_by`` columns) are joined
   with the batch's changes, counting the rows of each file that a change replaces; with
   ``sequence_by``, a change older than a row it matches is *stale*
   (:func:`~committers.delta.spark._upsert_touched.change_applies`): that row is kept, the change
   is not written, and a file holding only such rows is not touched. A few small candidates
   (with the keys collected) are read on the driver with pyarrow
   (:mod:`committers.delta.spark._upsert_touched`: no Spark job); otherwise Spark scans them and
   ``_metadata.file_path`` names the files.
4. **Rewrite**. The latest changes that are neither deletes nor stale (with
   ``partial_updates``, given the stored values of the columns the input lacks, read from the
   touched files by Spark) go through the table's rules, as any appended row, and Spark's
   Parquet writer writes them into the batch's run directory
   (:class:`~committers.delta.spark._spark_staging.SparkParquetStager`). The touched files' rows
   that the batch does not replace are kept: by default Python tasks rewrite each touched
   file with pyarrow, without the replaced rows, into ``<run directory>-kept``
   (:mod:`committers.delta.spark._arrow_rewrite`,
   :class:`~committers.delta.spark._upsert_touched.KeysToDrop`);
   the rows never enter the JVM. With ``staging="spark"``, or when the keys were not collected
   or do not cast exactly to the table's types, Spark scans them, joins them with the batch's
   changes, keeps those not replaced and writes them with the new rows, in one job. The
   manifest names both directories before anything is written, and the two jobs run side by
   side (the Python tasks from another driver thread, in the batch's job group). The rows
   written are counted against the stats of the files they replace.
5. **Commit** (:class:`~committers.delta.commit._committer.DeltaGlobalCommitter`): removes of the
   touched files, adds of the new ones and the txn, on the newest snapshot, only if every
   touched file is still live there, with ``max_commit_retries=0`` (the commit lands right on
   that snapshot or fails). Another writer's commit meanwhile costs one more attempt, not the
   Spark work; a touched file removed by another writer makes the committer redo steps 1-4
   once on the newer snapshot, then fail with :class:`UpsertConflictError`.

Files with deletion vectors are read without the rows their vectors delete in every step (the
driver masks them with the bitmap, Spark drops them by ``_metadata.row_index``), so a deleted
row neither matches a change nor is kept; the commit's removes name each file with its vector,
and a vector changed since V counts as the file being removed. On a table that enables
deletion vectors, step 4 keeps no rows: the replaced rows are marked in new vectors instead
(merge-on-read, :mod:`committers.delta.spark._upsert_marks`) and only the new rows are written.

Why the liveness check is ours: delta-rs 1.6.6 commits two transactions that remove the same
file (see ``_compact.py``), which for an upsert would put rows back that the other writer
changed or deleted.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable

from committers.delta.read._row_lineage import keeps_row_ids, row_lineage
from committers.delta.spark._arrow_rewrite import alongside
from committers.delta.spark._change_data import change_directory
from committers.delta.spark._spark_staging import (
    SparkParquetStager,
    run_directory,
)
from committers.delta.spark._upsert_candidates import (
    PRUNE_KEYS_LIMIT,
    BatchKeys,
    check_readable,
    check_spark_keeps_values,
    live_files,
)
from committers.delta.spark._upsert_marks import (
    DeletionVectorMode,
    can_mark,
    check_marked,
    mark_rows,
    merges_on_read,
)
from committers.delta.spark._upsert_matching import MatchedRows, _Stale
from committers.delta.spark._upsert_plan import (
    REPEATED_KEY,
    REPEATED_KEY_HINT,
    UpsertPlan,
    repeated_key,
    repeated_key_message,
)
from committers.delta.spark._upsert_stored import (
    _DELETE,
    _key,
    _LiveFile,
    _sequence,
)
from committers.delta.storage._storage import TableLocation
from committers.delta.table._change_feed import (
    writes_change_data,
)
from committers.delta.table._delta_schema import quote
from committers.delta.table._rules import WritePlan
from committers.delta.table._table import open_table
from committers.delta.write._committable import MarkedFile, ReplacedFile, Rewrite, StagedRewrite
from committers.delta.write._options import Staging, WriterOptions
from framework.errors import (
    ConstraintViolationError,
    RowCountMismatchError,
)
from framework.sink import Epoch, InputPlan, PlannedColumn, RowCheck
from framework.spark.connector import (
    apply_input_plan,
    staging_job_group,
    translate_task_error,
    wait_for_tasks_to_end,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["UpsertStager"]

log = logging.getLogger("committers.delta")

#: Rows per new file while the table has no rows to measure a row's size by.
NEW_TABLE_ROWS_PER_FILE = 1_000_000

_RANK = "__sparksink_rank__"


# -- one batch (driver-driven Spark work) ---------------------------------------------------


class UpsertStager(MatchedRows):
    """Computes one upsert batch in Spark and stages its files (see the module docstring).

    Guarantees: the staged files hold exactly the touched files' rows that the batch does not
    change plus the batch's latest non-delete changes, checked against the table's rules; the
    returned :class:`StagedRewrite` names every file they replace and the snapshot read; a
    run that fails leaves only its run directory, named by its manifest, for the committer's
    clean-up.
    """

    def __init__(
        self,
        location: TableLocation,
        plan: WritePlan,
        upsert: UpsertPlan,
        options: WriterOptions,
        bytes_per_row: float | None,
        staging: Staging = "auto",
        snapshot: Callable[[], DeltaTable | None] | None = None,
        deletion_vectors: DeletionVectorMode = "auto",
    ) -> None:
        """``staging="spark"``: the touched files' kept rows are rewritten by Spark too (by
        default Python tasks rewrite them when the batch's keys were collected).
        ``snapshot``: the newest snapshot of the table (``None``: no table yet), as the
        committer's replay check of the batch just loaded it; without it each batch opens the
        table itself. ``deletion_vectors="auto"``: where the table enables deletion vectors,
        the replaced rows are marked in them instead (:mod:`._upsert_marks`); ``"off"``: the
        touched files are always rewritten."""
        self._location = location
        self._plan = plan
        self._upsert = upsert
        self._options = options
        self._bytes_per_row = bytes_per_row
        self._staging = staging
        self._snapshot = snapshot or (lambda: open_table(location))
        self._deletion_vectors = deletion_vectors
        self._vector_rows = {}
        self._lineage = None

    def stage(self, df: DataFrame, epoch: Epoch) -> tuple[StagedRewrite, int]:
        """Stage ``epoch``'s batch ``df`` on the newest snapshot; the result can ``redo`` it
        once (on the snapshot newest then, into another run directory).

        Raises:
            NullConstraintError, ConstraintViolationError: a key or sequence value is NULL, a
                key repeats without ``sequence_by``, or a row breaks a rule of the table
                (raised in a Spark task).
            UnsupportedTableFeatureError: a file that may hold a key cannot be read or removed
                exactly (its logged path).
            RowCountMismatchError: the files staged do not hold the rows the jobs wrote, or
                those are not the touched files' kept rows plus the batch's new rows.
        """
        staged, written = self._run(df, epoch)
        staged.redo = lambda: self._redo(df, epoch)
        return staged, written

    def _redo(self, df: DataFrame, epoch: Epoch) -> StagedRewrite:

        again = dataclasses.replace(epoch, run_id=f"{epoch.run_id}-redo")
        group: str | None = None
        try:
            with staging_job_group(df) as group:
                return self._run(df, again)[0]  # (its rows checked as the first run's)
        except Exception as err:
            wait_for_tasks_to_end(df, group)  # no late file may follow the clean-up
            translated = translate_task_error(err)
            if translated is err:
                raise
            raise translated from err

    def _run(self, df: DataFrame, epoch: Epoch) -> tuple[StagedRewrite, int]:
        table = self._snapshot()  # snapshot V (None: the commit creates the table)
        read_version = None if table is None else table.version()
        self._vector_rows = {}  # (the vectors read for this run)
        checked = self._checked(df).persist()
        latest = checked
        try:
            keys, changes, upserts, latest = self._changes(df, checked)
            return self._rewrite(
                df.sparkSession, table, read_version, latest, (keys, changes, upserts), epoch
            )
        finally:
            checked.unpersist()
            if latest is not checked:
                latest.unpersist()

    # -- 1. changes -----------------------------------------------------------------------

    def _checked(self, df: DataFrame) -> DataFrame:
        """The batch with its keys and sequence values checked (a NULL fails the task), its
        keys and sequence values copied into positional names and the delete flag, before the
        input's columns."""
        upsert = self._upsert
        shown = (*upsert.keys, *upsert.sequence)
        checks = tuple(
            RowCheck(
                error="NullConstraintError",
                rule=f"{what} column {name!r} must not be NULL in an upsert",
                predicate=f"{quote(name)} IS NOT NULL",
                shown=shown,
                hint=hint,
            )
            for what, names, hint in (
                ("key", upsert.keys, "Every change must name the row it changes."),
                (
                    "sequence_by",
                    upsert.sequence,
                    "The changes of a key are ordered by it; fill it in (e.g. coalesce()).",
                ),
            )
            for name in names
        )
        keyed = tuple(
            PlannedColumn(name=_key(i), expression=quote(k)) for i, k in enumerate(upsert.keys)
        )
        sequenced = tuple(
            PlannedColumn(name=_sequence(i), expression=quote(s))
            for i, s in enumerate(upsert.sequence)
        )
        delete = f"coalesce(({upsert.delete_when}), false)" if upsert.delete_when else "false"
        columns = tuple(PlannedColumn(name=c, expression=quote(c)) for c in df.columns)
        kept = tuple(
            PlannedColumn(name=c.name, expression=quote(c.name)) for c in (*keyed, *sequenced)
        )
        return apply_input_plan(
            df,
            InputPlan(
                columns=(
                    *keyed,
                    *sequenced,
                    PlannedColumn(name=_DELETE, expression=delete),
                    *columns,
                ),
                checks=checks,  # on the first output column, a key: never pruned
                output=(
                    *kept,
                    PlannedColumn(name=_DELETE, expression=quote(_DELETE)),
                    *columns,
                ),
            ),
        )

    def _changes(self, df: DataFrame, checked: DataFrame) -> tuple[BatchKeys, int, int, DataFrame]:
        """(the batch's keys, changes, non-delete changes, the latest change per key).

        The keys of a batch of at most ``PRUNE_KEYS_LIMIT`` rows are collected first (one
        job, which also fills the batch's cache): when no key repeats, the batch is its own
        latest changes and no shuffle runs; a repeated key fails the batch without
        ``sequence_by``.
        Otherwise the batch is reduced by key in Spark (:meth:`_deduplicated`), cached, and
        its keys collected from that.

        Raises:
            ConstraintViolationError: a key repeats without ``sequence_by``.
        """
        names = [_key(i) for i in range(len(self._upsert.keys))]
        collected = checked.select(*self._change_columns()).limit(PRUNE_KEYS_LIMIT + 1).toArrow()
        if collected.num_rows <= PRUNE_KEYS_LIMIT:
            repeated = repeated_key(collected, names)
            if repeated is None:
                return (*self._collected_keys(collected), checked)
            if not self._upsert.sequence:
                raise ConstraintViolationError(repeated_key_message(self._upsert.keys, repeated))
        latest = self._deduplicated(df, checked).persist()
        try:
            return (*self._batch_keys(latest), latest)
        except BaseException:  # (the caller unpersists only what it was given)
            latest.unpersist()
            raise

    def _deduplicated(self, df: DataFrame, checked: DataFrame) -> DataFrame:
        """One change per key of ``checked`` (see the module docstring); a repeated key fails
        the task without ``sequence_by``."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        upsert = self._upsert
        names = [_key(i) for i in range(len(upsert.keys))]
        by_key = Window.partitionBy(*names)
        order = [F.col(quote(s)).desc() for s in upsert.sequence]
        order.append(F.col(_DELETE).asc())
        for name, as_json in upsert.tie_break:
            value = F.to_json(F.col(quote(name))) if as_json else F.col(quote(name))
            order.append(value.desc_nulls_last())
        # The batch's own parallelism (its input splits), not spark.sql.shuffle.partitions:
        # the result is cached, and Spark does not coalesce a cached plan's partitions, so a
        # small batch would otherwise become hundreds of tasks and files.
        shuffled = checked.repartition(_partitions_for(df), *names)
        ranked = shuffled.withColumn(_RANK, F.row_number().over(by_key.orderBy(*order)))
        if not upsert.sequence:
            values = [
                F.concat(F.lit(f"{k} = "), F.coalesce(F.col(n).cast("string"), F.lit("NULL")))
                for k, n in zip(upsert.keys, names, strict=True)
            ]
            message = F.concat(
                F.lit(f"ConstraintViolationError: {REPEATED_KEY}: "),
                F.concat_ws(", ", *values),
                F.lit(f". {REPEATED_KEY_HINT}"),
            )
            duplicated = F.count(F.lit(1)).over(by_key) > 1
            ranked = ranked.withColumn(
                _RANK, F.when(duplicated, F.raise_error(message)).otherwise(F.col(_RANK))
            )
        return ranked.where(F.col(_RANK) == 1).drop(_RANK)

    def _change_columns(self) -> list[str]:
        """What identifies and orders each change, by position: its keys, its delete flag,
        its sequence values (as :func:`~._upsert_touched.driver_matches` takes them)."""
        keys = [_key(i) for i in range(len(self._upsert.keys))]
        return [*keys, _DELETE, *(_sequence(i) for i in range(len(self._upsert.sequence)))]

    def _collected_keys(self, collected: pa.Table) -> tuple[BatchKeys, int, int]:
        names = [_key(i) for i in range(len(self._upsert.keys))]
        columns = [sorted(set(collected.column(n).to_pylist())) for n in names]
        deletes = collected.column(_DELETE).to_pylist()
        changes = collected.num_rows
        return BatchKeys(columns, collected), changes, changes - sum(map(bool, deletes))

    def _batch_keys(self, latest: DataFrame) -> tuple[BatchKeys, int, int]:
        """(the batch's keys per column, changes, non-delete changes) of the latest changes;
        one Spark job, two for a batch of more than ``PRUNE_KEYS_LIMIT`` keys."""
        from pyspark.sql import functions as F

        names = [_key(i) for i in range(len(self._upsert.keys))]
        collected = latest.select(*self._change_columns()).limit(PRUNE_KEYS_LIMIT + 1).toArrow()
        if collected.num_rows <= PRUNE_KEYS_LIMIT:
            return self._collected_keys(collected)
        row = latest.agg(
            F.count(F.lit(1)).alias("changes"),
            F.count_if(~F.col(_DELETE)).alias("upserts"),
            *[F.min(n).alias(f"min{i}") for i, n in enumerate(names)],
            *[F.max(n).alias(f"max{i}") for i, n in enumerate(names)],
        ).toArrow()
        bounds = [
            [row.column(f"min{i}")[0].as_py(), row.column(f"max{i}")[0].as_py()]
            for i in range(len(names))
        ]
        changes = int(row.column("changes")[0].as_py())
        return BatchKeys(bounds, None), changes, int(row.column("upserts")[0].as_py())

    # -- 3. touched files, 4. rewrite ------------------------------------------------------

    def _rewrite(
        self,
        session: SparkSession,
        table: DeltaTable | None,
        read_version: int | None,
        latest: DataFrame,
        batch: tuple[BatchKeys, int, int],
        epoch: Epoch,
    ) -> tuple[StagedRewrite, int]:
        """The batch's staging and the rows its jobs wrote (counted as they wrote them)."""
        from pyspark.sql import functions as F

        keys, changes, upserts = batch
        live, actions = live_files(self._location, self._plan, self._upsert, table)
        candidates = [f for f in live if keys.may_hold(f)] if changes else []
        check_readable(self._location, candidates)

        def batch_changes() -> DataFrame:  # broadcast to the scans when collected
            selected = latest.select(*self._change_columns())
            return F.broadcast(selected) if changes <= PRUNE_KEYS_LIMIT else selected

        marking = merges_on_read(self._deletion_vectors, table)
        positions: dict[str, np.ndarray] | None = {} if marking else None
        touched, matched, stale = self._touched(
            session, candidates, actions, keys, batch_changes, positions
        )
        marking = marking and can_mark(touched)
        upserts -= stale.upserts  # (a stale change is not written)
        metrics = {
            "numTargetFilesBeforeSkipping": len(live),
            "numTargetFilesAfterSkipping": len(candidates),
            "numTargetFilesRemoved": len(touched),
            "numTargetRowsUpdated": sum(n for (_, delete), n in matched.items() if not delete),
            "numTargetRowsDeleted": sum(n for (_, delete), n in matched.items() if delete),
            "numChanges": changes,
        }
        if self._upsert.table_sequence:
            metrics["numStaleChanges"] = stale.changes
        replaced = tuple(
            ReplacedFile(
                logged_path=f.logged_path,
                path=f.path,
                size=f.size,
                num_records=f.records,
                deletion_vector=f.deletion_vector,
            )
            for f in touched
        )
        rewrite = Rewrite(read_version=read_version, replaced=replaced, keys=self._upsert.keys)
        if not touched and not upserts:  # nothing to write: a commit of the txn alone
            metrics.update(numTargetFilesAdded=0, numTargetRowsCopied=0)
            return StagedRewrite([], rewrite=dataclasses.replace(rewrite, metrics=metrics)), 0
        stager = SparkParquetStager(
            self._location, self._plan.layout, self._options, self._bytes_per_row
        )

        self._lineage = None
        if touched and table is not None and keeps_row_ids(table):  # (see _new_rows)
            configuration = table.metadata().configuration
            paths = [f.path for f in touched]
            self._lineage = row_lineage(self._location, configuration, table.version(), paths)

        def new_rows(lineage: bool = True) -> DataFrame:
            return self._new_rows(session, latest, upserts, stale, touched, actions, lineage)

        drop = self._keys_to_drop(keys) if touched and not marking else None
        # Change files only when rows are replaced: an insert-only batch's adds say it all.
        feed = bool(touched) and writes_change_data(self._plan.shape.configuration)
        owned = (change_directory(epoch),) if feed else ()
        marked: tuple[MarkedFile, ...] = ()
        if marking and touched:  # the replaced rows in deletion vectors, the new rows by Spark
            assert positions is not None and actions is not None
            stager.write_manifest(epoch, also_owned=owned)
            staged, rows = stager.write(new_rows(), epoch) if upserts else ([], 0)
            marked = mark_rows(
                self._location,
                touched,
                positions,
                self._deleted_rows(touched),
                self._logged_partitions(touched, actions),
                run_directory(epoch),
            )
        elif touched and drop is None:  # the touched files' kept rows by Spark, in one job
            assert actions is not None
            check_spark_keeps_values(self._location, self._plan, touched, actions)
            kept = self._kept_rows(session, touched, actions, batch_changes())
            stager.write_manifest(epoch, also_owned=owned)
            staged, rows = stager.write(new_rows().union(kept), epoch)
        elif drop is None:  # no file touched: the new rows only
            staged, rows = stager.stage(new_rows(), epoch)
        else:  # the touched files' kept rows by Python tasks, alongside the new rows by Spark
            assert table is not None and actions is not None
            kept_directory = f"{run_directory(epoch)}-kept"
            stager.write_manifest(epoch, also_owned=(kept_directory, *owned))
            with alongside(
                lambda: self._rewrite_kept(session, table, touched, actions, drop, kept_directory)
            ) as kept_rewrite:  # (the new rows are planned while the tasks run)
                staged, rows = ([], 0)
                if upserts:
                    staged, rows = stager.write(new_rows(), epoch)
            rewritten = kept_rewrite()
            staged += rewritten.files
            rows += rewritten.rows_written
        matched_rows = sum(matched.values())
        if marked:
            check_marked(self._location.uri, rows, upserts, touched, marked, matched_rows)
            metrics.update(
                numTargetFilesRemoved=0,
                numTargetRowsCopied=0,
                numTargetDeletionVectorsAdded=len(marked),
                numTargetDeletionVectorsRemoved=sum(f.deletion_vector is not None for f in touched),
            )
        elif all(f.records is not None for f in touched):
            copied = sum(f.records or 0 for f in touched) - matched_rows
            if rows != copied + upserts:
                raise RowCountMismatchError(
                    f"the upsert into {self._location.uri} wrote {rows} rows where the files it "
                    f"rewrites keep {copied} and the batch adds {upserts} ({copied + upserts}); "
                    "nothing was committed. A file may have been deleted while it was read "
                    "(VACUUM) or skipped by spark.sql.files.ignoreMissingFiles / "
                    "ignoreCorruptFiles."
                )
            metrics["numTargetRowsCopied"] = copied
        metrics["numTargetFilesAdded"] = len(staged)
        rewrite = dataclasses.replace(rewrite, metrics=metrics, marked=marked)
        if feed:
            assert actions is not None
            changed = matched_rows + upserts  # each replaced row, each new row
            change_files = self._stage_changes(
                session, touched, actions, batch_changes(), new_rows(False), epoch, changed
            )
            rewrite = dataclasses.replace(rewrite, change_files=change_files)
        return StagedRewrite(staged, rewrite=rewrite), rows

    def _new_rows(
        self,
        session: SparkSession,
        latest: DataFrame,
        upserts: int,
        stale: _Stale,
        touched: list[_LiveFile],
        actions: pa.Table | None,
        lineage: bool = True,
    ) -> DataFrame:
        """The latest changes that are neither deletes nor stale (``upserts`` of them), with
        the stored values of the columns the input lacks (``partial_updates``), through the
        table's rules, in partitions of about ``target_file_size`` (judged by the table's
        bytes per row). On a table that tracks row ids (with ``lineage``), an update keeps
        the id of the row it replaces in the materialized id column (an insert has none: its
        file's base id numbers it), and its commit version is the commit's (NULL)."""
        from pyspark.sql import functions as F

        rows_per_file = (
            self._options.target_file_size / self._bytes_per_row
            if self._bytes_per_row
            else NEW_TABLE_ROWS_PER_FILE
        )
        rows = latest.where(~F.col(_DELETE))
        if stale.keys is not None:
            names = [_key(i) for i in range(len(self._upsert.keys))]
            rows = rows.join(stale.keys, on=names, how="left_anti")
        if self._upsert.filled:
            rows = self._with_stored_values(session, rows, touched, actions)
        columns = [quote(c) for c in (*self._upsert.written, *self._upsert.filled)]
        plan = self._plan.input_plan
        if lineage and self._lineage is not None:
            names = [_key(i) for i in range(len(self._upsert.keys))]
            ids = self._stored_row_ids(session, touched, actions)
            version = self._lineage.version_column
            rows = rows.join(ids, on=names, how="left").withColumn(
                version, F.lit(None).cast("bigint")
            )
            passed = tuple(
                PlannedColumn(name=f.name, expression=quote(f.name)) for f in self._lineage.fields
            )
            columns += [quote(f.name) for f in self._lineage.fields]
            plan = dataclasses.replace(
                plan, columns=(*plan.columns, *passed), output=(*plan.output, *passed)
            )
        return apply_input_plan(
            rows.select(*columns).coalesce(max(1, math.ceil(upserts / rows_per_file))), plan
        )


def _partitions_for(df: DataFrame) -> int:
    """Partitions for the batch's changes by key: its input's, at most
    ``spark.sql.shuffle.partitions`` (planning only, no job runs)."""
    jdf: Any = df._jdf
    partitions = int(jdf.rdd().getNumPartitions())
    shuffle = str(df.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    if shuffle.isdigit():  # not "auto", as on some platforms
        partitions = min(partitions, int(shuffle))
    return max(1, partitions)
