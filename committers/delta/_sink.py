"""DeltaSink: the user-facing exactly-once Delta Lake destination."""

from __future__ import annotations

import datetime
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import pyarrow as pa
from deltalake import DeltaTable

from committers.delta._sink_options import (
    DELTA_SPARK_SPELLINGS,
    check_app_id,
    check_schema_mode,
    check_table_configuration,
    resolved_upsert_spec,
    resolved_writer_options,
)
from committers.delta.commit._auto_compact import AutoCompactor
from committers.delta.commit._clustering import (
    check_cluster_by,
    check_clustering_kept,
    planned_clustering,
)
from committers.delta.commit._committer import DeltaGlobalCommitter
from committers.delta.commit._compact import CompactionResult, PartitionFilter, compact_table
from committers.delta.commit._log_store import LogStore
from committers.delta.commit._vacuum import vacuum_table
from committers.delta.spark._s3a import prepare_s3a, require_s3a
from committers.delta.spark._spark_staging import SparkParquetStager, hadoop_can_write
from committers.delta.spark._upsert import UpsertStager
from committers.delta.spark._upsert_marks import DeletionVectorMode, check_deletion_vector_mode
from committers.delta.spark._upsert_plan import (
    UPSERT_UNDER_CONNECT,
    UpsertPlan,
    check_upsert_table,
    classic_session,
    plan_upsert,
)
from committers.delta.storage._s3safety import verify_conditional_put
from committers.delta.storage._storage import (
    CredentialIdentity,
    ResolvedCredentials,
    TableLocation,
)
from committers.delta.table._delta_schema import walk
from committers.delta.table._identity import with_generated_values
from committers.delta.table._protocol import check_appends_only, check_replaceable
from committers.delta.table._replace_where import ReplaceWhere, with_replace_where
from committers.delta.table._rules import TableShape, WritePlan, plan_write
from committers.delta.table._schema import (
    SINK_SPELLING,
    OptionSpelling,
    SchemaMode,
    check_column_names,
    check_partition_columns,
    normalize_schema,
)
from committers.delta.table._schema_overwrite import replaced_shape
from committers.delta.table._table import bytes_per_row, open_table, remove_orphan_files
from committers.delta.write._auto_compact import AutoCompact, check_auto_compact
from committers.delta.write._committable import DeltaCommittable, StagedFile, StagedFileSerializer
from committers.delta.write._options import (
    DEFAULT_COMPRESSION,
    DEFAULT_MAX_OPEN_FILES,
    DEFAULT_ROW_GROUP_BYTES,
    DEFAULT_ROW_GROUP_ROWS,
    DEFAULT_TARGET_FILE_SIZE,
    DEFAULT_UPLOAD_CONCURRENCY,
    DEFAULT_UPLOAD_PART_SIZE,
    Staging,
    WriterOptions,
    check_staging,
)
from committers.delta.write._upsert_spec import UpsertSpec
from committers.delta.write._writer import DeltaStagingWriter
from framework.connector import refuse_unknown_options
from framework.errors import ConfigurationError, SchemaMismatchError, SinkError
from framework.sink import InputPlan, OutputMode, Sink, WriterContext
from framework.spark.connector import is_connect_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("committers.delta")
WriteMode = Literal["append", "overwrite", "upsert"]

__all__ = ["DeltaSink"]

DEFAULT_ORPHAN_RETENTION = datetime.timedelta(days=7)
_UPSERT_READS = "mode='upsert' rewrites files with Spark's own Parquet reader and writer"
DEFAULT_TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}


