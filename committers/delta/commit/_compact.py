"""Compaction: small files of a Delta table rewritten in Spark tasks, committed as ONE
``dataChange=false`` transaction that is safe while other writers append.

1. **Plan** (driver, snapshot version V): groups of small files per partition
   (:mod:`committers.delta.commit._compact_plan`).
2. **Rewrite**, into a run directory under the table root named by a staging manifest first.
   By default (``staging="auto"`` or ``"arrow"``) Python tasks read each group's files with
   pyarrow and write them as one file (:mod:`committers.delta.spark._arrow_rewrite`): the rows never
   pass through the JVM. With ``staging="spark"``: one scan of every grouped file with
   the table's schema, each row tagged with its group through ``_metadata.file_path``, one
   shuffle partition per group, and
   :class:`~committers.delta.spark._spark_staging.SparkParquetStager` writes the rows (INT64
   timestamps, footer stats, Spark's commit protocol dropping failed attempts). A clustered
   table is rewritten by Spark under ``"auto"`` too: its rows are spread over as many files by
   ranges of the clustering columns, each sorted by them (:mod:`._compact_rewrite`). Either way the
   partition values are carried as the exact strings the log stores for the group; the files
   collected must hold exactly the rows the job wrote, as it counted them (a Spark
   observation, or the Python tasks' own counts), and the rows written are then counted per
   partition against the stats of the files they replace (rows in == rows out); any
   difference fails the compaction with ``RowCountMismatchError``.
3. **Commit** (driver), on a fresh snapshot each attempt: if every file to remove is still
   live and the table's layout and features are unchanged, commit removes + adds with
   ``max_commit_retries=0``, so delta-rs writes exactly the next version or fails. A
   concurrent append makes the attempt fail and the next one succeed on the newer snapshot
   (the Spark work is not redone); a file removed meanwhile by someone else (another
   compaction, a rewrite) raises :class:`CompactionConflictError` and the compaction's files
   are deleted.

Why the check is ours: delta-rs 1.6.6's ``create_write_transaction`` does no conflict check
for removes: two transactions removing the same file both commit (with both rewritten copies
of its rows added), as does a remove whose path names no live file. With
``max_commit_retries=0`` a commit whose version another writer took fails with
``CommitFailedError`` instead of being rebased. Checked on this machine;
``test_delta_compact.py`` pins these facts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties
from deltalake.transaction import AddAction, RemoveAction

from committers.delta.commit._clustering import clustering_columns
from committers.delta.commit._compact_plan import (
    MIN_TARGET_FILE_SIZE,
    CompactionFile,
    PartitionFilter,
    check_partition_filter,
    check_target_file_size,
    plan_groups,
)
from committers.delta.commit._compact_rewrite import (
    check_spark_can_rewrite,
    rewrite_with_arrow,
    rewrite_with_spark,
)
from committers.delta.commit._sequence import (
    add_action,
    advance,
    commit_once,
    files_gone,
    write_transaction,
)
from committers.delta.read._row_lineage import keeps_row_ids, row_lineage
from committers.delta.spark._spark_staging import (
    run_directory,
    spark_manifest_path,
)
from committers.delta.storage._s3safety import verify_conditional_put
from committers.delta.storage._staging import remove_empty_staging_dirs
from committers.delta.storage._storage import TableLocation
from committers.delta.table._live_vectors import table_deletion_vectors, vectors_changed
from committers.delta.table._protocol import check_appends_only
from committers.delta.table._rules import FileLayout, TableShape, plan_write
from committers.delta.table._snapshot import Snapshot, reader_features
from committers.delta.table._table import COMMIT_RUN_ID, open_table
from committers.delta.write._committable import StagedFile
from committers.delta.write._options import Staging, WriterOptions, check_staging
from framework.connector import crash_point
from framework.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    ConfigurationError,
    NotATableError,
    SinkError,
)
from framework.retry import Backoff
from framework.sink import Epoch
from framework.spark.connector import is_connect_dataframe

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "COMMIT_OPERATION",
    "MIN_TARGET_FILE_SIZE",
    "CompactionConflictError",
    "CompactionResult",
    "PartitionFilter",
    "compact_table",
    "compaction_epoch",
]

log = logging.getLogger("committers.delta")

#: commitInfo key naming the sink operation of a commit that is not a batch.
COMMIT_OPERATION = "sink.operation"
OPERATION_COMPACTION = "compaction"
#: Commit attempts: each fails fast (``max_commit_retries=0``) when another commit took the
#: version, and the next one re-checks the removed files on the newer snapshot.
COMPACTION_BACKOFF = Backoff(max_attempts=10, initial_delay=0.05, max_delay=2.0, deadline=300.0)
#: The epoch that names the compaction's run directory and staging manifest.
COMPACTION_APP_ID = "sink-compaction"

_POST_COMMIT = PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=False)


class CompactionConflictError(CommitConflictError):
    """A file the compaction rewrote was removed from the table by another commit (another
    compaction, a delete or overwrite) while it ran, or the table's schema or features
    changed. Nothing was committed and the compaction's files were deleted; running the
    compaction again plans against the table as it is now."""


@dataclass(frozen=True, kw_only=True)
class CompactionResult:
    """What one compaction did.

    Attributes:
        version: the table version of the compaction commit; ``None`` when there was nothing
            to compact (nothing was written or committed).
        read_version: the snapshot the files were planned from.
        files_removed: small files replaced (``dataChange=false`` removes).
        files_added: files written in their place (``dataChange=false`` adds).
        bytes_before: total size of the removed files.
        bytes_after: total size of the added files.
        rows: rows rewritten (the same rows, now in fewer files).
    """

    version: int | None
    read_version: int
    files_removed: int = 0
    files_added: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    rows: int = 0


def compact_table(
    spark: SparkSession,
    location: TableLocation,
    *,
    target_file_size: int,
    partition_filter: PartitionFilter | None = None,
    compression: str = WriterOptions.compression,
    staging: Staging = "auto",
    user_metadata: str | None = None,
    skip_conditional_put_check: bool = False,
    backoff: Backoff = COMPACTION_BACKOFF,
    before_commit: Callable[[int], None] | None = None,
    min_file_size: int | None = None,
    staging_owner: str | None = None,
    run_id: str | None = None,
) -> CompactionResult:
    """Rewrite the small files of the table at ``location`` into files of about
    ``target_file_size`` bytes (see the module docstring); ``DeltaSink.compact`` is the
    public entry point.

    Guarantees: readers see exactly the same rows before and after (the commit's adds and
    removes carry ``dataChange=false``, so streaming readers skip it); the commit carries no
    ``txn``; partition values are copied as the log spells them (null included). On any
    failure before the commit, nothing is committed and the compaction's files and staging
    manifest are deleted.

    Args:
        staging: who rewrites the files: ``"arrow"`` and ``"auto"``, Python tasks with pyarrow
            (:mod:`committers.delta.spark._arrow_rewrite`; rows never enter the JVM, several times
            faster on small files); ``"spark"``, Spark's own reader and writer, which
            ``"auto"`` picks for a clustered table where Spark can write it (it clusters).
        before_commit: called with the attempt number (1, 2, ...) right before each commit
            request, after the removed files were found live; what it raises fails the
            compaction like a conflict (nothing committed, its files deleted).
        min_file_size: files of at least this many bytes are left alone (default:
            ``target_file_size``).
        staging_owner: names the directory of the compaction's staging manifest
            (``_sink_staging/sink-compaction/<owner>/0/``; default: the run's own id), so that a
            caller can find the leftovers of its own runs that were killed.
        run_id: the run's id, recorded in its commit (``sink.runId``) and naming its files
            (default: a new UUID).

    Raises:
        ConfigurationError: ``target_file_size`` under 1 MiB, a ``partition_filter`` naming a
            column that is not a partition column, a Spark Connect session, or with
            ``staging="spark"`` storage Spark cannot write or NOT NULL fields inside structs.
        NotATableError: there is no Delta table at ``location`` (nothing there, or files
            without a ``_delta_log``); nothing is written.
        UnsupportedTableFeatureError: the table needs a writer feature the sink cannot honour,
            or uses deletion vectors or column mapping.
        CompactionConflictError: another commit removed a file being compacted (or changed the
            table's schema or features) meanwhile; nothing committed, files deleted.
        CommitConflictError: every commit attempt lost a race; nothing committed.
        CommitStateUnknownError: the commit's outcome could not be established; the written
            files are kept (``remove_orphan_files`` reclaims them if it did not land).
        StagingError: the rewrite failed; nothing committed. Its subclass
            RowCountMismatchError: the rewrite did not reproduce the rows (the files to add
            hold other than the rows written, or than the rows of the files they replace).
    """
    target = check_target_file_size(target_file_size)
    check_staging(staging)
    if is_connect_dataframe(spark.range(0)):
        raise ConfigurationError(
            "compaction runs Spark tasks from the driver's SparkContext, which a Spark Connect "
            "client does not have; run it in a classic session (or with delta-rs's "
            "DeltaTable.optimize.compact())."
        )
    table = None
    with contextlib.suppress(NotATableError):  # files but no log: the same answer as below
        table = open_table(location)
    if table is None:
        raise NotATableError(
            f"{location.uri} is not a Delta table (no _delta_log there): compaction rewrites "
            "the files of an existing table. Check the path; nothing was written."
        )
    shape = TableShape.of_table(table)
    layout = _check_compactable(shape, table, location.uri)
    cluster_by = _clustering(table, location, shape)
    if staging == "spark":
        check_spark_can_rewrite(spark, shape, location)
    elif staging == "auto" and cluster_by:  # Spark clusters; Python packs
        try:
            check_spark_can_rewrite(spark, shape, location)
            staging = "spark"
        except ConfigurationError as err:
            log.info("compaction of %s packs files without clustering: %s", location.uri, err)
    partition_by = shape.partition_by
    filters = check_partition_filter(partition_filter, partition_by)
    read_version = table.version()
    small_below = target if min_file_size is None else min(min_file_size, target)
    vectors = table_deletion_vectors(location, reader_features(table)[1], read_version)
    groups = plan_groups(table, partition_by, filters, target, location.uri, small_below, vectors)
    if not groups:
        log.info("compaction of %s at version %d: nothing to compact", location.uri, read_version)
        return CompactionResult(version=None, read_version=read_version)
    verify_conditional_put(location, skip=skip_conditional_put_check)

    run_id = run_id or str(uuid.uuid4())
    epoch = compaction_epoch(run_id, staging_owner)
    options = WriterOptions(target_file_size=target, compression=compression)
    try:
        lineage = None
        if keeps_row_ids(table):  # each copied row keeps its id and commit version
            paths = [f.path for g in groups for f in g.files]
            configuration = dict(shape.configuration)
            lineage = row_lineage(location, configuration, read_version, paths)
        if staging == "spark":
            staged = rewrite_with_spark(
                spark, location, layout, groups, options, epoch, cluster_by, lineage
            )
        else:
            snapshot = Snapshot(
                location, read_version, shape, reader_features(table)[1], table.schema().to_json()
            )
            staged = rewrite_with_arrow(spark, snapshot, layout, groups, options, epoch, lineage)
    except BaseException:
        _discard(location, epoch)
        raise
    removed = [f for g in groups for f in g.files]
    committer = _Commit(
        table,
        location,
        layout,
        removed,
        staged,
        run_id=run_id,
        operation_parameters=_operation_parameters(filters, target),
        user_metadata=user_metadata,
        before_commit=before_commit,
    )
    try:
        version = committer.run(backoff)
    except CommitStateUnknownError:
        log.warning(
            "compaction %s of %s: commit outcome unknown; its files under %s are kept "
            "(remove_orphan_files() deletes them if the commit did not land)",
            run_id,
            location.uri,
            run_directory(epoch),
        )
        raise
    except Exception:  # raised before the commit request, or it definitely did not land
        _discard(location, epoch)
        raise
    # (KeyboardInterrupt / SystemExit during the request: it may have landed, files kept.)
    crash_point("compaction_committed")
    _finish(location, epoch, {f.path for f in staged})
    result = CompactionResult(
        version=version,
        read_version=read_version,
        files_removed=len(removed),
        files_added=len(staged),
        bytes_before=sum(f.size for f in removed),
        bytes_after=sum(f.size for f in staged),
        rows=sum(f.records for f in removed),
    )
    log.info(
        "compacted %s: %d files (%d bytes) into %d (%d bytes), %d rows, version %s",
        location.uri,
        result.files_removed,
        result.bytes_before,
        result.files_added,
        result.bytes_after,
        result.rows,
        version,
    )
    return result


def compaction_epoch(run_id: str, staging_owner: str | None = None) -> Epoch:
    """The epoch naming a compaction run's directory and staging manifest."""
    owner = run_id if staging_owner is None else staging_owner
    return Epoch(
        app_id=COMPACTION_APP_ID, epoch_id=0, writer_identity=owner, run_id=run_id, bounded=True
    )


# -- checks ---------------------------------------------------------------------------------


def _clustering(table: DeltaTable, location: TableLocation, shape: TableShape) -> list[str]:
    """The columns a clustered table is clustered by, as its files name them (``[]`` for any
    other table, or one clustered by nested fields, which compaction does not cluster)."""
    if "clustering" not in (table.protocol().writer_features or ()):
        return []
    columns = clustering_columns(location) or []
    if not all(c in shape.schema.names for c in columns):
        log.info("compaction of %s does not cluster by nested fields %s", location.uri, columns)
        return []
    return [shape.stored_name(c) for c in columns]


def _check_compactable(shape: TableShape, table: DeltaTable, uri: str) -> FileLayout:
    """The layout of the table's files, if compaction can rewrite them.

    Raises:
        UnsupportedTableFeatureError: as the sink refuses the table.
    """
    # The sink's own refusal first (identity columns, unknown features, ...); compaction
    # carries row ids over (read/_row_lineage.py).
    check_appends_only(shape.features, uri, "compaction")
    return plan_write(shape, shape.arrow_schema(), "strict", uri).layout


# -- commit ---------------------------------------------------------------------------------


class _Commit:
    """Commit the removes and adds on the newest snapshot, once, or fail cleanly."""

    def __init__(
        self,
        table: DeltaTable,
        location: TableLocation,
        layout: FileLayout,
        removed: list[CompactionFile],
        staged: list[StagedFile],
        *,
        run_id: str,
        operation_parameters: dict[str, str],
        user_metadata: str | None,
        before_commit: Callable[[int], None] | None,
    ) -> None:
        self._table = table
        self._location = location
        self._layout = layout
        self._removed = removed
        self._staged = staged
        self._run_id = run_id
        self._operation_parameters = operation_parameters
        self._user_metadata = user_metadata
        self._before_commit = before_commit
        self._first_read: int = table.version()
        self._landed_version: int | None = None

    def run(self, backoff: Backoff) -> int | None:
        """The version committed (``None`` if found only by reconciliation and unknown)."""
        uri = self._location.uri
        result = commit_once(
            self._attempt,
            landed=self._landed,
            backoff=backoff,
            description=f"compaction {self._run_id} of {uri}",
            lost_every_race=lambda attempts: (
                f"compaction of {uri} lost every commit race against other writers "
                f"({attempts} attempts); nothing was committed and its files were deleted. "
                "Run it again, or when fewer writers commit."
            ),
        )
        if result.reconciled:
            return self._landed_version
        return result.value

    def _fresh(self) -> DeltaTable:
        if not advance(self._table, self._location):
            self._table = DeltaTable(
                self._location.uri, storage_options=self._location.delta_storage_options()
            )
        return self._table

    def _attempt(self, number: int) -> int:
        table = self._fresh()
        read_version = table.version()
        shape = TableShape.of_table(table)
        try:
            layout = _check_compactable(shape, table, self._location.uri)
        except SinkError as err:
            raise CompactionConflictError(
                f"table {self._location.uri} changed while it was being compacted: {err}"
            ) from err
        if layout != self._layout:
            raise CompactionConflictError(
                f"the schema or layout of {self._location.uri} changed (version {read_version}) "
                "while it was being compacted; nothing was committed and the compaction's "
                "files were deleted. Run the compaction again."
            )
        gone = files_gone(table, [f.logged_path for f in self._removed])
        if gone:
            raise CompactionConflictError(
                f"{len(gone)} of the {len(self._removed)} files this compaction rewrote were "
                f"removed from {self._location.uri} by another commit after version "
                f"{self._first_read} (another compaction or a rewrite), e.g. {gone[:3]}. "
                "Committing would restore their rows twice, so nothing was committed and the "
                "compaction's files were deleted; run it again to compact the table as it is."
            )
        changed = self._vectors_changed(table, read_version)
        if changed:
            raise CompactionConflictError(
                f"{len(changed)} of the {len(self._removed)} files this compaction rewrote got a "
                f"new deletion vector in {self._location.uri} after version {self._first_read} "
                f"(rows deleted meanwhile), e.g. {changed[:3]}. Committing would bring those rows "
                "back, so nothing was committed and the compaction's files were deleted; run it "
                "again to compact the table as it is."
            )
        if self._before_commit is not None:
            self._before_commit(number)
        write_transaction(
            table,
            self._actions(),
            mode="append",
            partition_by=self._layout.partition_columns,
            location=self._location,
            vectors={
                f.path: f.deletion_vector for f in self._removed if f.deletion_vector is not None
            },
            commit_properties=CommitProperties(
                custom_metadata=self._metadata(read_version),
                max_commit_retries=0,  # the next version or a conflict: we re-check, not delta-rs
            ),
            post_commit=_POST_COMMIT,
        )
        return read_version + 1

    def _vectors_changed(self, table: DeltaTable, version: int) -> list[str]:
        """The removed files whose deletion vector at ``version`` is not the one read."""
        if version == self._first_read:
            return []
        return vectors_changed(self._location, reader_features(table)[1], version, self._removed)

    def _actions(self) -> list[AddAction | RemoveAction]:
        now = int(time.time() * 1000)
        columns = self._layout.partition_columns
        actions: list[AddAction | RemoveAction] = [
            RemoveAction(
                path=f.path,
                data_change=False,
                deletion_timestamp=now,
                size=f.size,
                partition_values=dict(zip(columns, f.partition, strict=True)),
            )
            for f in self._removed
        ]
        actions.extend(add_action(f, data_change=False) for f in self._staged)
        return actions

    def _metadata(self, read_version: int) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            COMMIT_OPERATION: OPERATION_COMPACTION,
            COMMIT_RUN_ID: self._run_id,
            "readVersion": read_version,
            "isBlindAppend": False,
            "operationParameters": self._operation_parameters,
            "operationMetrics": {  # strings, as delta-spark's OPTIMIZE writes them
                "numRemovedFiles": str(len(self._removed)),
                "numAddedFiles": str(len(self._staged)),
                "numRemovedBytes": str(sum(f.size for f in self._removed)),
                "numAddedBytes": str(sum(f.size for f in self._staged)),
                "numOutputRows": str(sum(f.num_records for f in self._staged)),
            },
        }
        if self._user_metadata:
            metadata["userMetadata"] = self._user_metadata
        return metadata

    def _landed(self) -> bool:
        """Whether a commit of this compaction is in the log since the first read."""
        table = self._fresh()
        newest = table.version()
        for info in table.history(limit=max(1, newest - self._first_read)):
            if info.get(COMMIT_RUN_ID) == self._run_id and COMMIT_OPERATION in info:
                self._landed_version = int(info["version"])
                return True
        return False


def _operation_parameters(filters: list[Any] | None, target: int) -> dict[str, str]:
    parameters = {"compaction": "true", "targetFileSize": str(target), "dataChange": "false"}
    if filters is not None:
        parameters["partitionFilter"] = json.dumps(filters, default=str)
    return parameters


# -- clean-up -------------------------------------------------------------------------------


def _discard(location: TableLocation, epoch: Epoch) -> None:
    """Delete everything the compaction wrote (run directory, manifest); never raises."""
    fs = location.filesystem()
    try:
        with contextlib.suppress(FileNotFoundError):
            fs.rm(location.path(run_directory(epoch)), recursive=True)
        _drop_manifest(location, epoch)
    except Exception as err:  # the error being raised matters more
        log.warning(
            "could not delete the files of failed compaction %s of %s (remove_orphan_files() "
            "will): %s",
            epoch.run_id,
            location.uri,
            err,
        )


def _finish(location: TableLocation, epoch: Epoch, committed: set[str]) -> None:
    """After the commit: delete what Spark wrote but the commit does not hold (empty files),
    then the manifest. Housekeeping only: never fails the compaction."""
    fs = location.filesystem()
    directory = run_directory(epoch)
    try:
        leftovers = [
            full
            for full in fs.find(location.path(directory))
            if location.relative(full) not in committed
        ]
        if leftovers:
            fs.rm(leftovers)
        if location.is_local:
            for top, _, _ in sorted(os.walk(location.path(directory)), key=lambda e: -len(e[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(top)  # only empty directories
        _drop_manifest(location, epoch)
    except Exception as err:
        log.warning("clean-up after compaction %s of %s: %s", epoch.run_id, location.uri, err)


def _drop_manifest(location: TableLocation, epoch: Epoch) -> None:
    with contextlib.suppress(FileNotFoundError):
        location.filesystem().rm(location.path(spark_manifest_path(epoch)))
    remove_empty_staging_dirs(location, spark_manifest_path(epoch).rsplit("/", 1)[0])
