"""The commits that change a table's schema through the sink's log writer: a schema merge that
delta-rs cannot commit (:func:`write_schema_evolution`), and an overwrite that replaces the
table's schema and partitioning (``schema_mode="overwrite"``, see
``table/_schema_overwrite.py``): one log entry holding the new ``metaData``, the remove of
every live file (with its deletion vector), the adds of the epoch's files, its txn and a
``WRITE`` commitInfo in mode ``Overwrite``, as delta-spark's ``overwriteSchema`` writes it.

delta-rs 1.6 can replace the schema in an overwrite but not the partition columns, and not
the remove of a file with a deletion vector, so the sink's own log writer
(:func:`~committers.delta.commit._log_rewrite.put_log_commit`) writes it: at exactly the
version after the snapshot it read, or not at all (``CommitFailedError``, which the commit
sequence reconciles and retries on a fresh snapshot).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from deltalake import CommitProperties, DeltaTable

from committers.delta.commit._change_data_commit import add_entry, every_live_remove
from committers.delta.commit._log_rewrite import put_log_commit
from committers.delta.storage._storage import TableLocation
from committers.delta.table._rules import TableShape
from committers.delta.table._schema_overwrite import metadata_action
from committers.delta.write._committable import StagedFile

__all__ = ["write_schema_evolution", "write_schema_replacement"]


def write_schema_replacement(
    location: TableLocation,
    table: DeltaTable,
    shape: TableShape,
    adds: Sequence[StagedFile],
    properties: CommitProperties,
) -> int:
    """Commit ``adds`` as the whole table, under ``shape``'s schema, partitioning and
    configuration, as version ``table.version() + 1``; that version.

    Raises:
        UnsupportedTableFeatureError: the table is neither local nor on S3 (the only stores the
            log writer commits to); nothing was written.
        CommitFailedError: another commit took that version; nothing was written.
        OSError: the outcome is unknown (the caller reconciles by the txn or the run id).
    """
    read_version = table.version()
    now = int(time.time() * 1000)
    removes = [r.entry(now) for r in every_live_remove(table, location)]
    put_log_commit(
        location,
        table,
        adds=[add_entry(f) for f in adds],
        removes=removes,
        properties=properties,
        partition_by=shape.partition_by,
        now_ms=now,
        metadata_action=_metadata_action(table, shape),
        mode="Overwrite",
        needs="it replaces the table's schema and partitioning (schema_mode='overwrite')",
    )
    return read_version + 1


def write_schema_evolution(location: TableLocation, table: DeltaTable, shape: TableShape) -> int:
    """Commit ``shape``'s schema (the table's with columns added or widened by a schema
    merge) as a metadata-only version after ``table``'s, through the sink's log writer: for
    tables delta-rs does not commit to (row tracking, in-commit timestamps, clustering, type
    widening...), and for widenings, which delta-rs cannot record. That version.

    Raises:
        UnsupportedTableFeatureError: the table is neither local nor on S3; nothing written.
        CommitFailedError: another commit took that version; nothing was written.
        OSError: the outcome is unknown (a replay finds the schema already evolved or not).
    """
    put_log_commit(
        location,
        table,
        adds=[],
        removes=[],
        properties=CommitProperties(),
        partition_by=shape.partition_by,
        now_ms=int(time.time() * 1000),
        metadata_action=_metadata_action(table, shape),
        needs="it changes the table's schema (schema_mode='merge'), which delta-rs cannot "
        "commit to this table or cannot record (a type widening)",
    )
    return table.version() + 1


def _metadata_action(table: DeltaTable, shape: TableShape) -> dict[str, object]:
    """The ``metaData`` action giving ``table`` the schema, partitioning and configuration of
    ``shape``, its identity kept."""
    current = table.metadata()
    base = {
        "id": current.id,
        "name": current.name,
        "description": current.description,
        "createdTime": current.created_time,
    }
    return metadata_action(base, shape)
