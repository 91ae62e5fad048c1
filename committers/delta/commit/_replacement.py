"""The commit side of an overwrite with ``replace_where`` (moved out of ``_committer``):
which files its commit removes, the rewrite of those holding matching rows, and the commit
itself (see :class:`~committers.delta.commit._committer.DeltaGlobalCommitter`, which mixes
:class:`ReplacementCommits` in)."""

from __future__ import annotations

import json
import logging
import time
import warnings
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from committers.delta.commit._change_data_commit import live_removes
from committers.delta.commit._sequence import (
    POST_COMMIT,
    delta_rs_commits,
    files_gone,
    write_transaction,
)
from committers.delta.spark._replace_rewrite import replace_rows
from committers.delta.spark._upsert_marks import DeletionVectorMode
from committers.delta.spark._upsert_plan import classic_session
from committers.delta.storage._storage import TableLocation
from committers.delta.table._change_feed import writes_change_data
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor
from committers.delta.table._live_vectors import table_deletion_vectors, vectors_changed
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._replace_where import FileClassifier, ReplaceWhere
from committers.delta.table._rules import TableShape, WritePlan
from committers.delta.table._schema import serialize_partition_value
from committers.delta.table._snapshot import reader_features
from committers.delta.table._table import removal_path
from committers.delta.write._committable import (
    DeltaCommittable,
    Rewrite,
    StagedFile,
    StagedRewrite,
)
from committers.delta.write._options import Staging, WriterOptions
from framework.errors import DestinationError
from framework.sink import Epoch

__all__ = ["ReplacementCommits", "check_still_live"]

log = logging.getLogger("committers.delta")


