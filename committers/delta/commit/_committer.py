"""The driver side of the Delta sink: one idempotent Delta transaction per epoch.

Each commit carries ``txn(app_id, epoch_id)`` and our commitInfo keys (writer identity, run id).
delta-rs does not skip replays by itself (see the project notes), so the committer checks the
table's txn version before staging and again on a fresh snapshot right before committing; the
window between that check and the commit is covered by delta-rs's conflict detection, which makes
exactly one of two racing commits of the same app id win.

A one-off epoch (a bounded write without an app id, :attr:`Epoch.one_off`) can never be
replayed, so its commit records no txn (one per such write would accumulate in the table's
state forever, as delta-spark's plain ``df.write`` records none). What the txn does for other
epochs is done by the run id in the commitInfo instead: an unknown commit outcome is reconciled
by finding the run id in the commits made since the epoch was first checked, and the commit is
made with ``max_commit_retries=0``, so delta-rs never rebases it past a commit it cannot tell
is its own (an internal retry of a PUT that had landed): it lands on exactly the version after
the snapshot it read, or fails and is reconciled, then retried on a fresh snapshot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import pyarrow as pa
from deltalake import (
    DeltaTable,
)
from deltalake.exceptions import DeltaError

from committers.delta.commit._auto_compact import AutoCompactor
from committers.delta.commit._epoch_write import EpochWrites
from committers.delta.commit._log_append import (
    LogAppender,
)
from committers.delta.commit._log_commits import LogCommits, described, epoch_key
from committers.delta.commit._log_maintenance import LogMaintenance
from committers.delta.commit._log_store import LogStore
from committers.delta.commit._replacement import _StaleRewrite, check_still_live
from committers.delta.commit._sequence import (
    advance,
    commit_once,
)
from committers.delta.commit._staging_cleanup import StagingCleaner, StagingCleanups
from committers.delta.spark._upsert_marks import DeletionVectorMode
from committers.delta.storage._storage import ResolvedCredentials, TableLocation
from committers.delta.table._deletion_vectors import vector_path
from committers.delta.table._replace_where import ReplaceWhere
from committers.delta.table._rules import WritePlan
from committers.delta.table._schema import (
    SINK_SPELLING,
    OptionSpelling,
    SchemaMode,
)
from committers.delta.table._table import (
    COMMIT_APP_ID,
    CommitRecord,
    added_paths,
    find_commit,
    find_run,
)
from committers.delta.write._committable import (
    DeltaCommittable,
    StagedFile,
    StagedRewrite,
    logged_records,
)
from committers.delta.write._options import Staging, WriterOptions
from committers.delta.write._upsert_spec import UpsertConflictError
from framework.connector import crash_point
from framework.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    ConcurrentWriterError,
    EpochRegressionError,
)
from framework.retry import Backoff
from framework.sink import Epoch, GlobalCommitter

__all__ = ["DeltaGlobalCommitter"]

log = logging.getLogger("committers.delta")

COMMIT_BACKOFF = Backoff(max_attempts=5, initial_delay=0.2, max_delay=5.0, deadline=60.0)
#: A one-off epoch's append lands exactly on top of the snapshot it read (see the module
#: docstring): each commit another writer makes meanwhile costs it an attempt, where delta-rs
#: would have rebased it (up to 15 times) on its own.
ONE_OFF_BACKOFF = Backoff(max_attempts=16, initial_delay=0.05, max_delay=2.0, deadline=60.0)
LOG_CLEANUP_EVERY = 100
RECENT_HISTORY = 256  # commits searched for other writers' app ids (once per new checkpoint)


class DeltaGlobalCommitter(
    LogCommits, EpochWrites, StagingCleanups, GlobalCommitter[StagedFile, DeltaCommittable]
):
    """Commits each epoch's staged files as ONE Delta transaction keyed by (app id, epoch id).

    Guarantees:
        * an epoch whose txn the table already records is never committed again;
        * if another instance sharing the app id committed the epoch, ``ConcurrentWriterError``
          is raised instead of silently skipping (which would lose this instance's rows);
        * an I/O failure during a commit is reconciled by re-reading the txn on a fresh
          snapshot (never by a blind retry); if that stays impossible within ``backoff``,
          ``CommitStateUnknownError``;
        * ``clean_up`` deletes staged files of the epoch that no commit references, and never a
          file that a commit of the epoch references.

    Keeping commit cost flat as history grows: a blind append (a streaming or bounded append
    with an app id) is written straight into the log by :mod:`~committers.delta.commit._log_append`,
    whose view of the table advances by probing for the next version, so neither its replay
    check nor its commit reads the whole log or the live-file list; other commits (overwrites,
    upserts, a table's first commit, tables that need more than adds and a txn, conflicts) go
    through delta-rs on one snapshot per attempt. Checkpoints (at the table's interval) and
    expired-log clean-up (every ``log_cleanup_every`` versions, honouring
    ``delta.enableExpiredLogCleanup`` and ``delta.logRetentionDuration``) run on a worker thread
    (:mod:`~committers.delta.commit._log_maintenance`): a commit never waits for them; :meth:`close`
    lets due work finish.
    """

    def __init__(
        self,
        location: TableLocation,
        *,
        opened: tuple[DeltaTable, ResolvedCredentials | None] | None = None,
        plan: WritePlan,
        input_schema: pa.Schema,
        schema_mode: SchemaMode,
        table_configuration: Mapping[str, str] | None = None,
        cluster_by: Sequence[str] = (),
        backoff: Backoff = COMMIT_BACKOFF,
        log_cleanup_every: int = LOG_CLEANUP_EVERY,
        user_metadata: str | None = None,
        overwrite: bool = False,
        replaces_schema: bool = False,
        replace_where: ReplaceWhere | None = None,
        rewrite_options: WriterOptions | None = None,
        staging: Staging = "auto",
        spelling: OptionSpelling = SINK_SPELLING,
        auto_compactor: AutoCompactor | None = None,
        deletion_vectors: DeletionVectorMode = "auto",
    ) -> None:
        """``opened``: a handle of the table and the credentials it was built with (those of
        the sink's ``prepare``), used instead of opening the table again. ``rewrite_options``,
        ``staging``: how an overwrite whose ``replace_where`` reads data columns rewrites the
        files holding matching rows (see ``_replace_rewrite``), or marks them in deletion
        vectors (``deletion_vectors="auto"`` on a table that enables them, see
        ``_replace_marks``). ``auto_compactor``: compacts small files after epochs
        (:meth:`after_epoch`, see ``_auto_compact``). ``replaces_schema``: with
        ``overwrite``, each commit replaces the table's schema and partitioning by the plan's
        (``schema_mode="overwrite"``, see ``_schema_replacement``)."""
        self._location = location
        self._spelling = spelling  # how the errors of a re-check name options
        self._overwrite = overwrite
        self._replaces_schema = replaces_schema
        self._replace_where = replace_where
        self._rewrite_options = rewrite_options or WriterOptions()
        self._staging: Staging = staging
        self._deletion_vectors: DeletionVectorMode = deletion_vectors
        self._plan = plan
        self._input_schema = input_schema
        self._schema_mode = schema_mode
        self._table_configuration = dict(table_configuration or {})
        self._cluster_by = list(cluster_by)  # a table this committer creates is clustered by
        self._backoff = backoff
        self._log_cleanup_every = log_cleanup_every
        self._user_metadata = user_metadata
        self._table: DeltaTable | None = None if opened is None else opened[0]
        # the credentials self._table holds
        self._credentials: ResolvedCredentials | None = None if opened is None else opened[1]
        self._versions: dict[tuple[str, str, int], int] = {}  # table version holding an epoch
        self._committed_paths: dict[tuple[str, str, int], set[str]] = {}
        self._checked_epoch: tuple[str, str, int] | None = None  # refreshed by is_committed
        # The epoch whose replay check just probed the log view: its commit needs no probe.
        self._probed_for: tuple[str, str, int] | None = None
        self._planned_on_fresh = False  # refreshed by snapshot() for the epoch's rewrite
        # One-off epochs: the table version before this run could commit (-1: no table yet).
        self._read_before: dict[tuple[str, str, int], int] = {}
        # Task attempts of this run whose every file was committed: their manifests need no read.
        self._committed_attempts: dict[tuple[str, str, int], set[int]] = {}
        # The staging of an upsert's epoch (with its redo) from combine() until its commit.
        self._rewrites: dict[tuple[str, str, int], StagedRewrite] = {}
        # Blind appends straight into the log; checkpoints and log clean-up off the commit path.
        self._appender = LogAppender(location) if LogStore.supports(location) else None
        self._maintenance = LogMaintenance(location, cleanup_every=log_cleanup_every)
        self._cleaner = StagingCleaner(location)
        self._auto_compactor = auto_compactor

    # -- table handle ---------------------------------------------------------------------

    def table(self) -> DeltaTable | None:
        """The table handle, advanced to the latest version; ``None`` while no table exists
        (the first commit creates it).

        delta-rs keeps the credentials a handle was built with, so a handle whose S3
        credentials expire (STS, SSO, instance roles, ``credential_process``) is rebuilt with
        freshly resolved ones before they do (:attr:`ResolvedCredentials.renew_at`).
        """
        if (
            self._table is not None
            and not self._credentials_due()
            and advance(self._table, self._location)
        ):
            return self._table
        renewing = self._table is not None and self._credentials_due()
        credentials = self._location.resolve_credentials() if self._location.is_s3 else None
        if renewing and credentials is not None:
            log.info(
                "renewed credentials for %s: %s", self._location, credentials.identity.describe()
            )
        uri, options = self._location.uri, self._location.delta_storage_options(credentials)
        self._table, self._credentials = None, credentials
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            return None
        self._table = DeltaTable(uri, storage_options=options)
        return self._table

    def snapshot(self) -> DeltaTable | None:
        """The table as the replay check of the epoch being committed loaded it (the newest
        snapshot then; ``None``: no table yet), or refreshed now outside of an epoch: a
        rewrite plans on it, so a batch loads the table once."""
        if self._checked_epoch is not None and not self._credentials_due():
            return self._table
        table = self.table()
        self._planned_on_fresh = True  # the epoch's commit may start from this very snapshot
        return table

    def _credentials_due(self) -> bool:
        """Whether the handle's credentials are due for renewal."""
        renew_at = None if self._credentials is None else self._credentials.renew_at
        return renew_at is not None and time.time() >= renew_at

    def last_committed_epoch(self, app_id: str) -> int | None:
        """The newest epoch id the table records for ``app_id``, or ``None``: from the log
        view when the log can be followed (no snapshot is loaded), else from delta-rs."""
        view = None if self._appender is None else self._appender.current()
        if view is not None:
            return view.txns.get(app_id)
        table = self.table()
        return None if table is None else table.transaction_version(app_id)

    def recent_app_ids(self, prefix: str) -> list[str]:
        """App ids starting with ``prefix`` among the table's last ``RECENT_HISTORY`` commits."""
        table = self.table()
        if table is None:
            return []
        found = {
            str(info[COMMIT_APP_ID])
            for info in table.history(limit=RECENT_HISTORY)
            if str(info.get(COMMIT_APP_ID, "")).startswith(prefix)
        }
        return sorted(found)

    # -- GlobalCommitter ------------------------------------------------------------------

    def is_committed(self, epoch: Epoch) -> bool:
        self._planned_on_fresh = False
        if self._log_shows_new(epoch):
            crash_point("replay_check", epoch.epoch_id)
            return False
        table = self.table()
        if epoch.one_off:  # a fresh identity: where its commit could appear starts here
            self._read_before[epoch_key(epoch)] = -1 if table is None else table.version()
        held = self._holds(table, epoch)
        crash_point("replay_check", epoch.epoch_id)
        if not held and table is not None:  # before the epoch stages anything
            self._check_replaceable(table.metadata().configuration, epoch)
        if not held:
            self._checked_epoch = epoch_key(epoch)
        return held

    def _check_same_writer(self, epoch: Epoch, record: CommitRecord) -> None:
        """``record`` is the commit of ``epoch``: it must be this writer's."""
        if record.writer_identity in (None, epoch.writer_identity):
            return
        raise ConcurrentWriterError(
            f"app id {epoch.app_id!r} is used by two writers: batch {epoch.epoch_id} was "
            f"committed at table version {record.version} by writer {record.writer_identity!r},"
            f" not by this one ({epoch.writer_identity!r}). Skipping it would lose this "
            "writer's rows; give each query its own app_id, or stop the other query (a new "
            "checkpoint is a new query)."
        )

    def committed_rows(self, committables: list[StagedFile]) -> int:
        """The rows the add actions of ``committables`` record (``numRecords`` of their
        stats, what readers count)."""
        return sum(logged_records(f) for f in committables)

    def combine(self, epoch: Epoch, committables: list[StagedFile]) -> DeltaCommittable:
        """One committable of the epoch's files; an upsert's staging (a
        :class:`StagedRewrite`) also brings the files its commit removes. An overwrite whose
        ``replace_where`` reads data columns rewrites here the files holding matching rows
        (:func:`~committers.delta.spark._replace_rewrite.replace_rows`), for the same commit.

        Raises:
            StagingError, UnsupportedTableFeatureError: that rewrite failed or is impossible;
                nothing is committed, and the engine's abort deletes what it wrote.
        """
        if not isinstance(committables, StagedRewrite) and self._rewrites_rows():
            committables = self._replaced_rows(epoch, committables, attempt=0)
        rewrite = None
        if isinstance(committables, StagedRewrite):
            rewrite = committables.rewrite
            self._rewrites[epoch_key(epoch)] = committables
        return DeltaCommittable(
            epoch=epoch, files=tuple(sorted(committables, key=lambda f: f.path)), rewrite=rewrite
        )

    def commit(self, global_committables: list[DeltaCommittable]) -> list[DeltaCommittable]:
        for committable in global_committables:
            self._commit_one(committable)
        return []

    def _commit_one(self, committable: DeltaCommittable) -> None:
        """Commit the epoch once; an upsert whose replaced files another writer removed
        meanwhile is redone once on the newer snapshot (see :meth:`_redo`)."""
        try:
            while True:
                try:
                    self._commit_staged(committable)
                    return
                except _StaleRewrite as stale:
                    committable = self._redo(committable, stale)
        finally:
            self._rewrites.pop(epoch_key(committable.epoch), None)

    def _redo(self, committable: DeltaCommittable, stale: _StaleRewrite) -> DeltaCommittable:
        """The epoch computed again by its stager on the table's newest snapshot (Spark work,
        into a new run directory whose manifest the epoch's clean-up reads too).

        Raises:
            UpsertConflictError: the epoch was redone already (or cannot be): nothing of it is
                committed; the engine's abort deletes its staged files.
        """
        epoch = committable.epoch
        staged = self._rewrites.get(epoch_key(epoch))
        if staged is not None and staged.redo is None and self._rewrites_rows():
            raise CommitConflictError(
                f"the overwrite (epoch {epoch.epoch_id} of app id {epoch.app_id!r}) could not "
                f"be committed to {self._location.uri}: {stale} It was computed again on the "
                "newer snapshot and another writer changed the files it replaces again. "
                "Nothing of it was committed and its staged files are deleted; re-running the "
                "write computes it on the table as it is then. Let one writer change these "
                "rows, or retry at a quieter time."
            ) from stale
        if staged is None or staged.redo is None:
            raise UpsertConflictError(
                f"batch {epoch.epoch_id} of app id {epoch.app_id!r} could not be committed to "
                f"{self._location.uri}: {stale} It was computed again on the newer snapshot "
                "and another writer removed a file it rewrites again. Nothing of it was "
                "committed and its staged files are deleted; restarting the query (or "
                "re-running the write) computes it on the table as it is then. Let one writer "
                "update these rows, or retry at a quieter time."
            ) from stale
        log.warning(
            "batch %s of %r: %s Computing it again on the newest snapshot of %s.",
            epoch.epoch_id,
            epoch.app_id,
            stale,
            self._location.uri,
        )
        redo = staged.redo
        staged.replace_with(redo())  # the epoch's metrics then describe what is committed
        return self.combine(epoch, staged)

    def _commit_staged(self, committable: DeltaCommittable) -> None:
        """Commit once: retried with backoff, an unknown outcome reconciled through the txn."""
        epoch = committable.epoch

        def attempt(number: int) -> None:
            if self._commits_identity_table():  # delta-rs refuses these tables
                self._append_to_identity_table(committable)
                return
            if self._append_through_log(committable):
                return
            # Right after is_committed() refreshed the handle for this epoch, a second refresh
            # would only repeat a listing of the log: a commit of the same app id landing in
            # between is still caught by delta-rs's conflict check.
            table: DeltaTable | None = self._table
            fresh = self._checked_epoch == epoch_key(epoch) or self._planned_on_fresh
            if (
                number > 1
                or not fresh
                or table is None
                or self._credentials_due()  # staging took long: renew before committing
            ):
                table = self.table()
            if table is None:
                if self._create_with(committable):
                    self._remember(committable, version=0)
                    return
                table = self.table()  # created by a concurrent writer: append to it
                if table is None:
                    raise CommitConflictError(f"{self._location.uri} vanished while committing")
            if self._holds(table, epoch):  # committed before (delta-rs would commit it again)
                return
            self._check_plan(self._shape_to_commit_to(table), epoch)
            if committable.rewrite is not None:
                check_still_live(table, self._location, committable.rewrite)
            read_version = table.version()
            crash_point("commit_write", epoch.epoch_id, within_seconds=0.005)
            self._write_commit(table, committable)
            # An exact commit (it replaces or rewrites files: no retries) is the next version
            # or raised; only a rebased append needs the log read back to find its version.
            # (delta-rs discards the snapshot it built after the commit; the next batch's
            # refresh is the one load.)
            if self._commits_exactly(committable):
                version: int | None = read_version + 1
            else:
                version = self._version_of_commit(table, read_version, epoch)
            configuration = table.metadata().configuration
            self._maintenance.committed(version or read_version + 1, configuration)
            self._remember(committable, version=version)

        try:
            commit_once(
                attempt,
                landed=lambda: self._holds(self.table(), epoch),
                backoff=ONE_OFF_BACKOFF if epoch.one_off else self._backoff,
                description=f"commit of {described(epoch)}",
                lost_every_race=lambda _: (
                    f"{described(epoch)} lost every commit race on {self._location.uri}; "
                    "nothing was committed and "
                    + ("writing it again" if epoch.one_off else "restarting")
                    + " is safe."
                ),
            )
        except CommitStateUnknownError as err:
            if epoch.one_off:
                advice = (
                    f"Its commit would carry sink.runId={epoch.run_id!r} in its commitInfo "
                    "(DeltaTable(...).history(), or python -m committers.delta inspect): if no "
                    "commit does, write again; remove_orphan_files() deletes what it staged."
                )
            else:
                advice = (
                    "Restarting the query is safe: the batch is replayed, found in the table or "
                    "committed once."
                )
            raise CommitStateUnknownError(
                f"could not establish whether {described(epoch)} was committed to "
                f"{self._location.uri}: {err}. {advice}"
            ) from err.__cause__
        finally:
            self._checked_epoch = None
            self._planned_on_fresh = False

    def _replaces_all(self, epoch: Epoch) -> bool:
        return self._overwrite or epoch.output_mode == "complete"

    def _commits_exactly(self, committable: DeltaCommittable) -> bool:
        """Whether the commit must land right on top of its snapshot (delta-rs may not rebase
        it: it replaces or rewrites files), so it is the next version or it fails."""
        return (
            self._replaces_all(committable.epoch)
            or committable.rewrite is not None
            or self._replace_where is not None
        )

    def _holds(self, table: DeltaTable | None, epoch: Epoch) -> bool:
        """Whether ``table`` already holds ``epoch`` (before a commit, or to reconcile one).

        The txn says whether the app id got this far; the commit history says by whom. If an
        earlier attempt of this run landed, its files are what clean-up must keep.

        Raises:
            ConcurrentWriterError: another writer committed the epoch, or (streaming) moved the
                app id past it.
            EpochRegressionError: a bounded epoch below the recorded one that was never
                committed (or whose commit is older than the history searched).
        """
        if table is None:
            return False
        if epoch.one_off:
            return self._holds_run(table, epoch)
        last = table.transaction_version(epoch.app_id)
        if last is None or last < epoch.epoch_id:
            return False
        record, newest = find_commit(table, epoch.app_id, epoch.epoch_id)
        if record is not None:
            self._check_same_writer(epoch, record)
            self._versions[epoch_key(epoch)] = record.version
            if record.run_id == epoch.run_id:
                self._committed_paths[epoch_key(epoch)] = added_paths(
                    self._location, record.version
                )
        elif last != epoch.epoch_id:
            self._check_epoch_order(epoch, last, newest)
        log.info("batch %s of %r is already in the table", epoch.epoch_id, epoch.app_id)
        return True

    def _holds_run(self, table: DeltaTable, epoch: Epoch) -> bool:
        """Whether a commit of this run of the one-off ``epoch`` is in ``table``: searched in
        the versions after the one :meth:`is_committed` read (the recent history if it was not
        asked)."""
        key = epoch_key(epoch)
        version = find_run(table, epoch.run_id, after_version=self._read_before.get(key))
        if version is None:
            return False
        self._versions[key] = version
        self._committed_paths[key] = added_paths(self._location, version)
        log.info("the write %s is already in the table (version %d)", epoch.run_id, version)
        return True

    def _check_epoch_order(self, epoch: Epoch, last: int, newest: CommitRecord | None) -> None:
        """``epoch`` is below the recorded ``last`` and its own commit was not found.

        A streaming writer only moves forward, so if it made the newest commit of the app id,
        the epoch is an old replay. Anything else is an error, never a silent skip.
        """
        if not epoch.bounded:
            if newest is None or newest.writer_identity in (None, epoch.writer_identity):
                return
            raise ConcurrentWriterError(
                f"app id {epoch.app_id!r} is used by two writers: the table already holds batch "
                f"{newest.epoch_id} of it (table version {newest.version}, writer "
                f"{newest.writer_identity!r}), so batch {epoch.epoch_id} of this writer "
                f"({epoch.writer_identity!r}) would be skipped. Give each query its own app_id."
            )
        raise EpochRegressionError(
            f"epoch {epoch.epoch_id} of app id {epoch.app_id!r} is lower than the newest epoch "
            f"the table records for it ({last}), and no commit of epoch {epoch.epoch_id} is in "
            "the table's recent history. Delta keys exactly-once writes by increasing ids per "
            "app id (its txnVersion rule), so this epoch can be neither skipped as a replay nor "
            f"committed. Nothing was written. For a new job (a backfill, say), use its own "
            f"app_id; to continue this one, use an epoch_id above {last}."
        )

    def _remember(self, committable: DeltaCommittable, version: int | None) -> None:
        """What clean-up must keep (the files the commit of this run references), and the
        version that holds the epoch."""
        key = epoch_key(committable.epoch)
        rewrite = committable.rewrite
        changes = rewrite.change_files if rewrite else ()
        marked = rewrite.marked if rewrite else ()
        vectors = {vector_path(m.vector, self._location) or "" for m in marked} - {""}
        self._committed_paths[key] = {f.path for f in (*committable.files, *changes)} | vectors
        self._committed_attempts[key] = {f.task_attempt_id for f in committable.files}
        if self._auto_compactor is not None:
            self._auto_compactor.committed(committable.files)
        if version is not None:
            self._versions[key] = version

    def committed_version(self, epoch: Epoch) -> int | None:
        return self._versions.get(epoch_key(epoch))

    def close(self) -> None:
        """Let the staging clean-up handed over and the log maintenance due after the last
        commit finish (up to ``MAINTENANCE_CLOSE_WAIT`` seconds each), then stop the latter."""
        self._cleaner.wait_idle(MAINTENANCE_CLOSE_WAIT)
        self._maintenance.wait_idle(MAINTENANCE_CLOSE_WAIT)
        self._maintenance.stop()

    def _version_of_commit(self, table: DeltaTable, read_version: int, epoch: Epoch) -> int | None:
        """The version our commit landed at, from the log after ``read_version``: the next
        version unless delta-rs rebased past concurrent commits (then searched by run id).
        ``None`` if the log cannot tell (the commit stands either way)."""
        try:
            table.update_incremental()
            if table.version() == read_version + 1:
                return read_version + 1  # nothing but our commit landed since the read
            if epoch.one_off:
                return find_run(table, epoch.run_id, after_version=read_version)
            record, _ = find_commit(table, epoch.app_id, epoch.epoch_id)
        except (DeltaError, OSError) as err:  # metrics only
            log.info("version of batch %s not read back: %s", epoch.epoch_id, err)
            return None
        return record.version if record is not None and record.run_id == epoch.run_id else None

    def after_epoch(self, epoch: Epoch) -> None:
        """Auto-compaction, when due (see ``_auto_compact``); never raises an ``Exception``."""
        if self._auto_compactor is not None:
            self._auto_compactor.after_epoch(epoch, self.table)


#: How long ``close()`` lets due log maintenance (a checkpoint) finish.
MAINTENANCE_CLOSE_WAIT = 60.0
