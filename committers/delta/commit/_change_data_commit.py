"""The commit of a rewrite that carries change files (``cdc`` actions) or adds files back
with new deletion vectors (merge-on-read), written by the sink.

delta-rs 1.6's ``create_write_transaction`` takes add and remove actions only, so a commit
that must hold ``cdc`` actions in the same log entry as its removes and adds (PROTOCOL.md,
"Add CDC File": a reader of such a commit takes its changes from them alone) is written here,
through the one writer of such rewrites
(:func:`~committers.delta.commit._log_rewrite.put_log_commit`):
the commit delta-rs would write for the same removes, adds and txn (its ``WRITE`` commitInfo
with our keys, :func:`~committers.delta.commit._log_append.commit_lines`), plus one ``cdc``
action per change file. It lands at exactly the version after the snapshot it was computed on,
as every rewrite's commit does (delta-rs's ``max_commit_retries=0``): if another writer took
that version, nothing is written and ``CommitFailedError`` is raised, which the commit
sequence reconciles and retries on a fresh snapshot like delta-rs's own refusal.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable

from committers.delta.commit._log_rewrite import put_log_commit, remove_entry
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor
from committers.delta.table._live_vectors import table_deletion_vectors
from committers.delta.table._rules import TableShape
from committers.delta.table._schema import serialize_partition_value
from committers.delta.table._table import delta_rs_path
from committers.delta.write._committable import MarkedFile, StagedFile

__all__ = [
    "LoggedRemove",
    "add_entry",
    "every_live_remove",
    "live_removes",
    "write_commit_with_changes",
]


@dataclass(frozen=True)
class LoggedRemove:
    """A live file the commit removes, as the log spells it (``logged_path``, URL-encoded),
    with its size and partition values (so change readers can read its rows)."""

    logged_path: str
    size: int
    partition_values: Mapping[str, str | None]
    vector: DeletionVectorDescriptor | None = None  # (the logical file is path and vector)

    def entry(self, deletion_timestamp: int) -> dict[str, Any]:
        """Its ``remove`` action (``dataChange`` true), as the log writer takes it."""
        return remove_entry(
            self.logged_path,
            data_change=True,
            deletion_timestamp=deletion_timestamp,
            size=self.size,
            partition_values=self.partition_values,
            vector=self.vector,
        )


def add_entry(staged: StagedFile) -> dict[str, Any]:
    """The add action of ``staged`` for :func:`~committers.delta.commit._log_append.commit_lines`,
    with what :func:`~committers.delta.commit._sequence.add_action` gives delta-rs."""
    return {
        "path": staged.path,
        "partitionValues": dict(staged.partition_values),
        "size": staged.size,
        "modificationTime": staged.modification_time,
        "dataChange": True,
        "stats": staged.stats,
    }


def marked_entry(marked: MarkedFile) -> dict[str, Any]:
    """The add action re-adding ``marked`` with its new deletion vector."""
    return {
        "path": marked.path,
        "partitionValues": dict(marked.partition_values),
        "size": marked.size,
        "modificationTime": marked.modification_time,
        "dataChange": True,
        "stats": marked.stats,
        "deletionVector": marked.vector.to_json(),
    }


def live_removes(
    table: DeltaTable,
    logged_paths: Sequence[str],
    vectors: Mapping[str, DeletionVectorDescriptor] | None = None,
) -> list[LoggedRemove]:
    """:class:`LoggedRemove` of each of ``logged_paths``, live files of ``table``'s snapshot
    (their sizes and partition values as its add actions log them; their deletion vectors
    from ``vectors``, by logged path)."""
    actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    by_path = {a["path"]: a for a in actions}
    keys = partition_keys(table)
    return [
        LoggedRemove(
            logged_path=path,
            size=int(by_path[path]["size_bytes"]),
            partition_values=logged_partition_values(by_path[path], keys),
            vector=(vectors or {}).get(path),
        )
        for path in logged_paths
    ]


def every_live_remove(table: DeltaTable, location: TableLocation) -> list[LoggedRemove]:
    """:class:`LoggedRemove` of every live file of ``table``'s snapshot, each with its deletion
    vector: what an overwrite that removes the whole table by name commits."""
    live = pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()
    reader_features = table.protocol().reader_features or ()
    vectors = table_deletion_vectors(location, reader_features, table.version())
    by_logged_path = {p: vectors[unquote(p)] for p in live if unquote(p) in vectors}
    return live_removes(table, live, by_logged_path)


def partition_keys(table: DeltaTable) -> dict[str, str]:
    """Each partition column of ``table`` -> the key the log gives its values: its physical
    name under column mapping (PROTOCOL.md, "Column Mapping"), else its name."""
    shape = TableShape.of_table(table)
    return {c: shape.stored_name(c) for c in shape.partition_by}


def logged_partition_values(
    add: Mapping[str, Any], keys: Mapping[str, str]
) -> dict[str, str | None]:
    """The partition values of a live file (a row of ``get_add_actions(flatten=True)``, which
    names them by column) keyed as the log keys them (``keys``: :func:`partition_keys`)."""
    return {key: serialize_partition_value(add.get(f"partition.{c}")) for c, key in keys.items()}


def write_commit_with_changes(
    location: TableLocation,
    table: DeltaTable,
    *,
    adds: Sequence[StagedFile],
    removes: Sequence[LoggedRemove],
    change_files: Sequence[StagedFile],
    properties: CommitProperties,
    partition_by: Sequence[str],
    marked: Sequence[MarkedFile] = (),
) -> int:
    """Commit ``removes``, ``adds``, the re-adds of ``marked`` files with their new deletion
    vectors, the ``cdc`` actions of ``change_files`` and the txn and commitInfo of
    ``properties`` as version ``table.version() + 1``; that version.

    Raises:
        UnsupportedTableFeatureError: the table's storage is neither local nor S3 (the only
            stores the log writer can commit to); nothing was written.
        CommitFailedError: another commit took that version; nothing was written.
        OSError: the outcome is unknown (the caller reconciles by the txn or the run id).
    """
    version = table.version() + 1
    now = int(time.time() * 1000)
    removes_entries = [r.entry(now) for r in removes]
    cdc = [
        {
            "path": delta_rs_path(f.path),
            "partitionValues": dict(f.partition_values),
            "size": f.size,
            "dataChange": False,
        }
        for f in change_files
    ]
    put_log_commit(
        location,
        table,
        adds=[*(marked_entry(m) for m in marked), *(add_entry(f) for f in adds)],
        removes=removes_entries,
        cdc=cdc,
        properties=properties,
        partition_by=partition_by,
        now_ms=now,
        needs=(
            "its change data feed is on, and the commit must carry cdc actions"
            if change_files
            else "it adds files back with new deletion vectors"
        ),
    )
    return version
