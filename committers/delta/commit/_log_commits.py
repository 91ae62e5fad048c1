"""Commits the sink writes straight into the log (moved out of ``_committer``): blind appends
(adds and a txn, without a snapshot: the commit stays flat as history grows) and appends to
tables with identity columns, which delta-rs refuses (see
:class:`~committers.delta.commit._committer.DeltaGlobalCommitter`, which mixes
:class:`LogCommits` in)."""

from __future__ import annotations

import functools
import logging
from typing import Any

from deltalake import DeltaTable

from committers.delta.commit._change_data_commit import add_entry
from committers.delta.commit._commit_rules import CommitRules
from committers.delta.commit._log_append import (
    AppendConflict,
    AppendIdentity,
    LogAppender,
    LogView,
    adds_columns,
    commit_lines,
    shape_of,
    unsupported_by_append,
)
from committers.delta.commit._log_maintenance import LogMaintenance
from committers.delta.table._identity import (
    IDENTITY_FEATURE,
    IDENTITY_TAG,
    advanced_metadata,
    high_water_marks,
)
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._table import COMMIT_APP_ID, COMMIT_EPOCH_ID, COMMIT_RUN_ID
from committers.delta.write._committable import DeltaCommittable
from framework.connector import crash_point
from framework.errors import CommitConflictError
from framework.sink import Epoch

__all__ = ["IDENTITY_COMMIT_ATTEMPTS", "LogCommits", "described", "epoch_key"]

log = logging.getLogger("committers.delta")

#: Re-checks of an identity table's commit against concurrent metadata changes (each one a
#: commit that landed first, e.g. another writer's identity values).
IDENTITY_COMMIT_ATTEMPTS = 16


class LogCommits(CommitRules):
    """The log writer's commits of the Delta global committer (with the commitInfo and checks
    of :class:`CommitRules`), mixed into
    :class:`~committers.delta.commit._committer.DeltaGlobalCommitter`, which defines the
    attributes and the methods declared here."""

    _appender: LogAppender | None
    _maintenance: LogMaintenance
    _probed_for: tuple[str, str, int] | None

    def table(self) -> DeltaTable | None:
        raise NotImplementedError

    def _holds(self, table: DeltaTable | None, epoch: Epoch) -> bool:
        raise NotImplementedError

    def _remember(self, committable: DeltaCommittable, version: int | None) -> None:
        raise NotImplementedError

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
        self._probed_for = epoch_key(epoch)
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
        probed, self._probed_for = self._probed_for == epoch_key(epoch), None
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
                log.info("%s meets a concurrent commit: %s", described(epoch), conflict)
                continue
            crash_point("commit_written", epoch.epoch_id)
            self._maintenance.committed(outcome.version, view.configuration)
            self._remember(committable, version=outcome.version)
            return
        raise CommitConflictError(
            f"{described(epoch)} lost {IDENTITY_COMMIT_ATTEMPTS} commit races in a row on "
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


def described(epoch: Epoch) -> str:
    """The epoch as errors and logs name it."""
    if epoch.one_off:
        return f"the write {epoch.run_id} (without app id)"
    return f"batch {epoch.epoch_id} of app id {epoch.app_id!r}"


def epoch_key(epoch: Epoch) -> tuple[str, str, int]:
    """What the committer keys an epoch's state by."""
    return (epoch.app_id, epoch.writer_identity, epoch.epoch_id)
