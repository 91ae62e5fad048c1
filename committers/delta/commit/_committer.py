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

import functools
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from deltalake import (
    CommitProperties,
    DeltaTable,
    Field,
    Transaction,
)
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import DeltaError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from committers.delta.commit._auto_compact import AutoCompactor
from committers.delta.commit._change_data_commit import (
    LoggedRemove,
    add_entry,
    live_removes,
    write_commit_with_changes,
)
from committers.delta.commit._log_append import (
    AppendConflict,
    AppendIdentity,
    LogAppender,
    LogStore,
    LogView,
    adds_columns,
    commit_lines,
    shape_of,
    unsupported_by_append,
)
from committers.delta.commit._log_maintenance import LogMaintenance
from committers.delta.commit._replacement import ReplacementCommits, _StaleRewrite
from committers.delta.commit._sequence import (
    POST_COMMIT,
    add_action,
    advance,
    commit_once,
    files_gone,
    write_transaction,
)
from committers.delta.commit._staging_cleanup import StagingCleaner, remove_leftovers
from committers.delta.storage._storage import ResolvedCredentials, TableLocation
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor, unique_id
from committers.delta.table._identity import (
    IDENTITY_FEATURE,
    IDENTITY_TAG,
    advanced_metadata,
    high_water_marks,
)
from committers.delta.table._live_vectors import table_deletion_vectors
from committers.delta.table._protocol import (
    UnsupportedTableFeatureError,
    check_appends_only,
    check_replaceable,
)
from committers.delta.table._replace_where import ReplaceWhere, with_replace_where
from committers.delta.table._rules import TableShape, WritePlan, new_table_schema, plan_write
from committers.delta.table._schema import (
    SINK_SPELLING,
    OptionSpelling,
    SchemaMode,
    merge_schemas,
)
from committers.delta.table._snapshot import reader_features
from committers.delta.table._table import (
    COMMIT_APP_ID,
    COMMIT_EPOCH_ID,
    COMMIT_RUN_ID,
    COMMIT_WRITER,
    CommitRecord,
    added_paths,
    find_commit,
    find_run,
)
from committers.delta.write._committable import (
    DeltaCommittable,
    Rewrite,
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
#: Re-checks of an identity table's commit against concurrent metadata changes (each one a
#: commit that landed first, e.g. another writer's identity values).
IDENTITY_COMMIT_ATTEMPTS = 16
RECENT_HISTORY = 256  # commits searched for other writers' app ids (once per new checkpoint)


class DeltaGlobalCommitter(ReplacementCommits, GlobalCommitter[StagedFile, DeltaCommittable]):
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
        backoff: Backoff = COMMIT_BACKOFF,
        log_cleanup_every: int = LOG_CLEANUP_EVERY,
        user_metadata: str | None = None,
        overwrite: bool = False,
        replace_where: ReplaceWhere | None = None,
        rewrite_options: WriterOptions | None = None,
        staging: Staging = "auto",
        spelling: OptionSpelling = SINK_SPELLING,
        auto_compactor: AutoCompactor | None = None,
    ) -> None:
        """``opened``: a handle of the table and the credentials it was built with (those of
        the sink's ``prepare``), used instead of opening the table again. ``rewrite_options``,
        ``staging``: how an overwrite whose ``replace_where`` reads data columns rewrites the
        files holding matching rows (see ``_replace_rewrite``). ``auto_compactor``: compacts
        small files after epochs (:meth:`after_epoch`, see ``_auto_compact``)."""
        self._location = location
        self._spelling = spelling  # how the errors of a re-check name options
        self._overwrite = overwrite
        self._replace_where = replace_where
        self._rewrite_options = rewrite_options or WriterOptions()
        self._staging: Staging = staging
        self._plan = plan
        self._input_schema = input_schema
        self._schema_mode = schema_mode
        self._table_configuration = dict(table_configuration or {})
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
            self._read_before[_key(epoch)] = -1 if table is None else table.version()
        held = self._holds(table, epoch)
        crash_point("replay_check", epoch.epoch_id)
        if not held and table is not None:  # before the epoch stages anything
            self._check_replaceable(table.metadata().configuration, epoch)
        if not held:
            self._checked_epoch = _key(epoch)
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
            self._rewrites[_key(epoch)] = committables
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
            self._rewrites.pop(_key(committable.epoch), None)

    def _redo(self, committable: DeltaCommittable, stale: _StaleRewrite) -> DeltaCommittable:
        """The epoch computed again by its stager on the table's newest snapshot (Spark work,
        into a new run directory whose manifest the epoch's clean-up reads too).

        Raises:
            UpsertConflictError: the epoch was redone already (or cannot be): nothing of it is
                committed; the engine's abort deletes its staged files.
        """
        epoch = committable.epoch
        staged = self._rewrites.get(_key(epoch))
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
            fresh = self._checked_epoch == _key(epoch) or self._planned_on_fresh
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
            self._check_plan(self._evolve_schema(table), epoch)
            if committable.rewrite is not None:
                _check_still_live(table, self._location, committable.rewrite)
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
                description=f"commit of {_described(epoch)}",
                lost_every_race=lambda _: (
                    f"{_described(epoch)} lost every commit race on {self._location.uri}; "
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
                f"could not establish whether {_described(epoch)} was committed to "
                f"{self._location.uri}: {err}. {advice}"
            ) from err.__cause__
        finally:
            self._checked_epoch = None
            self._planned_on_fresh = False

    def _write_commit(self, table: DeltaTable, committable: DeltaCommittable) -> None:
        """One Delta commit of the epoch's files, on top of ``table``'s snapshot.

        An append may land on a newer version (delta-rs rebases it past concurrent commits
        that do not conflict). A commit that replaces data (complete mode, ``mode=
        "overwrite"``) removes exactly what this snapshot holds, so it must land right on top
        of it: delta-rs may not rebase it, and a concurrent commit fails it with
        ``CommitFailedError``, which the caller's reconciliation retries on a fresh snapshot
        (the staged files are reused; nothing is staged again). An upsert's commit (a
        ``rewrite``) appends its adds with the removes of the files it rewrote, which the caller
        found live in this snapshot: it must land right on top of it too.
        """
        epoch = committable.epoch
        actions: list[AddAction | RemoveAction] = [add_action(f) for f in committable.files]
        replacing = self._replaces_all(epoch)
        if self._replace_where is not None:
            self._write_replacement(table, committable, actions)
            return
        rewrite = committable.rewrite
        if rewrite is not None and rewrite.change_files:  # cdc actions: delta-rs cannot
            replaced = rewrite.replaced
            logged = live_removes(
                table,
                [f.logged_path for f in replaced],
                {f.logged_path: f.deletion_vector for f in replaced if f.deletion_vector},
            )
            self._write_with_changes(table, committable, logged)
            return
        vectors: dict[str, DeletionVectorDescriptor] = {}
        if committable.rewrite is not None:
            now = int(time.time() * 1000)
            replaced = committable.rewrite.replaced
            removes = [RemoveAction(f.path, True, now, f.size) for f in replaced]
            removed, actions = len(removes), [*removes, *actions]
            vectors = {f.path: f.deletion_vector for f in replaced if f.deletion_vector}
        elif replacing:  # delta-rs's overwrite removes every file of the snapshot
            removed = len(table.file_uris())
        else:
            removed = 0
        exact = self._commits_exactly(committable)
        write_transaction(
            table,
            actions,
            mode="overwrite" if replacing else "append",
            partition_by=self._plan.shape.partition_by,
            commit_properties=self._commit_properties(
                committable, removed_files=removed, retries=0 if exact else None
            ),
            post_commit=POST_COMMIT,
            location=self._location,
            vectors=vectors,  # (removes of files with a vector: written by _log_rewrite)
        )

    def _write_with_changes(
        self,
        table: DeltaTable,
        committable: DeltaCommittable,
        removes: list[LoggedRemove],
        deleted_rows: int | None = None,
    ) -> None:
        """The commit of a rewrite with change files (the change data feed is on): written by
        the sink, landing right on top of ``table``'s snapshot or raising
        ``CommitFailedError`` (see :mod:`._change_data_commit`)."""
        assert committable.rewrite is not None
        write_commit_with_changes(
            self._location,
            table,
            adds=committable.files,
            removes=removes,
            change_files=committable.rewrite.change_files,
            properties=self._commit_properties(
                committable, removed_files=len(removes), retries=0, deleted_rows=deleted_rows
            ),
            partition_by=self._plan.shape.partition_by,
        )

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
            self._versions[_key(epoch)] = record.version
            if record.run_id == epoch.run_id:
                self._committed_paths[_key(epoch)] = added_paths(self._location, record.version)
        elif last != epoch.epoch_id:
            self._check_epoch_order(epoch, last, newest)
        log.info("batch %s of %r is already in the table", epoch.epoch_id, epoch.app_id)
        return True

    def _holds_run(self, table: DeltaTable, epoch: Epoch) -> bool:
        """Whether a commit of this run of the one-off ``epoch`` is in ``table``: searched in
        the versions after the one :meth:`is_committed` read (the recent history if it was not
        asked)."""
        key = _key(epoch)
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
        key = _key(committable.epoch)
        changes = committable.rewrite.change_files if committable.rewrite else ()
        self._committed_paths[key] = {f.path for f in (*committable.files, *changes)}
        self._committed_attempts[key] = {f.task_attempt_id for f in committable.files}
        if self._auto_compactor is not None:
            self._auto_compactor.committed(committable.files)
        if version is not None:
            self._versions[key] = version

    def committed_version(self, epoch: Epoch) -> int | None:
        return self._versions.get(_key(epoch))

    def close(self) -> None:
        """Let the staging clean-up handed over and the log maintenance due after the last
        commit finish (up to ``MAINTENANCE_CLOSE_WAIT`` seconds each), then stop the latter."""
        self._cleaner.wait_idle(MAINTENANCE_CLOSE_WAIT)
        self._maintenance.wait_idle(MAINTENANCE_CLOSE_WAIT)
        self._maintenance.stop()

    # -- blind appends straight into the log (_log_append) --------------------------------

    def _appends_blindly(self, epoch: Epoch) -> bool:
        """Whether ``epoch``'s commit adds files and a txn and reads nothing."""
        return (
            self._appender is not None
            and not epoch.one_off
            and epoch.output_mode == "append"
            and not self._overwrite
            and self._replace_where is None
        )

    def _log_shows_new(self, epoch: Epoch) -> bool:
        """The replay check from the log view: ``True`` when the table's txn of the app id is
        below ``epoch`` (it is new); ``False`` when only a snapshot can tell."""
        if self._appender is None or epoch.one_off:
            return False
        view = self._appender.current()
        self._probed_for = _key(epoch)
        return view is not None and view.txns.get(epoch.app_id, -1) < epoch.epoch_id

    def _append_through_log(self, committable: DeltaCommittable) -> bool:
        """Commit a blind append at the version after the log view's, without a snapshot;
        ``False`` (nothing written) when the delta-rs path must decide: the table is missing
        or needs more than adds and a txn, the txn of the app id reached the epoch, the input
        adds columns, or a commit since conflicts (:func:`~committers.delta.commit._log_append.
        conflict_of`). Its errors are those of the delta-rs path (``_check_plan``)."""
        epoch = committable.epoch
        if committable.rewrite is not None or not self._appends_blindly(epoch):
            return False
        assert self._appender is not None
        # Right after this epoch's replay check the view needs no second probe: the append's
        # put-if-absent is one (a lost race reads what it missed).
        probed, self._probed_for = self._probed_for == _key(epoch), None
        view = self._appender.current(probe=not probed)
        if view is None or unsupported_by_append(view) is not None:
            return False
        if view.txns.get(epoch.app_id, -1) >= epoch.epoch_id:
            return False
        if not self._appender.rules_checked(view):
            shape = shape_of(view)
            if adds_columns(shape, self._input_schema, self._schema_mode, self._spelling):
                return False
            self._check_plan(shape, epoch)
            self._appender.mark_rules_checked(view)
        properties = self._commit_properties(committable)
        adds = [add_entry(f) for f in committable.files]
        me = _append_identity(epoch)
        crash_point("commit_write", epoch.epoch_id, within_seconds=0.005)
        try:
            outcome = self._appender.append(
                me,
                lambda now: commit_lines(
                    adds,
                    txn=(epoch.app_id, epoch.epoch_id),
                    custom_metadata=properties.custom_metadata or {},
                    partition_by=view.metadata.get("partitionColumns") or [],
                    now_ms=now,
                ),
            )
        except AppendConflict as conflict:
            log.info(
                "batch %s of %r goes through delta-rs: %s", epoch.epoch_id, epoch.app_id, conflict
            )
            return False
        crash_point("commit_written", epoch.epoch_id)
        self._maintenance.committed(outcome.version, view.configuration)
        self._remember(committable, version=outcome.version)
        return True

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

    def _commit_properties(
        self,
        committable: DeltaCommittable,
        *,
        removed_files: int = 0,
        retries: int | None = None,
        deleted_rows: int | None = None,
    ) -> CommitProperties:
        """The txn that makes the commit idempotent; our keys, delta-spark's streaming
        operation parameters and metrics, and the user's metadata in its commitInfo. A one-off
        epoch records no txn and of our keys only its run id (its app id is made up)."""
        epoch = committable.epoch
        files = committable.files
        keys = {COMMIT_RUN_ID: epoch.run_id}
        if not epoch.one_off:
            keys = {
                COMMIT_APP_ID: epoch.app_id,
                COMMIT_EPOCH_ID: str(epoch.epoch_id),
                COMMIT_WRITER: epoch.writer_identity,
                **keys,
            }
        metadata: dict[str, Any] = {
            **keys,
            # A replay check reads only txns; complete mode replaces what it read, an upsert
            # rewrites the files holding its keys.
            "isBlindAppend": epoch.output_mode == "append"
            and not self._overwrite
            and committable.rewrite is None,
            "operationParameters": _operation_parameters(
                epoch, self._replace_where, committable.rewrite
            ),
            "operationMetrics": {  # strings, as delta-spark writes them
                "numFiles": str(len(files)),
                "numAddedFiles": str(len(files)),
                "numRemovedFiles": str(removed_files),
                "numOutputRows": str(sum(f.num_records for f in files)),
                "numOutputBytes": str(sum(f.size for f in files)),
            },
        }
        if committable.rewrite is not None:
            metadata["operationMetrics"].update(
                {name: str(value) for name, value in committable.rewrite.metrics.items()}
            )
            if committable.rewrite.read_version is not None:
                metadata["readVersion"] = committable.rewrite.read_version
        if deleted_rows is not None:
            metadata["operationMetrics"]["numDeletedRows"] = str(deleted_rows)
        user_metadata = epoch.user_metadata or self._user_metadata
        if user_metadata:
            metadata["userMetadata"] = user_metadata
        return CommitProperties(
            app_transactions=None if epoch.one_off else [Transaction(epoch.app_id, epoch.epoch_id)],
            custom_metadata=metadata,
            max_commit_retries=0 if epoch.one_off else retries,
        )

    def _create_with(self, committable: DeltaCommittable) -> bool:
        """Create the table with the epoch's files in ONE commit (protocol, metadata, adds and
        txn), so a failed first write leaves no table behind. Returns ``False`` if another
        writer created the table first (this epoch then appends to it)."""
        epoch = committable.epoch
        shape = self._plan.shape
        try:
            create_table_with_add_actions(
                self._location.uri,
                DeltaSchema.from_arrow(new_table_schema(self._input_schema)),  # as planned
                [add_action(f) for f in committable.files],
                mode="error",
                partition_by=list(shape.partition_by) or None,
                configuration=self._table_configuration or None,
                storage_options=self._location.delta_storage_options(),
                commit_properties=self._commit_properties(committable, retries=0),
                post_commithook_properties=POST_COMMIT,
            )
        except Exception:
            uri, options = self._location.uri, self._location.delta_storage_options()
            if DeltaTable.is_deltatable(uri, storage_options=options):
                log.info("table %s was created concurrently; appending to it", uri)
                return False
            raise
        log.info(
            "created table %s with batch %s of %r", self._location.uri, epoch.epoch_id, epoch.app_id
        )
        return True

    def _check_plan(self, shape: TableShape, epoch: Epoch) -> None:
        """Commit only if the table (``shape``, as it is now) still asks for exactly what the
        rows were staged under: a constraint, feature or schema change since staging fails the
        batch, nothing committed.

        Raises:
            CommitConflictError: the table's rules changed; a restart re-stages the batch under
                the new rules (and reports the rows that break them).
            UnsupportedTableFeatureError, SchemaMismatchError: the table changed so that the
                input can no longer be written at all.
        """
        self._check_replaceable(dict(shape.configuration), epoch)
        if self._replaces_all(epoch):
            check_appends_only(shape.features, self._location.uri, "output_mode='complete'")
        current = plan_write(
            shape, self._input_schema, self._schema_mode, self._location.uri, self._spelling
        )
        if self._replace_where is not None:
            current, _ = with_replace_where(current, self._replace_where, self._location.uri)
        staged = self._plan
        if (current.input_plan, current.layout) == (staged.input_plan, staged.layout):
            return
        raise CommitConflictError(
            f"the table {self._location.uri} changed while batch {epoch.epoch_id} of "
            f"{epoch.app_id!r} was being staged (its schema, constraints, generated columns, "
            "column mapping or features), so the staged rows were checked against rules that "
            "no longer hold. Nothing was committed; restarting the query re-stages the batch "
            "under the table's current rules."
        )

    def _check_replaceable(self, configuration: Mapping[str, str], epoch: Epoch) -> None:
        """Refuse an epoch that replaces the table's rows if the table is append-only.

        Raises:
            UnsupportedTableFeatureError: see :func:`check_replaceable`.
        """
        if self._overwrite:
            check_replaceable(configuration, self._location.uri, "mode='overwrite'")
        elif epoch.output_mode == "complete":
            check_replaceable(configuration, self._location.uri, "output_mode='complete'")

    def _evolve_schema(self, table: DeltaTable) -> TableShape:
        """In merge mode, first add the input's new columns to the table; returns the table's
        shape after that.

        Adding columns is its own metadata-only commit (delta-rs cannot attach a schema change
        to a write transaction). It is idempotent: after a crash the columns exist and are not
        added again; all new columns are nullable, so no reader sees invalid data.
        """
        shape = TableShape.of_table(table)
        current = shape.arrow_schema()
        merged = merge_schemas(
            current, self._input_schema, self._schema_mode, shape.generated_columns, self._spelling
        )
        if len(merged) > len(current):
            new_fields = [Field.from_arrow(f) for f in merged if f.name not in current.names]
            table.alter.add_columns(new_fields)
            crash_point("schema_merge")
            table.update_incremental()
            log.info("added columns %s to %s", [f.name for f in new_fields], self._location.uri)
            return TableShape.of_table(table)
        return shape

    # -- staged files ---------------------------------------------------------------------

    def _committed_files(self, epoch: Epoch) -> tuple[bool, set[str] | None]:
        """(is ``epoch`` committed, the files its commit references). The files are ``None``
        when the epoch is committed but its commit is no longer in recent history."""
        known = self._committed_paths.get(_key(epoch))
        if known is not None:
            return True, known
        table = self.table()
        if epoch.one_off:
            if table is not None and self._holds_run(table, epoch):
                return True, self._committed_paths[_key(epoch)]
            return False, set()
        last = None if table is None else table.transaction_version(epoch.app_id)
        if table is None or last is None or last < epoch.epoch_id:
            return False, set()
        record, _ = find_commit(table, epoch.app_id, epoch.epoch_id)
        return True, None if record is None else added_paths(self._location, record.version)

    def clean_up(self, epoch: Epoch) -> None:
        """Delete staged files of ``epoch`` that no commit references, then their manifests
        (see :func:`remove_leftovers`).

        A committed micro-batch on an object store is handed to the background cleaner
        (:class:`StagingCleaner`) instead: its commit step does not wait for the listing and
        deletes; :meth:`close` does.
        """
        attempts = self._committed_attempts.pop(_key(epoch), set())
        committed, committed_files = self._committed_files(epoch)
        self._committed_paths.pop(_key(epoch), None)
        self._read_before.pop(_key(epoch), None)
        if committed and committed_files is not None and self._cleans_in_background(epoch):
            self._cleaner.hand_over(epoch, committed_files, attempts)
            return
        remove_leftovers(
            self._location,
            epoch,
            committed=committed,
            committed_files=committed_files,
            committed_attempts=attempts,
        )

    def _cleans_in_background(self, epoch: Epoch) -> bool:
        """Micro-batches on object stores (where clean-up costs requests) are cleaned up by
        the worker; bounded writes and local tables synchronously."""
        return not epoch.bounded and not self._location.is_local

    def after_epoch(self, epoch: Epoch) -> None:
        """Auto-compaction, when due (see ``_auto_compact``); never raises an ``Exception``."""
        if self._auto_compactor is not None:
            self._auto_compactor.after_epoch(epoch, self.table)

    def abort(self, epoch: Epoch) -> None:
        """Same as :meth:`clean_up`: whatever the table does not reference is deleted."""
        self.clean_up(epoch)

    # -- tables with identity columns (see table/_identity.py) ----------------------------

    def _commits_identity_table(self) -> bool:
        return IDENTITY_FEATURE in self._plan.shape.features

    def identity_marks(self) -> dict[str, int | None]:
        """Each identity column's high-water mark (``None``: no value generated yet) at the
        table's newest version, read from the log view (one probe when it is current).

        Raises:
            UnsupportedTableFeatureError: see :meth:`_identity_view`.
        """
        return high_water_marks(self._identity_view().metadata["schemaString"])

    def _identity_view(self) -> LogView:
        """The log view of a table with identity columns, which only this committer's log
        writer can commit to (delta-rs refuses the feature).

        Raises:
            UnsupportedTableFeatureError: the log cannot be written here: a storage other than
                a local file system or S3, a checkpoint format the view does not read, or
                writer features the log writer does not write.
        """
        view = None if self._appender is None else self._appender.current()
        reason = (
            f"its storage ({self._location.uri}) is neither local nor S3"
            if self._appender is None
            else "its log cannot be followed here (a v2 checkpoint, say)"
            if view is None
            else unsupported_by_append(view, honoured=frozenset({IDENTITY_FEATURE}))
        )
        if view is None or reason is not None:
            raise UnsupportedTableFeatureError(
                f"cannot append to {self._location.uri}: it has identity columns (writer "
                f"feature {IDENTITY_FEATURE}), which only the sink's own log writer commits "
                f"(delta-rs refuses them), and it cannot here: {reason}. Nothing was "
                "committed; write this table with delta-spark."
            )
        return view

    def _append_to_identity_table(self, committable: DeltaCommittable) -> None:
        """Commit the epoch's files to a table with identity columns through the log writer:
        adds, txn, and the ``metaData`` advancing the marks of the columns whose values the
        batch generated (tagged as delta-spark tags such commits). A commit that lands first
        is checked as Delta's rules say: a change of the marks alone is re-checked against the
        values written (:func:`~committers.delta.table._identity.advanced_metadata`), any
        other rule change fails the batch (``_check_plan``).

        Raises:
            IdentityRangeTakenError: another writer generated values in this batch's range.
            CommitConflictError, UnsupportedTableFeatureError, SchemaMismatchError: as
                ``_check_plan``; or every attempt lost its race.
            OSError and storage errors: the outcome is unknown (the caller reconciles).
        """
        assert self._appender is not None
        epoch = committable.epoch
        shape = self._plan.shape
        physical = {f.name: f.physical_name for f in shape.schema.fields}
        partition_keys = {
            name: physical[name] if shape.column_mapping else name for name in shape.partition_by
        }
        properties = self._commit_properties(committable)
        adds = [add_entry(f) for f in committable.files]
        txn = None if epoch.one_off else (epoch.app_id, epoch.epoch_id)
        for _ in range(IDENTITY_COMMIT_ATTEMPTS):
            view = self._identity_view()
            replayed = txn is not None and view.txns.get(epoch.app_id, -1) >= epoch.epoch_id
            if replayed and self._holds(self.table(), epoch):
                return
            self._check_plan(shape_of(view), epoch)
            metadata = advanced_metadata(
                view.metadata,
                self._plan.generated_identity,
                committable.files,
                partition_keys,
                self._location.uri,
            )
            tags = None if metadata is None else {IDENTITY_TAG: "true"}
            crash_point("commit_write", epoch.epoch_id, within_seconds=0.005)
            commit_for = functools.partial(
                _identity_commit_lines,
                adds,
                txn=txn,
                custom_metadata=properties.custom_metadata or {},
                partition_by=view.metadata.get("partitionColumns") or [],
                metadata_action=metadata,
                tags=tags,
            )
            try:
                outcome = self._appender.append(
                    _append_identity(epoch), commit_for, metadata=metadata
                )
            except AppendConflict as conflict:  # re-read and re-check on the newer version
                log.info("%s meets a concurrent commit: %s", _described(epoch), conflict)
                continue
            crash_point("commit_written", epoch.epoch_id)
            self._maintenance.committed(outcome.version, view.configuration)
            self._remember(committable, version=outcome.version)
            return
        raise CommitConflictError(
            f"{_described(epoch)} lost {IDENTITY_COMMIT_ATTEMPTS} commit races in a row on "
            f"{self._location.uri} to commits that changed its metadata; nothing was "
            "committed and restarting is safe."
        )


