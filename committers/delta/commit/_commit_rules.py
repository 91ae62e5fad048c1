"""What the Delta global committer's commits carry and check first (moved out of
``_committer``): the commitInfo (txn, the sink's keys, delta-spark's operation parameters and
metrics, the user's metadata) and the re-check, right before a commit, that the table still
asks for what the rows were staged under (schema merge included). Mixed into
:class:`~committers.delta.commit._committer.DeltaGlobalCommitter` as :class:`CommitRules`."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Field, Transaction

from committers.delta.commit._log_store import LogStore
from committers.delta.commit._schema_replacement import write_schema_evolution
from committers.delta.commit._sequence import delta_rs_commits
from committers.delta.storage._storage import TableLocation
from committers.delta.table._protocol import check_appends_only, check_replaceable
from committers.delta.table._replace_where import ReplaceWhere, with_replace_where
from committers.delta.table._rules import TableShape, WritePlan, evolved_shape, plan_write
from committers.delta.table._schema import OptionSpelling, SchemaMode, merge_schemas
from committers.delta.table._schema_overwrite import replaced_shape
from committers.delta.table._table import (
    COMMIT_APP_ID,
    COMMIT_EPOCH_ID,
    COMMIT_RUN_ID,
    COMMIT_WRITER,
)
from committers.delta.write._committable import DeltaCommittable, Rewrite
from framework.connector import crash_point
from framework.errors import StaleStagingError
from framework.sink import Epoch

__all__ = ["CommitRules"]

log = logging.getLogger("committers.delta")


class CommitRules:
    """The commitInfo and the pre-commit checks of the Delta global committer, mixed into
    :class:`~committers.delta.commit._committer.DeltaGlobalCommitter`, which defines the
    attributes and the method declared here."""

    _location: TableLocation
    _plan: WritePlan
    _input_schema: pa.Schema
    _schema_mode: SchemaMode
    _spelling: OptionSpelling
    _overwrite: bool
    _replaces_schema: bool
    _replace_where: ReplaceWhere | None
    _user_metadata: str | None

    def _replaces_all(self, epoch: Epoch) -> bool:
        raise NotImplementedError

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

    def _check_plan(self, shape: TableShape, epoch: Epoch) -> None:
        """Commit only if the table (``shape``, as it is now) still asks for exactly what the
        rows were staged under: after a constraint, feature or schema change since staging,
        nothing is committed.

        Raises:
            StaleStagingError: the table's rules changed (another writer's ALTER TABLE); the
                engine stages the batch again under the new rules (see :meth:`replan`), and
                rows that break them fail it then.
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
            current, _ = with_replace_where(
                current,
                self._replace_where,
                self._location.uri,
                log_writable=LogStore.supports(self._location),
            )
        staged = self._plan
        if (current.input_plan, current.layout) == (staged.input_plan, staged.layout):
            return
        raise StaleStagingError(
            f"the table {self._location.uri} changed while batch {epoch.epoch_id} of "
            f"{epoch.app_id!r} was being staged (its schema, constraints, generated columns, "
            "column mapping or features), so the staged rows were checked against rules that "
            "no longer hold. Nothing was committed."
        )

    def replan(
        self, plan: WritePlan, input_schema: pa.Schema, replace_where: ReplaceWhere | None
    ) -> None:
        """Commit the next epochs under ``plan`` (the sink's, prepared again against the table
        as it is now, after a :class:`StaleStagingError`)."""
        self._plan = plan
        self._input_schema = input_schema
        self._replace_where = replace_where

    def _check_replaceable(self, configuration: Mapping[str, str], epoch: Epoch) -> None:
        """Refuse an epoch that replaces the table's rows if the table is append-only.

        Raises:
            UnsupportedTableFeatureError: see :func:`check_replaceable`.
        """
        if self._overwrite:
            check_replaceable(configuration, self._location.uri, "mode='overwrite'")
        elif epoch.output_mode == "complete":
            check_replaceable(configuration, self._location.uri, "output_mode='complete'")

    def _shape_to_commit_to(self, table: DeltaTable) -> TableShape:
        """The table's shape the epoch commits under: its schema replaced by the input's
        (``schema_mode="overwrite"``), or evolved (:meth:`_evolve_schema`)."""
        if not self._replaces_schema:
            return self._evolve_schema(table)
        return replaced_shape(table, self._input_schema, self._plan.shape.partition_by)

    def _evolve_schema(self, table: DeltaTable) -> TableShape:
        """In merge mode, first add the input's new columns to the table (and, where it enables
        type widening, widen the columns the input holds wider); returns the table's shape
        after that.

        The change is its own metadata-only commit (delta-rs cannot attach a schema change to
        a write transaction): by delta-rs, or by the sink's log writer where delta-rs does not
        commit to the table or the change widens a type. It is idempotent: after a crash the
        columns exist (or are wide) and are not changed again; new columns are nullable and
        older files are read as the wider types, so no reader sees invalid data.
        """
        shape = TableShape.of_table(table)
        current = shape.arrow_schema()
        merged = merge_schemas(
            current,
            self._input_schema,
            self._schema_mode,
            shape.generated_columns,
            self._spelling,
            widening=shape.widens_types,
        )
        evolved = evolved_shape(shape, merged)
        if evolved is shape:
            return shape
        new_fields = [Field.from_arrow(f) for f in merged if f.name not in current.names]
        if delta_rs_commits(table) and not _retypes(current, merged):
            table.alter.add_columns(new_fields)
        else:
            write_schema_evolution(self._location, table, evolved)
        crash_point("schema_merge")
        table.update_incremental()
        log.info(
            "evolved the schema of %s: %s", self._location.uri, _schema_changes(current, merged)
        )
        return TableShape.of_table(table)


def _retypes(current: pa.Schema, merged: pa.Schema) -> list[str]:
    """The columns whose type the merge widened."""
    return [f.name for f in current if merged.field(f.name).type != f.type]


def _schema_changes(current: pa.Schema, merged: pa.Schema) -> str:
    added = [f.name for f in merged if f.name not in current.names]
    widened = [f"{name} to {merged.field(name).type}" for name in _retypes(current, merged)]
    return "; ".join(
        part
        for part in (
            f"added columns {added}" if added else "",
            f"widened {', '.join(widened)}" if widened else "",
        )
        if part
    )


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
