"""Auto-compaction: a writer compacts the small files it leaves behind, between its batches.

A long stream of small micro-batches adds a few small files per batch; readers then open
thousands of them, and every rewrite (and every snapshot) carries a live-file list that only
grows. Like delta-spark's auto compact, the sink counts the small files (under
``min_file_size``) per partition of the table and, once one holds
``min_num_files``, runs the sink's compaction (:func:`~committers.delta.commit._compact.
compact_table`) on the whole table, with ``min_file_size`` as its small-file bound.

**When.** In the driver, after a batch's commit and clean-up, before the micro-batch
function returns (``GlobalCommitter.after_epoch``): Spark starts the next batch only then, so
the compaction never races the stream's own appends, and the batch it follows is already
committed. What it raises is logged, never raised: a committed batch is neither failed nor
retried because its upkeep failed.

**Counting.** The first time in a process, from the table (the live files and their sizes:
what a restarted job inherits); then from each batch's committed files, and again from the
table after every compaction (its own output may still be small). A partition where a
compaction left at least ``min_num_files`` small files (files it cannot merge) is due again
only once as many new ones arrive, so nothing is compacted twice for nothing.

**Crashes.** The compaction is one ``dataChange=false`` commit without a txn that lands only
if every file it removes is still live (see ``_compact``): killed before it, nothing changed;
after it, the rows are the same in other files. Either way the batch that preceded it is in
the table, so a restart replays that batch as a skip and counts again: a compaction that
landed is not redone (its output is not due), one that did not runs again. Its staged files
are named by a manifest under ``_sink_staging/sink-compaction/auto-<app id>/0/``: at its first
batch a process settles the runs found there (killed ones of this writer's earlier
processes): of a run's files, those the log references (its commit landed) are kept, the
others deleted.

**Zombies.** An earlier process of the same writer may still be running (paused, cut off)
with a compaction about to commit; deleting its staged files then would leave its commit
pointing at missing files. So settling is fenced: (1) the runs' manifests are deleted,
(2) one commit is made (a ``commitInfo`` only: no file, no txn), (3) only then is the log read
for the files to keep. A compaction (a) reads the newest version ``v``, (b) checks that its
manifest still exists, (c) commits at exactly ``v + 1`` (put-if-absent, no retry by delta-rs;
a lost race starts again at (a)). If its check (b) passed, it came before (1), so ``v`` is
older than the fence (2): its commit lands below the fence, where (3) sees it and keeps its
files, or not at all (the fence took ``v + 1``; its next attempt finds the manifest gone and
gives up, deleting only its own files). If the fence cannot be committed, nothing is deleted:
the files stay for ``remove_orphan_files()``.

Not under Spark Connect (compaction runs Spark tasks from the driver's SparkContext): there it
is skipped with one warning per process.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties

from committers.delta.commit._compact import (
    COMMIT_OPERATION,
    CompactionConflictError,
    CompactionResult,
    _finish,
    compact_table,
    compaction_epoch,
)
from committers.delta.commit._sequence import write_transaction
from committers.delta.spark._spark_staging import spark_manifest_path
from committers.delta.spark._upsert_plan import classic_session
from committers.delta.storage._staging import epoch_staging_dir
from committers.delta.storage._storage import TableLocation
from committers.delta.table._schema import serialize_partition_value
from committers.delta.table._table import referenced_paths
from committers.delta.write._auto_compact import AutoCompact
from committers.delta.write._committable import StagedFile
from committers.delta.write._options import Staging
from framework.connector import crash_point
from framework.errors import CommitStateUnknownError
from framework.sink import Epoch

__all__ = ["AutoCompactor"]

log = logging.getLogger("committers.delta")

_MANIFEST_SUFFIX = "-spark.json"
#: ``sink.operation`` of the commit that fences off a stalled process's compactions.
OPERATION_FENCE = "compaction fence"
_NO_POST_COMMIT = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)
_PARTITION_PREFIX = "partition."


class AutoCompactor:
    """Decides, after each batch of one committer, whether to compact, and does it.

    Guarantees: the table's rows never change (compaction's own guarantees); a compaction
    never runs while this writer commits; its failures are logged, never raised (except
    ``KeyboardInterrupt``/``SystemExit``); a killed run's staged files are deleted, or kept
    exactly where its commit references them, by the next process of the same app id.
    """

    def __init__(
        self,
        location: TableLocation,
        options: AutoCompact,
        *,
        target_file_size: int,
        compression: str,
        staging: Staging,
        user_metadata: str | None,
        skip_conditional_put_check: bool,
    ) -> None:
        self._location = location
        self._options = options
        self._small, self._target = options.sizes(target_file_size)
        self._compression = compression
        self._staging: Staging = staging
        self._user_metadata = user_metadata
        self._skip_check = skip_conditional_put_check
        self._counts: Counter[PartitionKey] | None = None  # small live files per partition
        self._floor: dict[PartitionKey, int] = {}  # what the last compaction left (when >= min)
        self._reclaimed: set[str] = set()  # staging owners whose leftovers were handled
        self._warned_no_spark = False
        self.last_result: CompactionResult | None = None  # of the last compaction run here

    def committed(self, files: Iterable[StagedFile]) -> None:
        """Count the small files a commit of this writer added."""
        if self._counts is None:
            return  # counted from the table at the next batch's end
        for f in files:
            if f.size < self._small:
                self._counts[_partition(f.partition_values)] += 1

    def after_epoch(self, epoch: Epoch, table: Callable[[], DeltaTable | None]) -> None:
        """Compact if a partition is due (see the module docstring); ``table`` gives the
        committer's handle, advanced to the latest version. Never raises an ``Exception``."""
        if not self._options.applies_to(bounded=epoch.bounded):
            return
        try:
            self._run(epoch, table)
        except Exception as err:
            log.warning(
                "auto-compaction of %s after batch %s of %r failed (the batch is committed; "
                "the next due batch tries again): %r",
                self._location.uri,
                epoch.epoch_id,
                epoch.app_id,
                err,
            )

    def _run(self, epoch: Epoch, table: Callable[[], DeltaTable | None]) -> None:
        owner = f"auto-{epoch.app_id}"
        if owner not in self._reclaimed:
            self._reclaim(owner)
            self._reclaimed.add(owner)
        if self._counts is None:
            self._counts = _small_files(table(), self._small)
        due = sorted(
            d
            for d, n in self._counts.items()
            if n - self._floor.get(d, 0) >= self._options.min_num_files
        )
        if not due:
            return
        spark = classic_session()
        if spark is None:
            if not self._warned_no_spark:
                self._warned_no_spark = True
                log.warning(
                    "auto-compaction of %s skipped: it runs Spark tasks from the driver's "
                    "SparkContext, which this process does not have (Spark Connect); compact "
                    "with DeltaSink(...).compact(spark) from a classic session",
                    self._location.uri,
                )
            return
        log.info(
            "auto-compaction of %s after batch %s of %r: %d partitions with %d or more small "
            "files (e.g. %r)",
            self._location.uri,
            epoch.epoch_id,
            epoch.app_id,
            len(due),
            self._options.min_num_files,
            due[0],
        )
        run_id = str(uuid.uuid4())
        try:
            self.last_result = compact_table(
                spark,
                self._location,
                target_file_size=self._target,
                min_file_size=self._small,
                compression=self._compression,
                staging=self._staging,
                user_metadata=self._user_metadata,
                skip_conditional_put_check=self._skip_check,
                staging_owner=owner,
                run_id=run_id,
                before_commit=lambda _attempt: self._before_commit(epoch, owner, run_id),
            )
        except CommitStateUnknownError:
            self._reclaimed.discard(owner)  # its files are kept: the next batch settles them
            raise
        finally:
            self._recount(table)

    def _recount(self, table: Callable[[], DeltaTable | None]) -> None:
        """Count again after a compaction (or an attempt): what it left is the new floor."""
        self._counts = None  # counted again at the next batch if this read fails
        counts = _small_files(table(), self._small)
        self._counts = counts
        minimum = self._options.min_num_files
        self._floor = {d: n for d, n in counts.items() if n >= minimum}

    def _before_commit(self, epoch: Epoch, owner: str, run_id: str) -> None:
        """Right before the compaction's commit request: the crash step, then the fence
        against a newer process of this writer that reclaimed this run as killed."""
        crash_point("compaction_commit", epoch.epoch_id)
        manifest = spark_manifest_path(compaction_epoch(run_id, owner))
        if not self._location.filesystem().exists(self._location.path(manifest)):
            raise CompactionConflictError(
                f"the staging manifest of auto-compaction {run_id} of {self._location.uri} is "
                "gone: a newer process of the same app id reclaimed this run as killed; "
                "nothing was committed"
            )

    def _reclaim(self, owner: str) -> None:
        """Settle the runs a killed process of this writer left: of each run's files, keep
        those the log references (its commit landed), delete the others, then the manifests.
        """
        directory = epoch_staging_dir(compaction_epoch("-", owner))
        fs = self._location.filesystem()
        try:
            manifests = [
                m
                for m in fs.ls(self._location.path(directory), detail=False)
                if m.endswith(_MANIFEST_SUFFIX)
            ]
        except FileNotFoundError:
            return
        if not manifests:
            return
        run_ids = [m.rsplit("/", 1)[-1][: -len(_MANIFEST_SUFFIX)] for m in manifests]
        fs.rm(manifests)  # (1): a zombie's last check before its commit now fails
        try:
            version = self._fence(owner, run_ids)  # (2)
        except Exception as err:
            log.warning(
                "auto-compaction runs %s of %s, left by a killed or stalled process, were not "
                "settled: the commit fencing them off failed (%r); their staged files stay "
                "until remove_orphan_files() deletes them",
                run_ids,
                self._location.uri,
                err,
            )
            return
        log.info("fenced auto-compaction runs %s of %s at version %d", run_ids, owner, version)
        referenced = referenced_paths(self._location)  # (3) the whole log: only after a kill
        for run_id in run_ids:
            _finish(self._location, compaction_epoch(run_id, owner), referenced)

    def _fence(self, owner: str, run_ids: list[str]) -> int:
        """Commit a version holding only a ``commitInfo`` that names the settled runs (after
        their manifests were deleted); returns it."""
        table = DeltaTable(
            self._location.uri, storage_options=self._location.delta_storage_options()
        )
        write_transaction(
            table,
            [],
            mode="append",
            partition_by=table.metadata().partition_columns,
            location=self._location,
            commit_properties=CommitProperties(
                custom_metadata={
                    COMMIT_OPERATION: OPERATION_FENCE,
                    "operationParameters": {"owner": owner, "runs": ",".join(run_ids)},
                }
            ),
            post_commit=_NO_POST_COMMIT,
        )
        table.update_incremental()
        return table.version()


PartitionKey = tuple[tuple[str, str | None], ...]


def _partition(values: Mapping[str, str | None]) -> PartitionKey:
    """A file's partition, by its values as the log spells them."""
    return tuple(sorted(values.items()))


def _small_files(table: DeltaTable | None, small: int) -> Counter[PartitionKey]:
    """Live files under ``small`` bytes, per partition."""
    counts: Counter[PartitionKey] = Counter()
    if table is None:
        return counts
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return counts
    columns = [n for n in actions.column_names if n.startswith(_PARTITION_PREFIX)]
    values = [actions.column(n).to_pylist() for n in columns]
    names = [n[len(_PARTITION_PREFIX) :] for n in columns]
    for index, size in enumerate(actions.column("size_bytes").to_pylist()):
        if size < small:
            spelled = zip(names, (serialize_partition_value(v[index]) for v in values), strict=True)
            counts[_partition(dict(spelled))] += 1
    return counts