class ReplacementCommits:
    """The ``replace_where`` part of the Delta global committer, mixed into
    :class:`~committers.delta.commit._committer.DeltaGlobalCommitter`, which defines the
    attributes and the methods declared here."""

    _location: TableLocation
    _plan: WritePlan
    _replace_where: ReplaceWhere | None
    _rewrite_options: WriterOptions
    _staging: Staging
    _deletion_vectors: DeletionVectorMode

    def snapshot(self) -> DeltaTable | None:
        raise NotImplementedError

    def _commit_properties(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _write_with_changes(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def _rewrites_rows(self) -> bool:
        where = self._replace_where
        return where is not None and not where.on_partitions_only

    def _replaced_rows(
        self, epoch: Epoch, new_files: list[StagedFile], *, attempt: int
    ) -> StagedRewrite:
        """``new_files`` with the kept rows of the files the overwrite rewrites on the
        newest snapshot; it can be redone once (``attempt`` 1, into a new directory)."""
        assert self._replace_where is not None
        table = self.snapshot()
        if table is None:  # the commit creates the table: nothing to replace
            return StagedRewrite(new_files, rewrite=Rewrite(read_version=None))
        kept, rewrite = replace_rows(
            self._location,
            table,
            self._replace_where,
            self._rewrite_options,
            epoch,
            attempt=attempt,
            staging=self._staging,
            session=classic_session(),
            new_files=new_files,
            deletion_vectors=self._deletion_vectors,
        )
        redo = None
        if attempt == 0:
            redo = lambda: self._replaced_rows(epoch, new_files, attempt=1)  # noqa: E731
        return StagedRewrite([*new_files, *kept], rewrite=rewrite, redo=redo)

    def _write_replacement(
        self,
        table: DeltaTable,
        committable: DeltaCommittable,
        adds: list[AddAction | RemoveAction],
    ) -> None:
        """The commit of an overwrite with ``replace_where``: its adds, and the removes of
        the files it replaces in ``table``'s snapshot (:meth:`_files_replaced`), landing
        right on top of that snapshot.

        When the removed files are exactly the files of some partitions (always so for a
        ``replace_where`` on partition columns), delta-rs's own overwrite removes them, so
        the history records ``mode: Overwrite`` as delta-spark and delta-rs do; otherwise
        (part of a partition rewritten, or of an unpartitioned table) the removes are
        explicit actions, which delta-rs 1.6 accepts in an append only, recorded as
        ``mode: Append``. The predicate is recorded either way.
        """
        removed, deleted, vectors = self._files_replaced(table, committable.rewrite)
        rewrite = committable.rewrite
        if rewrite is not None and (rewrite.change_files or rewrite.marked):  # delta-rs cannot
            by_logged_path = {f["path"]: vectors[path] for path, f in removed if path in vectors}
            logged = live_removes(table, [f["path"] for _, f in removed], by_logged_path)
            self._write_with_changes(table, committable, logged, deleted_rows=deleted)
            return
        # A file with a vector is removed by name, with its vector: delta-rs's overwrite cannot;
        # so is every file of a table delta-rs does not commit to.
        by_name = vectors or not delta_rs_commits(table)
        filters = None if by_name else self._overwrite_filters(table, removed)
        now = int(time.time() * 1000)
        removes: list[AddAction | RemoveAction] = [
            RemoveAction(path, True, now, f["size_bytes"]) for path, f in removed
        ]
        read_version = table.version()
        write_transaction(
            table,
            adds if filters is not None else [*removes, *adds],
            mode="append" if filters is None else "overwrite",
            partition_by=self._plan.shape.partition_by,
            partition_filters=filters or None,
            commit_properties=self._commit_properties(
                committable, removed_files=len(removed), retries=0, deleted_rows=deleted
            ),
            post_commit=POST_COMMIT,
            location=self._location,
            vectors=vectors,
        )
        if filters is not None:  # (retries=0: it is the next version, or it raised)
            self._check_removed(read_version + 1, {unquote(f["path"]) for _, f in removed})

    def _check_removed(self, version: int, intended: set[str]) -> None:
        """The commit at ``version``, whose removes delta-rs's overwrite derived from its
        partition filters, removed exactly the ``intended`` files (decoded paths): the
        filters were checked against delta-rs's file selection beforehand, through another
        of its functions, so this confirms that both select alike.

        Raises:
            DestinationError: they differ; the commit stands (a removed file is still on
                storage, so its rows can be added back), the message names the files.
        """
        path = self._location.path(f"_delta_log/{version:020d}.json")
        try:
            with self._location.filesystem().open(path, "rb") as handle:
                actions = [json.loads(line) for line in handle.read().splitlines() if line]
        except (OSError, ValueError) as err:  # the commit stands either way: no verdict
            log.warning("could not read back version %s of %s: %s", version, path, err)
            return
        removed = {unquote(a["remove"]["path"]) for a in actions if "remove" in a}
        if removed != intended:
            raise DestinationError(
                f"the overwrite committed version {version} of {self._location.uri}, and "
                "delta-rs's overwrite removed other files than the replace_where selects: "
                f"also {sorted(removed - intended)[:5]}, not {sorted(intended - removed)[:5]}. "
                "The commit stands and removed files stay on storage; add back the rows of "
                "those removed wrongly (read them with versionAsOf) and report this."
            )

    def _files_replaced(
        self, table: DeltaTable, rewrite: Rewrite | None
    ) -> tuple[list[tuple[str, dict[str, Any]]], int, dict[str, DeletionVectorDescriptor]]:
        """The live files of ``table``'s snapshot the overwrite removes, each as the path a
        ``RemoveAction`` takes and its row of ``get_add_actions(flatten=True)``: those whose
        partition values make ``replace_where`` TRUE, and those ``rewrite`` replaced; the live
        rows they delete, as far as the log counts them; and the deletion vectors of those
        that have one (by that path: their removes must name them).

        Raises:
            _StaleRewrite: a live file that may hold matching rows was not read by ``rewrite``
                (another writer added it since): the rewrite must be computed again.
            UnsupportedTableFeatureError: a file to remove is logged in a spelling delta-rs
                cannot reproduce in a remove (another writer encoded it differently): the
                overwrite could not remove it, so it is refused.
        """
        assert self._replace_where is not None
        shape = TableShape.of_table(table)
        where = self._replace_where.bind(
            shape.arrow_schema(), self._location.uri, shape.partition_by
        )
        classify = FileClassifier(where, shape)
        # Change files (data predicates only) must report the rows of whole files too.
        feed = writes_change_data(shape.configuration) and not where.on_partitions_only
        replaced = {f.logged_path for f in rewrite.replaced} if rewrite else set()
        examined = replaced | set(rewrite.unchanged if rewrite else ())
        removed, unread = [], []
        deleted = rewrite.metrics.get("numDeletedRows", 0) if rewrite else 0
        vectors = table_deletion_vectors(self._location, reader_features(table)[1], table.version())
        for f in pa.table(table.get_add_actions(flatten=True)).to_pylist():
            if f["path"] in replaced:
                removed.append(f)
                continue
            outcome = classify(f)
            if outcome == "all" and not (feed and f["path"] not in examined):
                removed.append(f)
                vector = vectors.get(unquote(f["path"]))
                deleted += (f.get("num_records") or 0) - (vector.cardinality if vector else 0)
            elif outcome != "none" and f["path"] not in examined:
                unread.append(f["path"])  # (with change files, whole files are read too)
        if unread:
            since = rewrite.read_version if rewrite else None
            raise _StaleRewrite(
                f"{len(unread)} files that may hold rows it replaces were added by another "
                f"commit after version {since} (e.g. {unread[:3]}), so they were not read."
            )
        removals = []
        for f in removed:
            path = removal_path(f["path"])
            if path is None:
                raise UnsupportedTableFeatureError(
                    f"cannot overwrite {self._location.uri} where {where.text}: "
                    f"the log spells file {f['path']!r} in a URL encoding delta-rs cannot "
                    "write in a remove action, so the file would stay. Nothing was "
                    "committed; rewrite the partition with the tool that wrote it."
                )
            removals.append((path, f))
        return removals, deleted, {p: vectors[p] for p, _ in removals if p in vectors}

    def _overwrite_filters(
        self, table: DeltaTable, removed: list[tuple[str, dict[str, Any]]]
    ) -> list[tuple[str, str, str | list[str]]] | None:
        """delta-rs partition filters (one conjunction: what its overwrite takes) under which
        its overwrite removes exactly ``removed`` from ``table``'s snapshot (``[]``: every
        file, no filter; empty ``in`` lists: none), or ``None`` when none does: part of a
        partition kept, part of an unpartitioned table (or none of it) removed, or delta-rs
        selecting other files than these (its ``= ''`` matches a NULL partition value logged
        as null, not one logged as ``""``; its ``in`` matches no NULL)."""
        partition_by = list(self._plan.shape.partition_by)
        if not partition_by:
            return [] if removed and len(removed) == len(table.file_uris()) else None
        values: dict[str, set[str]] = {c: set() for c in partition_by}
        for _, f in removed:
            for c in partition_by:
                value = serialize_partition_value(f.get(f"partition.{c}"))
                values[c].add("" if value is None else value)  # delta-rs's NULL, verified
        filters: list[tuple[str, str, str | list[str]]] = [
            (c, "=", next(iter(values[c]))) if len(values[c]) == 1 else (c, "in", sorted(values[c]))
            for c in partition_by
        ]
        with warnings.catch_warnings():  # (partition_filters is what its overwrite takes)
            warnings.simplefilter("ignore", DeprecationWarning)
            selected = table.file_uris(partition_filters=filters)
        chosen = {self._location.relative(u.split("://", 1)[-1]) for u in selected}
        return filters if chosen == {unquote(f["path"]) for _, f in removed} else None


class _StaleRewrite(Exception):
    """A file an upsert replaces is no longer live: the batch was computed on rows another
    writer has changed since. Never committed; handled by :meth:`_commit_one`."""


def check_still_live(table: DeltaTable, location: TableLocation, rewrite: Rewrite) -> None:
    """Every file ``rewrite`` replaces is live in ``table``'s snapshot (where the commit, made
    with ``max_commit_retries=0``, lands right on top), with the deletion vector it was read
    with: a file given a new vector meanwhile had rows deleted since (the logical file is the
    path and the vector, PROTOCOL.md).

    Raises:
        _StaleRewrite: naming the files another commit removed or deleted rows of.
    """
    gone = files_gone(table, [f.logged_path for f in rewrite.replaced])
    if not gone and rewrite.replaced and rewrite.read_version != table.version():
        gone = vectors_changed(
            location, reader_features(table)[1], table.version(), rewrite.replaced
        )
    if gone:
        raise _StaleRewrite(
            f"{len(gone)} of the {len(rewrite.replaced)} files it rewrites were removed or "
            f"had rows deleted by another commit after version {rewrite.read_version} (e.g. "
            f"{gone[:3]}), so it was computed on rows that have changed since."
        )
