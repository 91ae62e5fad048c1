"""Rewrites that delta-rs cannot spell, written straight into the log.

A logical file of a table with deletion vectors is its path *and* its vector: a ``remove``
that names the path without the vector does not remove it (PROTOCOL.md, "Add File and Remove
File": the primary key is ``(path, deletionVector.uniqueId)``), so delta-spark would keep the
file and its rows would be doubled by the rewrite's copies. delta-rs 1.6's ``RemoveAction``
has no deletion vector, so a rewrite that removes a file with a vector (a compaction, an
upsert, a replace_where) is committed here instead: the same commit delta-rs would write for
``create_write_transaction(removes + adds, mode="append")`` (commitInfo, removes, adds, txn;
:func:`~committers.delta.commit._log_append.commit_lines`), with each remove carrying its
file's vector, written at exactly the version after the snapshot with put-if-absent
(:class:`~committers.delta.commit._log_store.LogStore`). A version taken by another writer
raises ``CommitFailedError``, as delta-rs does with ``max_commit_retries=0``, so the caller's
commit sequence re-checks on a fresh snapshot and tries again.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from committers.delta.commit._log_append import commit_lines
from committers.delta.commit._log_maintenance import checkpoint_interval
from committers.delta.commit._log_store import LogStore, json_line
from committers.delta.commit._row_tracking import row_ids
from committers.delta.read._row_lineage import assigns_row_ids
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor
from committers.delta.table._protocol import (
    UnsupportedTableFeatureError,
    recorded_in_commit_timestamp,
    uses_in_commit_timestamps,
)
from committers.delta.table._table import delta_rs_path

__all__ = [
    "needs_log_rewrite",
    "next_in_commit_timestamp",
    "put_log_commit",
    "remove_entry",
    "write_log_rewrite",
]


def needs_log_rewrite(
    actions: Sequence[AddAction | RemoveAction],
    vectors: Mapping[str, DeletionVectorDescriptor] | None,
) -> bool:
    """Whether ``actions`` remove a file that has a deletion vector (``vectors``: decoded
    path -> its vector), which delta-rs cannot write."""
    return bool(vectors) and any(
        isinstance(a, RemoveAction) and a.path in vectors  # type: ignore[operator]
        for a in actions
    )


def write_log_rewrite(
    table: DeltaTable,
    location: TableLocation,
    actions: Sequence[AddAction | RemoveAction],
    vectors: Mapping[str, DeletionVectorDescriptor],
    *,
    partition_by: Sequence[str],
    commit_properties: CommitProperties,
    post_commit: PostCommitHookProperties,
    mode: str = "Append",
) -> int:
    """Commit ``actions`` at the version after ``table``'s (see the module docstring); the
    version written. ``vectors``: the vectors of the files removed (decoded path -> vector);
    ``mode``: the WRITE's mode its commitInfo records.

    Raises:
        CommitFailedError: another writer took that version; nothing was written.
        OSError: the outcome of the write is unknown (the caller reconciles).
    """
    version = table.version() + 1
    now = int(time.time() * 1000)
    removes = [
        remove_entry(
            delta_rs_path(a.path),
            data_change=a.data_change,
            deletion_timestamp=a.deletion_timestamp,
            size=a.size,
            partition_values=a.partition_values,
            vector=vectors.get(a.path),
        )
        for a in actions
        if isinstance(a, RemoveAction)
    ]
    adds = [
        {
            "path": a.path,
            "partitionValues": dict(a.partition_values),
            "size": a.size,
            "modificationTime": a.modification_time,
            "dataChange": a.data_change,
            "stats": a.stats,
        }
        for a in actions
        if isinstance(a, AddAction)
    ]
    put_log_commit(
        location,
        table,
        adds=adds,
        removes=removes,
        properties=commit_properties,
        partition_by=partition_by,
        now_ms=now,
        mode=mode,
        needs="it removes files with deletion vectors (their remove must name the vector), or "
        "delta-rs does not commit to the table",
    )
    interval = checkpoint_interval(table.metadata().configuration)
    if post_commit.create_checkpoint and version % interval == 0:
        table.update_incremental()
        table.create_checkpoint()
    return version


def put_log_commit(
    location: TableLocation,
    table: DeltaTable,
    *,
    adds: Sequence[Mapping[str, Any]],
    removes: Sequence[Mapping[str, Any]],
    properties: CommitProperties,
    partition_by: Sequence[str],
    now_ms: int,
    cdc: Sequence[Mapping[str, Any]] = (),
    metadata_action: Mapping[str, Any] | None = None,
    mode: str = "Append",
    needs: str,
) -> int:
    """Write the version after ``table``'s snapshot, and return it: the commitInfo and txn of
    ``properties`` (at most one txn),
    ``removes`` and ``adds`` as :func:`~committers.delta.commit._log_append.commit_lines`
    spells them, then ``cdc`` actions (``metadata_action`` and ``mode`` as there); put-if-absent,
    the one writer of the commits delta-rs cannot write (deletion vectors here, change files in
    :mod:`._change_data_commit`, a replaced schema and partitioning in
    :mod:`._schema_replacement`, commits to tables delta-rs refuses in ``_sequence``).
    ``needs`` says why the commit cannot go through delta-rs, for the refusal below. What
    the table's features ask of every commit is added: an in-commit timestamp
    (:func:`next_in_commit_timestamp`), row ids (:mod:`._row_tracking`).

    Raises:
        UnsupportedTableFeatureError: the table's storage is neither local nor S3, the only
            stores the log writer commits to, or row ids cannot be assigned (see
            :func:`~._row_tracking.row_ids`); nothing was written.
        CommitFailedError: another writer took that version; nothing was written.
        OSError: the outcome of the write is unknown (the caller reconciles).
    """
    if not LogStore.supports(location):
        raise UnsupportedTableFeatureError(
            f"cannot commit the rewrite of {location.uri}: {needs}, which delta-rs cannot "
            "commit, and the sink's own log writer writes only to local and S3 tables. "
            "Nothing was committed."
        )
    txns = properties.app_transactions or []
    if len(txns) > 1:
        raise ValueError("a rewrite carries at most one txn")
    store = LogStore(location)
    version = table.version() + 1
    configuration = table.metadata().configuration
    tracked = row_ids(location, version, adds, removes) if assigns_row_ids(table) else None
    data = commit_lines(
        adds if tracked is None else tracked.adds,
        removes=removes if tracked is None else tracked.removes,
        in_commit_timestamp=(
            next_in_commit_timestamp(store, version, now_ms)
            if uses_in_commit_timestamps(configuration)
            else None
        ),
        txn=(txns[0].app_id, txns[0].version) if txns else None,
        custom_metadata=dict(properties.custom_metadata or {}),
        partition_by=partition_by,
        now_ms=now_ms,
        metadata_action=metadata_action,
        mode=mode,
        domains=() if tracked is None or tracked.domain is None else [tracked.domain],
        tags=None if tracked is None else tracked.tags,
    )
    data += "".join(json_line({"cdc": dict(entry)}) for entry in cdc).encode()
    if not store.put_if_absent(f"{version:020d}.json", data):
        raise CommitFailedError(
            f"version {version} of {location.uri} was written by another writer first"
        )
    return version


def next_in_commit_timestamp(store: LogStore, version: int, now_ms: int) -> int:
    """The ``inCommitTimestamp`` of commit ``version`` written at ``now_ms``: ``now_ms``, or
    one millisecond after the previous commit's when that one is not older (another writer's
    clock ahead of ours): PROTOCOL.md, "In-Commit Timestamps", makes them strictly
    increasing."""
    previous = store.read(f"{version - 1:020d}.json") if version > 0 else None
    stamp = None if previous is None else recorded_in_commit_timestamp(previous)
    return now_ms if stamp is None else max(now_ms, stamp + 1)


def remove_entry(
    logged_path: str,
    *,
    data_change: bool,
    deletion_timestamp: int,
    size: int | None,
    partition_values: Mapping[str, str | None] | None,
    vector: DeletionVectorDescriptor | None = None,
) -> dict[str, object]:
    """A ``remove`` action of the file the log names ``logged_path`` (with its vector, if it
    has one: the logical file is the path and the vector)."""
    entry: dict[str, object] = {
        "path": logged_path,
        "dataChange": data_change,
        "deletionTimestamp": deletion_timestamp,
        "extendedFileMetadata": partition_values is not None and size is not None,
        "partitionValues": dict(partition_values or {}),
        "size": size,
    }
    if vector is not None:
        entry["deletionVector"] = vector.to_json()
    return entry