class DeltaSink(Sink[pa.RecordBatch, StagedFile, DeltaCommittable]):
    """Exactly-once writes into a Delta Lake table, one Delta transaction per batch.

    Args:
        table_uri: local path, ``file://`` URL or any fsspec URL (``s3://bucket/path``).
        app_id: identity recorded with every commit as ``txn(app_id, batch_id)``. Keep it
            stable for one query and unique across queries writing the same table. ``None``
            derives it from the streaming query's id, which is stable across restarts from the
            same checkpoint.
        partition_by: partition columns of a table the sink creates (columns of the input).
            An existing table keeps its own partitioning: leave this out or repeat it.
        cluster_by: up to 4 columns of the input a table the sink creates is clustered by
            (liquid clustering: no partitions; ``compact()`` and delta-spark's ``OPTIMIZE``
            cluster by them). An existing table keeps its own clustering: leave this out or
            repeat it.
        storage_options: one set of options for staging (fsspec) and the log (delta-rs), e.g.
            ``AWS_ENDPOINT_URL``, ``AWS_REGION``, ``AWS_ACCESS_KEY_ID``.
        schema_mode: ``"strict"`` (input must match the table), ``"merge"`` (new nullable
            columns are added to the table) or, with ``mode="overwrite"``, ``"overwrite"``
            (delta-spark's ``overwriteSchema``: the table's schema becomes the input's and its
            partitioning ``partition_by``, in the transaction that replaces its rows; see
            ``table/_schema_overwrite.py``).
        target_file_size, row_group_bytes, row_group_rows, max_open_files, compression:
            shape of staged Parquet files (see ``WriterOptions``).
        upload_part_size, upload_concurrency: S3 uploads of the ``"arrow"`` staging: bytes
            per multipart part (5 MiB to 5 GiB) and parts in flight per task.
        writer_options: all of the above as one :class:`WriterOptions` value, instead of the
            keywords (giving both a keyword other than its default and ``writer_options`` is
            refused).
        table_configuration: Delta table properties used when the sink creates the table
            (column mapping excluded: create such tables first, the sink writes into them).
        staging: who writes the Parquet files. ``"spark"``: Spark's own Parquet writer (rows
            stay in the JVM; fastest); ``"arrow"``: the sink's Python writers in
            ``mapInArrow`` tasks, through fsspec; ``"auto"`` (default): ``"spark"`` where
            Spark's Hadoop file system can write the table's URI (a local path always,
            another scheme if its Hadoop FileSystem class loads: ``s3://`` as ``s3a://``
            with hadoop-aws, configured from ``storage_options``) and the table does not use
            column mapping, ``"arrow"`` otherwise. Both give the same guarantees. With
            ``mode="upsert"``: Spark writes the new rows, and with ``"auto"`` Python tasks
            rewrite the touched files' kept rows (``"spark"``: Spark does, ``"arrow"`` is
            refused).
        user_metadata: text recorded in the commitInfo of every commit (delta-spark's
            ``userMetadata`` writer option), shown by ``DeltaTable.history()`` and
            ``DESCRIBE HISTORY``; ``write(df, user_metadata=...)`` and
            ``write_stream(..., user_metadata=...)`` override it.
        mode: ``"append"`` (default) adds the rows; ``"overwrite"`` (bounded ``write(df)``
            only) replaces, in the same single transaction, every row the table holds, or
            with ``replace_where`` only the rows it matches; ``"upsert"`` applies each
            batch as changes by ``keys`` (insert, update, or delete with ``delete_when``),
            rewriting the files that hold the keys in Spark tasks, one transaction per batch (see
            ``_upsert.py`` and docs/delta.md#upserts).
        replace_where: with ``mode="overwrite"``, a predicate on the table's columns (e.g.
            ``"day = '2026-11-21'"``, ``"is_even = true"``; see ``_replace_where.py`` for what
            it accepts): the rows it holds TRUE for are replaced by the written rows, which
            must all satisfy it, else the write fails with nothing committed. On data columns
            the files holding matching rows are rewritten without them, before the commit
            (Python tasks with pyarrow; Spark's reader and writer with ``staging="spark"``).
        keys: with ``mode="upsert"`` (required there): the columns that identify a row.
        sequence_by: with ``mode="upsert"``: the column (or columns, compared left to right)
            ordering the changes of one key: the highest of a batch wins, and it applies only
            if it is not older than the row the table holds (a column the table must store).
            Without it, a key may appear once per batch.
        delete_when: with ``mode="upsert"``: a Spark SQL predicate over the batch's columns
            marking a change as a delete (e.g. ``"op = 'D'"``); columns it reads that the
            table lacks are not written.
        partial_updates: with ``mode="upsert"``: the input may lack table columns; an updated
            row keeps its stored values of them (an inserted row gets NULL). Off by default:
            an input lacking a table column is refused.
        deletion_vectors: with ``mode="upsert"``, and ``mode="overwrite"`` with a
            ``replace_where`` on data columns: ``"auto"`` (default) marks the rows a batch
            replaces in deletion vectors, writing only its new rows (merge-on-read, as
            delta-spark's ``MERGE`` and ``replaceWhere``), where the table enables them
            (``delta.enableDeletionVectors=true``) and is on local or S3 storage; ``"off"``
            always rewrites the files holding them (copy-on-write).
        upsert: with ``mode="upsert"``: ``keys``, ``sequence_by``, ``delete_when`` and
            ``partial_updates`` as one ``UpsertSpec`` value
            (``committers.delta.write.UpsertSpec``), instead of the keywords.
        auto_compact: compact the table's small files after a batch's commit, in the driver
            before the next batch (see ``_auto_compact`` and docs/delta.md#auto-compaction):
            ``None`` (default) for streaming writes only, ``True`` for every write, ``False``
            never, or an ``AutoCompact`` (``committers.delta.write.AutoCompact``) with
            delta-spark's thresholds: ``min_num_files`` small files (50) in a partition,
            small meaning under ``min_file_size`` (half of ``max_file_size``), compacted into
            files of ``max_file_size`` (the sink's ``target_file_size``).
        unsafe_skip_conditional_put_check: skip the S3 self-test that proves the store rejects
            a second conditional PUT. Without that guarantee concurrent commits can overwrite
            each other and lose data; only for stores known to be safe.

    Raises:
        ConfigurationError: an option is invalid (at construction, nothing written).
    """

    #: How errors name this sink's options (the ``"deltalake"`` format's writer spells them
    #: as ``.option(...)`` names).
    option_spelling: ClassVar[OptionSpelling] = SINK_SPELLING

    def __init__(
        self,
        table_uri: str,
        *,
        app_id: str | None = None,
        partition_by: Sequence[str] = (),
        cluster_by: Sequence[str] | None = None,
        storage_options: Mapping[str, str] | None = None,
        schema_mode: SchemaMode | Literal["overwrite"] = "strict",
        target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
        row_group_bytes: int = DEFAULT_ROW_GROUP_BYTES,
        row_group_rows: int = DEFAULT_ROW_GROUP_ROWS,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        compression: str = DEFAULT_COMPRESSION,
        upload_part_size: int = DEFAULT_UPLOAD_PART_SIZE,
        upload_concurrency: int = DEFAULT_UPLOAD_CONCURRENCY,
        writer_options: WriterOptions | None = None,
        table_configuration: Mapping[str, str] | None = None,
        staging: Staging = "auto",
        user_metadata: str | None = None,
        mode: WriteMode = "append",
        replace_where: str | None = None,
        keys: Sequence[str] | None = None,
        sequence_by: str | Sequence[str] | None = None,
        delete_when: str | None = None,
        partial_updates: bool = False,
        upsert: UpsertSpec | None = None,
        deletion_vectors: DeletionVectorMode = "auto",
        unsafe_skip_conditional_put_check: bool = False,
        auto_compact: bool | AutoCompact | None = None,
        **unknown: object,
    ) -> None:
        refuse_unknown_options(
            "DeltaSink", unknown, DELTA_SPARK_SPELLINGS, inspect.signature(DeltaSink).parameters
        )
        if not isinstance(table_uri, str) or not table_uri:
            raise ConfigurationError(f"table_uri must be a non-empty string, got {table_uri!r}")
        check_app_id(app_id)
        if isinstance(partition_by, str):
            partition_by = [partition_by]
        partition_by = list(partition_by)
        if len(set(partition_by)) != len(partition_by):
            raise ConfigurationError(f"partition_by lists a column twice: {partition_by}")
        check_staging(staging)
        self.staging: Staging = staging
        self._logged_staging = False
        check_schema_mode(schema_mode, mode, replace_where)
        self.app_id = app_id
        self.partition_by = partition_by
        self.cluster_by = check_cluster_by(cluster_by, partition_by)
        self._creates_clustered: list[str] = []  # set by prepare(): a new table's clustering
        self.replaces_schema = schema_mode == "overwrite"
        # (an overwritten schema is the input's: the rows are then planned strictly)
        self.schema_mode: SchemaMode = "merge" if schema_mode == "merge" else "strict"
        self.location = TableLocation.of(table_uri, storage_options)
        self.options = resolved_writer_options(
            writer_options,
            target_file_size=target_file_size,
            row_group_bytes=row_group_bytes,
            row_group_rows=row_group_rows,
            max_open_files=max_open_files,
            compression=compression,
            upload_part_size=upload_part_size,
            upload_concurrency=upload_concurrency,
        )
        # Delta-Spark's checkpoint interval (delta-rs defaults to 100): shorter log replays keep
        # per-commit cost flat. Only applies to tables this sink creates.
        self.table_configuration = {**DEFAULT_TABLE_CONFIGURATION, **(table_configuration or {})}
        check_table_configuration(self.table_configuration)
        if user_metadata is not None and not isinstance(user_metadata, str):
            raise ConfigurationError(f"user_metadata must be a string, got {user_metadata!r}")
        self.user_metadata = user_metadata
        if mode not in ("append", "overwrite", "upsert"):
            raise ConfigurationError(
                f"mode must be 'append', 'overwrite' or 'upsert', got {mode!r}"
            )
        if replace_where is not None and mode != "overwrite":
            raise ConfigurationError("replace_where needs mode='overwrite'")
        self._upsert_spec = resolved_upsert_spec(
            mode, upsert, keys, sequence_by, delete_when, partial_updates
        )
        if self._upsert_spec is not None and staging == "arrow":
            raise ConfigurationError(
                "mode='upsert' computes each batch's changes and writes its new rows with "
                "Spark (the table's rules are Spark SQL), which staging='arrow' cannot. Use "
                "staging='auto' (Python tasks rewrite the kept rows of the files it touches) "
                "or 'spark' (Spark's reader and writer do all of it)."
            )
        check_deletion_vector_mode(deletion_vectors)
        self.deletion_vectors: DeletionVectorMode = deletion_vectors
        self._upsert: UpsertPlan | None = None
        self.mode: WriteMode = mode
        self.replace_where = None if replace_where is None else ReplaceWhere.parse(replace_where)
        self.unsafe_skip_conditional_put_check = unsafe_skip_conditional_put_check
        self.auto_compact = check_auto_compact(auto_compact)
        self.auto_compact.sizes(self.options.target_file_size)  # refused now, not per batch
        self._input_schema: pa.Schema | None = None
        self._driver_identity: CredentialIdentity | None = None
        self._bytes_per_row: float | None = None
        self._plan: WritePlan | None = None
        # The handle prepare() opened, until the committer created after it takes it over.
        self._opened: tuple[DeltaTable, ResolvedCredentials | None] | None = None
        # The committer created last here: an upsert's batch plans on the snapshot its replay
        # check loaded.
        self._committer: DeltaGlobalCommitter | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_opened"] = None  # a delta-rs handle stays in the process that opened it
        state["_committer"] = None
        return state

    @property
    def output_modes(self) -> frozenset[OutputMode]:  # type: ignore[override]
        """Streaming output modes; none for ``mode="overwrite"``, which is for bounded writes
        (a stream that replaces the table each batch is ``output_mode="complete"``); only
        ``"append"`` for ``mode="upsert"`` (each batch holds changes, not the whole table)."""
        if self.mode == "overwrite":
            return frozenset()
        if self.mode == "upsert":
            return frozenset({"append"})
        return frozenset({"append", "complete"})

    @property
    def table_shape(self) -> TableShape:
        """The table as :meth:`prepare` planned the write into it (schema, partitioning,
        rules); a table the first commit creates included."""
        return self._prepared()[1].shape

    @property
    def table_uri(self) -> str:
        return self.location.uri

    @property
    def destination(self) -> str:
        return self.location.uri

    def prepare(self, input_schema: pa.Schema) -> None:
        """Validate the input against the table (or the table it will create) and plan the
        rows' checks and layout. Nothing is created: a new table is created by the first
        commit, together with its data.

        Raises:
            InvalidSchemaError, UnsupportedTypeError, SchemaMismatchError: the input cannot be
                written (checked before anything else, storage included).
            UnsupportedTableFeatureError: the table needs a writer feature the sink cannot
                honour.
            NotATableError, LocationNotWritableError, UnsafeStorageError: the location is
                unusable.
            ConfigurationError: for ``mode="upsert"``, also when this process has no classic
                Spark, Spark cannot write the table's storage, or ``delete_when`` is not a
                deterministic predicate over the input (see ``spark/_upsert_plan.py``).
        """
        check_column_names(input_schema)
        schema = normalize_schema(input_schema)
        session = None if self._upsert_spec is None else self._upsert_session()
        # S3 only (a no-op elsewhere); with the override it logs a loud warning instead.
        verify_conditional_put(self.location, skip=self.unsafe_skip_conditional_put_check)
        credentials = None
        if self.location.is_s3:  # what the executors' credentials are checked against
            credentials = self.location.resolve_credentials()
            self._driver_identity = credentials.identity
        table = open_table(self.location, credentials)
        # The committer created next starts from this handle: a (re)start opens the table once.
        self._opened = None if table is None else (table, credentials)
        self._bytes_per_row = None if table is None else bytes_per_row(table)
        existing = None if table is None else TableShape.of_table(table)
        if session is not None:
            if existing is not None:  # a feature we cannot honour first, then the input
                existing.features.check_writable(self.location.uri)
                check_appends_only(existing.features, self.location.uri, "mode='upsert'")
            self._upsert, schema = self._plan_upsert(session, schema, table)
        if existing is None or self.replaces_schema:
            spelled = {name.lower(): name for name in schema.names}  # names match ignoring case
            partition_by = [spelled.get(name.lower(), name) for name in self.partition_by]
            check_partition_columns(schema, partition_by, self.option_spelling)
            if table is None:
                shape = TableShape.for_new_table(schema, partition_by)
            else:
                shape = replaced_shape(table, schema, partition_by)
        else:
            shape = existing
            table_partitioning = [name.lower() for name in shape.partition_by]
            if self.partition_by and table_partitioning != [n.lower() for n in self.partition_by]:
                option = self.option_spelling.partition_by
                raise SchemaMismatchError(
                    f"table {self.location.uri} is partitioned by "
                    f"{list(shape.partition_by) or 'nothing'}, but the write asks for "
                    f"{option}={self.partition_by}. Use the table's partitioning (or leave "
                    f"{option} out)."
                )
        if table is not None and self.mode == "overwrite":
            check_appends_only(shape.features, self.location.uri, "mode='overwrite'")
        self._creates_clustered = planned_clustering(
            self.location, table is not None, schema, self.cluster_by, self.table_configuration
        )
        if table is not None and self.replaces_schema and "clustering" in shape.features:
            check_clustering_kept(self.location, schema, dict(shape.configuration))
        plan = plan_write(shape, schema, self.schema_mode, self.location.uri, self.option_spelling)
        if table is not None and self.mode == "overwrite":
            check_replaceable(dict(shape.configuration), self.location.uri, "mode='overwrite'")
        if self.replace_where is not None:
            plan, self.replace_where = with_replace_where(
                plan,
                self.replace_where,
                self.location.uri,
                log_writable=LogStore.supports(self.location),
            )
        if self._upsert is not None:
            check_upsert_table(
                self._upsert,
                plan,
                table,
                self.location.uri,
                log_writable=LogStore.supports(self.location),
            )
        self._plan = plan
        self._input_schema = schema
        if self._committer is not None:  # prepared again after a StaleStagingError
            self._opened = None
            replace_where = self.replace_where if self.mode == "overwrite" else None
            self._committer.replan(plan, schema, replace_where)

    def _upsert_session(self) -> SparkSession:
        """The classic SparkSession an upsert runs on, once Spark can write the table's storage
        (checked before the storage is contacted).

        Raises:
            ConfigurationError: no classic Spark in this process, or no Hadoop file system for
                the table's URI scheme.
        """
        session = classic_session()
        if session is None:
            raise ConfigurationError(UPSERT_UNDER_CONNECT)
        if not hadoop_can_write(session.range(0), self.location.uri):
            raise ConfigurationError(
                f"mode='upsert' rewrites files with Spark's own Parquet reader and writer, "
                f"and Spark has no Hadoop file system for {self.location.uri} here (s3:// "
                "without hadoop-aws, say). Use a URI Spark can write (s3a:// with hadoop-aws "
                "on the classpath), or delta-rs's DeltaTable.merge()."
            )
        require_s3a(session, self.location, _UPSERT_READS)
        return session

    def _plan_upsert(
        self, session: SparkSession, schema: pa.Schema, table: DeltaTable | None
    ) -> tuple[UpsertPlan, pa.Schema]:
        """The upsert's plan and the schema of the columns it writes (see ``plan_upsert``)."""
        assert self._upsert_spec is not None
        shape = None if table is None else TableShape.of_table(table)
        return plan_upsert(
            session, self._upsert_spec, schema, shape, self.location.uri, self.schema_mode
        )

    def _prepared(self) -> tuple[pa.Schema, WritePlan]:
        if self._input_schema is None or self._plan is None:
            raise SinkError("DeltaSink.prepare(schema) must run before writers are created")
        return self._input_schema, self._plan

    def input_plan(self) -> InputPlan | None:
        """The table's rules; ``None`` for ``mode="upsert"``, whose stager applies them to the
        rows it writes, after reducing the batch to one change per key."""
        if self._upsert is not None:
            return None
        return self._prepared()[1].input_plan

    def batch_input_plan(self, df: DataFrame) -> InputPlan | None:
        """:meth:`input_plan`, with the values of the identity columns the input lacks
        reserved for the batch ``df``: beyond each column's high-water mark as the committer
        reads it now (after the batch's replay check), spread over ``df``'s partitions (see
        ``table/_identity.py``; the commit re-checks the mark).

        Raises:
            ConfigurationError: ``df`` is a Spark Connect DataFrame (its partition count is
                not known here), for a table whose identity values must be generated.
            UnsupportedTableFeatureError: the committer cannot write the table's log itself.
        """
        plan = self.input_plan()
        generated = self._prepared()[1].generated_identity
        if plan is None or not generated:
            return plan
        if is_connect_dataframe(df):
            raise ConfigurationError(
                f"{self.location.uri} has identity columns ({', '.join(c.name for c in generated)}"
                ") whose values the sink generates per partition of each batch, and a Spark "
                "Connect DataFrame does not tell its partitions. Write with a classic "
                "SparkSession, or give the values (GENERATED BY DEFAULT columns only)."
            )
        if self._committer is None:
            raise SinkError("create_global_committer() must run before a batch is planned")
        marks = self._committer.identity_marks()
        return with_generated_values(plan, generated, marks, df.rdd.getNumPartitions())

    def create_writer(self, context: WriterContext) -> DeltaStagingWriter:
        """A staging writer for one task.

        Raises:
            ConfigurationError: on S3, this process resolves no credentials or other
                long-lived keys than the driver (see
                :meth:`CredentialIdentity.check_same_principal`).
        """
        _, plan = self._prepared()
        if self._driver_identity is not None:
            identity = self.location.resolve_credentials().identity
            identity.check_same_principal(self._driver_identity, self.location.uri)
        return DeltaStagingWriter(context, self.location, plan.layout, self.options)

    def spark_stager(self, df: DataFrame) -> SparkParquetStager | UpsertStager | None:
        """Spark's Parquet writer for batches like ``df``, per ``staging`` (None: the Python
        writers stage them); for ``mode="upsert"`` the stager that rewrites files by key.

        Raises:
            ConfigurationError: ``staging="spark"`` (or ``mode="upsert"``) where Spark cannot
                write this table, e.g. a Spark Connect DataFrame.
        """
        _, plan = self._prepared()
        if self._upsert is not None:
            if is_connect_dataframe(df):
                raise ConfigurationError(UPSERT_UNDER_CONNECT)
            if not hadoop_can_write(df, self.location.uri):
                raise ConfigurationError(
                    f"mode='upsert' cannot write {self.location.uri} from this DataFrame: the "
                    "upsert rewrites files with Spark's own Parquet reader and writer, and "
                    "Spark has no Hadoop file system for this URI here. Use a URI Spark can "
                    "write, or delta-rs's DeltaTable.merge()."
                )
            committer = self._committer
            require_s3a(df.sparkSession, self.location, _UPSERT_READS)
            return UpsertStager(
                self.location,
                plan,
                self._upsert,
                self.options,
                self._bytes_per_row,
                self.staging,
                snapshot=None if committer is None else committer.snapshot,
                deletion_vectors=self.deletion_vectors,
            )
        if self.staging == "arrow":
            return None
        problem = None
        if any(len(path) > 1 and not f.nullable for path, f in walk(plan.shape.schema)):
            # Spark writes such a field as optional, with nulls under null parents, and
            # deltalake's pyarrow reader then refuses the file.
            problem = "the table has NOT NULL fields inside structs"
        elif self.location.is_s3 and not is_connect_dataframe(df):
            problem = prepare_s3a(df.sparkSession, self.location)
        elif not hadoop_can_write(df, self.location.uri):
            problem = (
                "Spark has no Hadoop file system for this URI here (or this is a Spark "
                "Connect session)"
            )
        if problem and self.staging == "spark":
            raise ConfigurationError(
                f"staging='spark' cannot write {self.location.uri}: {problem}. Use "
                "staging='arrow' or 'auto'."
            )
        if not self._logged_staging:
            self._logged_staging = True
            log.info(
                "DeltaSink %s stages with %s",
                self.location.uri,
                f"Python writers ({problem})" if problem else "Spark's Parquet writer",
            )
        if problem:
            return None
        return SparkParquetStager(self.location, plan.layout, self.options, self._bytes_per_row)

    def create_global_committer(self) -> DeltaGlobalCommitter:
        schema, plan = self._prepared()
        opened, self._opened = self._opened, None
        self._committer = DeltaGlobalCommitter(
            self.location,
            opened=opened,
            plan=plan,
            input_schema=schema,
            schema_mode=self.schema_mode,
            table_configuration=self.table_configuration,
            cluster_by=self._creates_clustered,
            user_metadata=self.user_metadata,
            replace_where=self.replace_where if self.mode == "overwrite" else None,
            deletion_vectors=self.deletion_vectors,
            overwrite=self.mode == "overwrite",
            replaces_schema=self.replaces_schema,
            rewrite_options=self.options,
            staging=self.staging,
            spelling=self.option_spelling,
            auto_compactor=AutoCompactor(
                self.location,
                self.auto_compact,
                target_file_size=self.options.target_file_size,
                compression=self.options.compression,
                staging=self.staging,
                user_metadata=self.user_metadata,
                skip_conditional_put_check=self.unsafe_skip_conditional_put_check,
            ),
        )
        return self._committer

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
        deleted. See ``committers.delta.table._table.remove_orphan_files``.
        """
        return remove_orphan_files(
            self.location,
            retention_seconds=retention.total_seconds(),
            dry_run=dry_run,
            unsafe_allow_short_retention=unsafe_allow_short_retention,
        )

    def vacuum(
        self,
        *,
        retention: datetime.timedelta | None = None,
        dry_run: bool = True,
        unsafe_allow_short_retention: bool = False,
    ) -> list[str]:
        """Delete the files the table no longer needs, as delta-spark's ``VACUUM`` does;
        return their paths relative to the table root. **A dry run by default**: pass
        ``dry_run=False`` to delete.

        Deleted: files the table removed (an overwrite, an upsert, a compaction) longer ago
        than ``retention``, and files no version references (what :meth:`remove_orphan_files`
        deletes), each also older than ``retention``. Every version within ``retention`` stays
        readable (time travel), files of the current version are never deleted, and the
        removal of files the snapshot lists as removed is recorded in the log
        (``VACUUM START``/``VACUUM END``). See ``committers.delta.commit._vacuum``.

        Args:
            retention: default: the table's ``delta.deletedFileRetentionDuration`` (7 days if
                not set).
            dry_run: only list (the default).
            unsafe_allow_short_retention: allow a retention shorter than the table's, or than
                one hour: only when nothing reads older versions and no writer is running.

        Raises:
            NotATableError: no Delta table at the sink's location.
            ConfigurationError: a retention the table forbids, without the override.
            DestinationError: a table with v2 checkpoints, or storage errors.
        """
        report = vacuum_table(
            self.location,
            retention_seconds=None if retention is None else retention.total_seconds(),
            dry_run=dry_run,
            unsafe_allow_short_retention=unsafe_allow_short_retention,
        )
        return [f.path for f in report.files]

    def compact(
        self,
        spark: SparkSession,
        *,
        partition_filter: PartitionFilter | None = None,
        target_file_size: int | None = None,
    ) -> CompactionResult:
        """Rewrite the table's small files into files of about ``target_file_size`` bytes
        (default: the sink's), in Spark tasks (with pyarrow in Python tasks, or with Spark's
        own reader and writer under ``staging="spark"``), committed as one ``dataChange=false``
        transaction without a txn. Safe while writers append; see
        ``committers.delta.commit._compact`` and docs/delta.md#compaction.

        Args:
            spark: the classic SparkSession whose tasks rewrite the files.
            partition_filter: delta-rs partition filters, e.g. ``[("day", "=", "2026-11-21")]``,
                on partition columns only; ``None`` compacts every partition.
            target_file_size: bytes per output file (at least 1 MiB).

        Returns:
            A :class:`~committers.delta.commit._compact.CompactionResult`; its ``version`` is
            ``None`` when there was nothing to compact (no commit).

        Raises:
            See :func:`committers.delta.commit._compact.compact_table`.
        """
        return compact_table(
            spark,
            self.location,
            target_file_size=(
                self.options.target_file_size if target_file_size is None else target_file_size
            ),
            partition_filter=partition_filter,
            compression=self.options.compression,
            staging=self.staging,
            user_metadata=self.user_metadata,
            skip_conditional_put_check=self.unsafe_skip_conditional_put_check,
        )

    def __repr__(self) -> str:
        return (
            f"DeltaSink({self.location.uri!r}, app_id={self.app_id!r}, "
            f"partition_by={self.partition_by!r}"
            + (f", cluster_by={self.cluster_by!r}" if self.cluster_by else "")
            + (f", mode={self.mode!r}" if self.mode != "append" else "")
            + (f", replace_where={self.replace_where.text!r}" if self.replace_where else "")
            + (f", keys={list(self._upsert_spec.keys)!r}" if self._upsert_spec else "")
            + ")"
        )
