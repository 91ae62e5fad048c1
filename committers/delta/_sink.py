"""DeltaSink: the user-facing exactly-once Delta Lake destination."""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

import pyarrow as pa

from committers.delta._committable import DeltaCommittable, StagedFile, StagedFileSerializer
from committers.delta._committer import DeltaGlobalCommitter
from committers.delta._options import (
    DEFAULT_COMPRESSION,
    DEFAULT_MAX_OPEN_FILES,
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_FILE_SIZE,
    WriterOptions,
)
from committers.delta._s3safety import verify_conditional_put
from committers.delta._schema import (
    SchemaMode,
    check_partition_columns,
    merge_schemas,
    normalize_schema,
)
from committers.delta._storage import TableLocation
from committers.delta._table import open_or_create, remove_orphan_files, table_schema
from committers.delta._writer import DeltaStagingWriter
from framework.errors import ConfigurationError, SinkError
from framework.sink import Sink, WriterContext

__all__ = ["DeltaSink"]

DEFAULT_ORPHAN_RETENTION = datetime.timedelta(days=7)
DEFAULT_TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}


def _check_app_id(app_id: str | None) -> None:
    if app_id is None:
        return
    if not isinstance(app_id, str) or not app_id.strip():
        raise ConfigurationError(f"app_id must be a non-empty string or None, got {app_id!r}")
    if any(ord(c) < 32 for c in app_id):
        raise ConfigurationError(f"app_id must not contain control characters: {app_id!r}")


class DeltaSink(Sink[pa.RecordBatch, StagedFile, DeltaCommittable]):
    """Exactly-once writes into a Delta Lake table, one Delta transaction per batch.

    Args:
        table_uri: local path, ``file://`` URL or any fsspec URL (``s3://bucket/path``).
        app_id: identity recorded with every commit as ``txn(app_id, batch_id)``. Keep it
            stable for one query and unique across queries writing the same table. ``None``
            derives it from the streaming query's id, which is stable across restarts from the
            same checkpoint.
        partition_by: partition columns (must be columns of the input).
        storage_options: one set of options for staging (fsspec) and the log (delta-rs), e.g.
            ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``.
        schema_mode: ``"strict"`` (input must match the table) or ``"merge"`` (new nullable
            columns are added to the table).
        target_file_size, row_group_bytes, row_group_rows, max_open_files, compression:
            shape of staged Parquet files (see ``WriterOptions``).
        table_configuration: Delta table properties used when the sink creates the table.
        unsafe_skip_conditional_put_check: skip the S3 self-test that proves the store rejects
            a second conditional PUT. Without that guarantee concurrent commits can overwrite
            each other and lose data; only for stores known to be safe.

    Raises:
        ConfigurationError: an option is invalid (at construction, nothing written).
    """

    def __init__(
        self,
        table_uri: str,
        *,
        app_id: str | None = None,
        partition_by: Sequence[str] = (),
        storage_options: Mapping[str, str] | None = None,
        schema_mode: SchemaMode = "strict",
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        compression: str = DEFAULT_COMPRESSION,
        table_configuration: Mapping[str, str] | None = None,
        unsafe_skip_conditional_put_check: bool = False,
    ) -> None:
        if not isinstance(table_uri, str) or not table_uri:
            raise ConfigurationError(f"table_uri must be a non-empty string, got {table_uri!r}")
        _check_app_id(app_id)
        if isinstance(partition_by, str):
            partition_by = [partition_by]
        partition_by = list(partition_by)
        if len(set(partition_by)) != len(partition_by):
            raise ConfigurationError(f"partition_by lists a column twice: {partition_by}")
        if schema_mode not in ("strict", "merge"):
            raise ConfigurationError(
                f"schema_mode must be 'strict' or 'merge', got {schema_mode!r}"
            )
        self.app_id = app_id
        self.partition_by = partition_by
        self.schema_mode: SchemaMode = schema_mode
        self.location = TableLocation.of(table_uri, storage_options)
        self.options = WriterOptions(
            target_file_size=target_file_size,
            row_group_bytes=row_group_bytes,
            row_group_rows=row_group_rows,
            max_open_files=max_open_files,
            compression=compression,
        )
        # Delta-Spark's checkpoint interval (delta-rs defaults to 100): shorter log replays keep
        # per-commit cost flat. Only applies to tables this sink creates.
        self.table_configuration = {**DEFAULT_TABLE_CONFIGURATION, **(table_configuration or {})}
        self.unsafe_skip_conditional_put_check = unsafe_skip_conditional_put_check
        self._input_schema: pa.Schema | None = None
        self._table_schema: pa.Schema | None = None

    @property
    def table_uri(self) -> str:
        return self.location.uri

    def prepare(self, input_schema: pa.Schema) -> None:
        """Validate the input schema and create the table (empty) if it does not exist.

        Raises:
            UnsupportedTypeError, SchemaMismatchError: the input cannot be written.
            NotATableError, LocationNotWritableError, UnsafeStorageError: the location is unusable.
        """
        schema = normalize_schema(input_schema)
        check_partition_columns(schema, self.partition_by)
        # S3 only (a no-op elsewhere); with the override it logs a loud warning instead.
        verify_conditional_put(self.location, skip=self.unsafe_skip_conditional_put_check)
        table = open_or_create(self.location, schema, self.partition_by, self.table_configuration)
        self._table_schema = merge_schemas(table_schema(table), schema, self.schema_mode)
        self._input_schema = schema

    def _prepared(self) -> tuple[pa.Schema, pa.Schema]:
        if self._input_schema is None or self._table_schema is None:
            raise SinkError("DeltaSink.prepare(schema) must run before writers are created")
        return self._input_schema, self._table_schema

    def create_writer(self, context: WriterContext) -> DeltaStagingWriter:
        _, table = self._prepared()
        return DeltaStagingWriter(context, self.location, table, self.partition_by, self.options)

    def create_global_committer(self) -> DeltaGlobalCommitter:
        schema, _ = self._prepared()
        return DeltaGlobalCommitter(
            self.location,
            partition_by=self.partition_by,
            schema=schema,
            schema_mode=self.schema_mode,
        )

    def committable_serializer(self) -> StagedFileSerializer:
        return StagedFileSerializer()

    def remove_orphan_files(
        self,
        *,
        retention: datetime.timedelta = DEFAULT_ORPHAN_RETENTION,
        dry_run: bool = False,
        unsafe_allow_short_retention: bool = False,
    ) -> list[str]:
        """Delete files under the table root that no table version references and that are
        older than ``retention``; return their paths relative to the table root.

        Committed files (referenced by any commit or checkpoint still in the log) are never
        deleted. See ``committers.delta._table.remove_orphan_files``.
        """
        return remove_orphan_files(
            self.location,
            retention_seconds=retention.total_seconds(),
            dry_run=dry_run,
            unsafe_allow_short_retention=unsafe_allow_short_retention,
        )

    def __repr__(self) -> str:
        return (
            f"DeltaSink({self.location.uri!r}, app_id={self.app_id!r}, "
            f"partition_by={self.partition_by!r})"
        )
