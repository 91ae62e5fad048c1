"""How the Delta global committer writes an epoch's commit (moved out of ``_committer``): the
table's first commit with the epoch's files, and on an existing table the one transaction of
its append, overwrite, upsert or schema replacement, through delta-rs or the sink's log writer
(see :func:`~committers.delta.commit._sequence.write_transaction`). Mixed into
:class:`~committers.delta.commit._committer.DeltaGlobalCommitter` as :class:`EpochWrites`, which
the replace_where commits (:class:`ReplacementCommits`) build on."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from committers.delta.commit._change_data_commit import (
    LoggedRemove,
    add_entry,
    live_removes,
    write_commit_with_changes,
)
from committers.delta.commit._clustering import create_clustered_table
from committers.delta.commit._replacement import ReplacementCommits
from committers.delta.commit._schema_replacement import write_schema_replacement
from committers.delta.commit._sequence import POST_COMMIT, add_action, write_transaction
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor
from committers.delta.table._rules import WritePlan, new_table_schema
from committers.delta.write._committable import DeltaCommittable
from framework.sink import Epoch

__all__ = ["EpochWrites"]

log = logging.getLogger("committers.delta")


class EpochWrites(ReplacementCommits):
    """The writes of the Delta global committer's commits, mixed into
    :class:`~committers.delta.commit._committer.DeltaGlobalCommitter`, which defines the
    attributes and the methods declared here."""

    _location: TableLocation
    _plan: WritePlan
    _input_schema: pa.Schema
    _table_configuration: Mapping[str, str]
    _cluster_by: Sequence[str]
    _replaces_schema: bool

    def _replaces_all(self, epoch: Epoch) -> bool:
        raise NotImplementedError

    def _commits_exactly(self, committable: DeltaCommittable) -> bool:
        raise NotImplementedError

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
        if self._replaces_schema:
            write_schema_replacement(
                self._location,
                table,
                self._plan.shape,
                committable.files,
                self._commit_properties(
                    committable, removed_files=len(table.file_uris()), retries=0
                ),
            )
            return
        actions: list[AddAction | RemoveAction] = [add_action(f) for f in committable.files]
        replacing = self._replaces_all(epoch)
        if self._replace_where is not None:
            self._write_replacement(table, committable, actions)
            return
        rewrite = committable.rewrite
        if rewrite is not None and (rewrite.change_files or rewrite.marked):  # delta-rs cannot
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
            marked=committable.rewrite.marked,
            properties=self._commit_properties(
                committable, removed_files=len(removes), retries=0, deleted_rows=deleted_rows
            ),
            partition_by=self._plan.shape.partition_by,
        )

    def _create_with(self, committable: DeltaCommittable) -> bool:
        """Create the table with the epoch's files in ONE commit (protocol, metadata, adds and
        txn), so a failed first write leaves no table behind. Returns ``False`` if another
        writer created the table first (this epoch then appends to it)."""
        epoch = committable.epoch
        shape = self._plan.shape
        if self._cluster_by:
            return self._create_clustered_with(committable)
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

    def _create_clustered_with(self, committable: DeltaCommittable) -> bool:
        """:meth:`_create_with` for a table clustered by ``cluster_by`` (see ``_clustering``)."""
        epoch = committable.epoch
        properties = self._commit_properties(committable, retries=0)
        txns = properties.app_transactions or []
        created = create_clustered_table(
            self._location,
            DeltaSchema.from_arrow(new_table_schema(self._input_schema)),
            self._cluster_by,
            [add_entry(f) for f in committable.files],
            configuration=self._table_configuration,
            txn=(txns[0].app_id, txns[0].version) if txns else None,
            custom_metadata=properties.custom_metadata or {},
        )
        if not created:
            log.info("table %s was created concurrently; appending to it", self._location.uri)
            return False
        log.info(
            "created table %s clustered by %s with batch %s of %r",
            self._location.uri,
            list(self._cluster_by),
            epoch.epoch_id,
            epoch.app_id,
        )
        return True