def _identity_commit_lines(adds: list[dict[str, Any]], now_ms: int, **keywords: Any) -> bytes:
    """:func:`commit_lines` with the time last (what the log writer calls it with)."""
    return commit_lines(adds, now_ms=now_ms, **keywords)


def _append_identity(epoch: Epoch) -> AppendIdentity:
    """Who the epoch's commit is, for the log writer's conflict rules."""
    return AppendIdentity(
        epoch.app_id,
        epoch.epoch_id,
        epoch.run_id,
        epoch.writer_identity,
        app_key=COMMIT_APP_ID,
        epoch_key=None if epoch.one_off else COMMIT_EPOCH_ID,
        run_key=COMMIT_RUN_ID,
    )


def _described(epoch: Epoch) -> str:
    if epoch.one_off:
        return f"the write {epoch.run_id} (without app id)"
    return f"batch {epoch.epoch_id} of app id {epoch.app_id!r}"


def _key(epoch: Epoch) -> tuple[str, str, int]:
    return (epoch.app_id, epoch.writer_identity, epoch.epoch_id)


#: How long ``close()`` lets due log maintenance (a checkpoint) finish.
MAINTENANCE_CLOSE_WAIT = 60.0


def _operation_parameters(
    epoch: Epoch, replace_where: ReplaceWhere | None, rewrite: Rewrite | None = None
) -> dict[str, str]:
    """delta-spark's STREAMING UPDATE parameters, or a replaceWhere's ``predicate`` as the
    text given (as delta-spark and delta-rs record a WRITE's; merged into delta-rs's own
    ``mode``); an upsert's ``upsertKeys``. A one-off epoch has no id."""
    if epoch.bounded:
        parameters = {} if epoch.one_off else {"epochId": str(epoch.epoch_id)}
        if replace_where is not None:
            parameters["predicate"] = replace_where.text
    else:
        parameters = {"outputMode": epoch.output_mode.capitalize(), "epochId": str(epoch.epoch_id)}
        if epoch.query_id is not None:
            parameters["queryId"] = epoch.query_id
    if rewrite is not None and rewrite.keys:
        parameters["upsertKeys"] = json.dumps(list(rewrite.keys))
    return parameters


def _check_still_live(table: DeltaTable, location: TableLocation, rewrite: Rewrite) -> None:
    """Every file ``rewrite`` replaces is live in ``table``'s snapshot (where the commit, made
    with ``max_commit_retries=0``, lands right on top), with the deletion vector it was read
    with: a file given a new vector meanwhile had rows deleted since (the logical file is the
    path and the vector, PROTOCOL.md).

    Raises:
        _StaleRewrite: naming the files another commit removed or deleted rows of.
    """
    gone = files_gone(table, [f.logged_path for f in rewrite.replaced])
    if not gone and rewrite.replaced and rewrite.read_version != table.version():
        now = table_deletion_vectors(location, reader_features(table)[1], table.version())
        gone = [
            f.logged_path
            for f in rewrite.replaced
            if unique_id(now.get(f.path)) != unique_id(f.deletion_vector)
        ]
    if gone:
        raise _StaleRewrite(
            f"{len(gone)} of the {len(rewrite.replaced)} files it rewrites were removed or "
            f"had rows deleted by another commit after version {rewrite.read_version} (e.g. "
            f"{gone[:3]}), so it was computed on rows that have changed since."
        )
