"""Rewrites in Python tasks: each group of files read with pyarrow and written as one file, the
rows never passing through the JVM. Compaction rewrites its bin-packed groups this way; an upsert
its touched files, each without the rows whose key the batch names.

Spark's own reader pays a task-side open, footer read and row conversion per file; for
thousands of small files that alone costs several times what the whole rewrite costs in
pyarrow (``benchmarks/compaction.py``). Here Spark only schedules the tasks, each rewriting
whole groups (one task per core, more for large rewrites: see :data:`TASK_BYTES`), and
each group becomes one file:

* each file is read as the table's logical schema by the snapshot source's reader
  (:class:`~committers.delta.read._source.DeltaFileReader`: rows its deletion vector deletes
  dropped, columns cast to the table's types, INT96
  and millisecond timestamps included; a column the file lacks is null; partition columns
  hold the group's values);
* an optional row filter (picklable) drops rows, batch by batch;
* the rows are written with the sink's Parquet settings (the layout's file schema, INT64
  timestamps, footer statistics, stats collected from the rows as the Python staging writer
  does) into ``<directory>/<partition dirs>/part-<group>-<uuid>.<codec>.parquet``;
* the partition values are the exact strings the log stores for the group;
* each group's task counts the rows it reads, the rows the filter drops and the rows it
  writes (:class:`GroupOutcome`); :func:`check_rows` holds the files to those counts: the
  files hold exactly the rows written, and those are the rows read less the rows dropped
  (``RowCountMismatchError`` otherwise).

The caller names ``directory`` in a staging manifest before any task starts, so a failed or
killed rewrite's files are found and deleted exactly as those of Spark's writer.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import random
import string
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa

from committers.delta.read._row_lineage import RowLineage, RowLineageReader
from committers.delta.read._source import DeltaFileReader, spell_partition_value, vector_metadata
from committers.delta.table._delta_schema import arrow_schema
from committers.delta.table._live_vectors import VectoredFile
from committers.delta.table._rules import FileLayout, TableShape
from committers.delta.table._schema import partition_dir, serialize_partition_value
from committers.delta.table._snapshot import Snapshot
from committers.delta.table._stats import FileStatsCollector
from committers.delta.write._committable import StagedFile, logged_records
from committers.delta.write._options import WriterOptions
from committers.delta.write._writer import parquet_writer
from framework.connector import check_row_count
from framework.errors import SinkError, StagingError
from framework.source import FileSplit
from framework.spark.connector import staging_job_group, translate_task_error, wait_for_tasks_to_end

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "GroupOutcome",
    "GroupRewriter",
    "GroupToRewrite",
    "Rewritten",
    "RowFilter",
    "alongside",
    "check_rows",
    "file_group",
    "in_tasks",
    "in_tasks_or_threads",
    "rewrite_groups",
    "rewriting",
]

T = TypeVar("T")

#: Bytes of input files per Spark task, beyond one task per core. A PySpark task costs some
#: 25 ms of its own (measured in local[2]), so small groups share tasks; large compactions
#: still get tasks small enough to retry cheaply.
TASK_BYTES = 512 * 1024 * 1024
#: Threads of a rewrite run without Spark.
_LOCAL_THREADS = 8

#: Keeps some rows of a table of the table's logical schema (pickled to the tasks).
RowFilter = Callable[[pa.Table], pa.Table]


VectorMetadata = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class GroupToRewrite:
    """One output file: its source files (paths relative to the table root, sizes) and the
    partition values as the log spells them; ``read_values``, the same as the reader spells
    them (:func:`~committers.delta.read._source.spell_partition_value`), when a row filter reads
    partition columns (without them, they read as null)."""

    index: int
    files: tuple[tuple[str, int], ...]
    partition_values: tuple[tuple[str, str | None], ...]
    read_values: tuple[tuple[str, str | None], ...] = ()
    #: path -> the ``FileSplit.metadata`` of its deletion vector, for files that have one.
    vectors: tuple[tuple[str, VectorMetadata], ...] = ()

    @property
    def size(self) -> int:
        """Bytes of its source files."""
        return sum(size for _, size in self.files)


def rewrite_vectors(files: Iterable[VectoredFile]) -> tuple[tuple[str, VectorMetadata], ...]:
    """:attr:`GroupToRewrite.vectors` of source ``files``: the vector of each that has one."""
    return tuple(
        (f.path, tuple(vector_metadata(f.deletion_vector).items()))
        for f in files
        if f.deletion_vector is not None
    )


def file_group(
    index: int, path: str, size: int, partition: Mapping[str, Any], shape: TableShape
) -> GroupToRewrite:
    """The group of one live file of a table of ``shape``, its typed ``partition`` values (by
    column name) spelled for the log (keyed by physical names under column mapping) and for
    the reader (so a row filter sees the partition columns)."""
    return GroupToRewrite(
        index=index,
        files=((path, size),),
        partition_values=tuple(
            (shape.stored_name(c), serialize_partition_value(v)) for c, v in partition.items()
        ),
        read_values=tuple((c, spell_partition_value(v)) for c, v in partition.items()),
    )


@dataclass(frozen=True)
class GroupOutcome:
    """One group's rewrite, from its task: the file written (``None``: no row kept) and the
    rows the task read, dropped (by the row filter) and wrote, as it counted them."""

    file: StagedFile | None
    rows_read: int
    rows_dropped: int
    rows_written: int


@dataclass(frozen=True)
class Rewritten:
    """What a rewrite staged: its files (one per group that kept a row, in no order) and the
    rows its tasks read, dropped and wrote."""

    files: list[StagedFile]
    rows_read: int = 0
    rows_dropped: int = 0
    rows_written: int = 0


def check_rows(what: str, outcomes: list[GroupOutcome]) -> Rewritten:
    """The rewrite of ``outcomes`` (``what`` names it in messages), once its files hold
    exactly the rows its tasks wrote, and those are the rows read less the rows dropped.

    Raises:
        RowCountMismatchError: naming both numbers.
    """
    rewritten = Rewritten(
        files=[o.file for o in outcomes if o.file is not None],
        rows_read=sum(o.rows_read for o in outcomes),
        rows_dropped=sum(o.rows_dropped for o in outcomes),
        rows_written=sum(o.rows_written for o in outcomes),
    )
    check_row_count(
        what,
        written=rewritten.rows_written,
        committed=sum(logged_records(f) for f in rewritten.files),
    )
    check_row_count(
        f"{what}, keeping {rewritten.rows_read} rows read less {rewritten.rows_dropped} dropped,",
        written=rewritten.rows_written,
        committed=rewritten.rows_read - rewritten.rows_dropped,
    )
    return rewritten


def rewrite_groups(
    spark: SparkSession,
    snapshot: Snapshot,
    layout: FileLayout,
    groups: list[GroupToRewrite],
    options: WriterOptions,
    directory: str,
    *,
    operation: str = "compaction",
    row_filter: RowFilter | None = None,
    lineage: RowLineage | None = None,
) -> Rewritten:
    """Rewrite each group as one file under ``directory`` (relative to the table root), in
    Spark tasks each rewriting whole groups; the staged files, one per group that keeps a row
    (none is written for a group without rows), in no order, and the rows counted.
    ``row_filter`` (run in the tasks, on up to a row group of rows at a time) keeps the rows
    it returns; errors name ``operation``; ``lineage``: see :class:`GroupRewriter`.

    Raises:
        RowCountMismatchError: see :func:`check_rows`.
        Exception: the Spark job's error (a file unreadable or gone, a write failing); files
            already written stay under ``directory`` for the caller's clean-up.
    """
    rewriter = GroupRewriter(snapshot, layout, options, directory, operation, row_filter, lineage)
    outcomes = in_tasks(spark, groups, rewriter.rewrite)
    return check_rows(f"{operation} of {snapshot.location.uri} (staged in {directory})", outcomes)


def in_tasks(
    spark: SparkSession, groups: list[GroupToRewrite], work: Callable[[GroupToRewrite], T]
) -> list[T]:
    """``work`` (picklable) applied to every group in Spark tasks, each task taking whole
    groups of about equal bytes (one task per core, more for large rewrites: see
    :data:`TASK_BYTES`); the results, in no order.

    Raises:
        Exception: the Spark job's error.
    """
    if not groups:
        return []
    total = sum(g.size for g in groups)
    cores = max(1, spark.sparkContext.defaultParallelism)
    tasks = _pack(groups, max(cores, math.ceil(total / TASK_BYTES)))
    rdd = spark.sparkContext.parallelize(tasks, len(tasks))
    return rdd.flatMap(lambda task: [work(g) for g in task]).collect()


def in_tasks_or_threads(
    spark: SparkSession | None,
    groups: list[GroupToRewrite],
    work: Callable[[GroupToRewrite], T],
    failure: str,
) -> list[T]:
    """:func:`in_tasks` under :func:`rewriting` (``failure`` heads a task's error), or, without
    ``spark`` (a Python worker commits), ``work`` in this process's threads; in no order."""
    if spark is None:
        with ThreadPoolExecutor(min(_LOCAL_THREADS, max(1, len(groups)))) as pool:
            return list(pool.map(work, groups))
    with rewriting(spark, failure):
        return in_tasks(spark, groups, work)


@contextlib.contextmanager
def rewriting(spark: SparkSession, failure: str) -> Iterator[None]:
    """Run the body's Spark jobs in a job group; on failure, wait for its tasks to stop (no
    late file may follow the clean-up) and raise the sink's error: a ``SinkError`` a task
    raised, or a ``StagingError`` starting with ``failure``."""
    probe = spark.range(0)
    group: str | None = None
    try:
        with staging_job_group(probe) as group:
            yield
    except BaseException as err:
        wait_for_tasks_to_end(probe, group)
        if isinstance(err, (SinkError, KeyboardInterrupt, SystemExit)):
            raise
        translated = translate_task_error(err)
        if translated is not err:
            raise translated from err
        raise StagingError(f"{failure}: {err}") from err


def _pack(groups: list[GroupToRewrite], slots: int) -> list[list[GroupToRewrite]]:
    """``groups`` spread over at most ``slots`` tasks of about equal bytes, largest first."""
    tasks: list[list[GroupToRewrite]] = [[] for _ in range(min(slots, len(groups)))]
    loads = [0] * len(tasks)
    for group in sorted(groups, key=lambda g: -g.size):
        lightest = loads.index(min(loads))
        tasks[lightest].append(group)
        loads[lightest] += group.size
    return tasks


class GroupRewriter:
    """Rewrites one group as one file (see the module docstring); pickles to the Python
    workers. With ``lineage`` (a row-tracking table) each row keeps its id and commit version
    in the materialized columns, written after the table's."""

    def __init__(
        self,
        snapshot: Snapshot,
        layout: FileLayout,
        options: WriterOptions,
        directory: str,
        operation: str,
        row_filter: RowFilter | None,
        lineage: RowLineage | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._layout = layout
        self._options = options
        self._directory = directory
        self._operation = operation
        self._row_filter = row_filter
        self._lineage = lineage
        extra = [] if lineage is None else lineage.fields
        self._written_schema = pa.schema([*layout.file_schema, *extra])

    def rewrite(self, group: GroupToRewrite) -> GroupOutcome:
        """The staged file (``None`` when no row is kept) and the rows counted."""
        counted = _Counted()
        tables = self._row_groups(group, counted)
        first = next(tables, None)
        if first is None:  # empty files only, or every row filtered out
            return GroupOutcome(None, counted.read, counted.dropped, 0)
        location = self._snapshot.location
        schema = self._written_schema
        values = dict(group.partition_values)
        if not self._layout.hive_directories:  # (column mapping: as the writers place files)
            partitions = "".join(random.choices(string.ascii_letters + string.digits, k=2))
        else:
            partitions = partition_dir(self._layout.partition_columns, values) if values else ""
        name = f"part-{group.index:05d}-{uuid.uuid4()}.{self._options.compression}.parquet"
        relative = "/".join(p for p in (self._directory, partitions, name) if p)
        fs = location.filesystem()
        full = location.path(relative)
        if location.is_local:
            fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        # (stats of the table's columns only: the lineage columns come after them)
        stats = FileStatsCollector(self._layout.file_schema)
        written = 0
        try:
            with fs.open(full, "wb") as stream:
                writer = parquet_writer(stream, schema, self._options.compression)
                for table in itertools.chain([first], tables):
                    stats.observe(table.select(self._layout.file_schema.names))
                    writer.write_table(table, row_group_size=table.num_rows)
                    written += table.num_rows
                writer.close()
                size = stream.tell()
        except OSError as err:
            raise StagingError(f"{self._operation} could not write {relative!r}: {err}") from err
        metadata = writer.writer.metadata
        staged = StagedFile(
            path=relative,
            size=size,
            partition_values=values,
            num_records=metadata.num_rows,
            stats=stats.to_json(metadata),
            modification_time=int(time.time() * 1000),
        )
        return GroupOutcome(staged, counted.read, counted.dropped, written)

    def _row_groups(self, group: GroupToRewrite, counted: _Counted) -> Iterator[pa.Table]:
        """The group's rows (those the filter keeps) as tables of the file schema, each up to
        one row group; no empty table. Counts the rows read and dropped into ``counted``."""
        reader = (
            DeltaFileReader(self._snapshot)
            if self._lineage is None
            else RowLineageReader(self._snapshot, self._lineage)
        )
        values = dict(group.read_values)
        vectors = {path: dict(metadata) for path, metadata in group.vectors}
        pending: list[pa.RecordBatch] = []
        rows = size = 0
        for path, file_size in group.files:
            try:
                split = FileSplit(
                    path=path,
                    size_bytes=file_size,
                    partition_values=values,
                    metadata=vectors.get(path, {}),
                )
                for batch in reader(split):
                    pending.append(batch)
                    counted.read += batch.num_rows
                    rows += batch.num_rows
                    size += batch.nbytes
                    # Small files make small batches: buffered up to one row group.
                    if (
                        rows >= self._options.row_group_rows
                        or size >= self._options.row_group_bytes
                    ):
                        yield from self._kept(pending, counted)
                        pending, rows, size = [], 0, 0
            except (OSError, pa.ArrowException) as err:
                raise StagingError(
                    f"{self._operation} could not read {path!r} of {self._snapshot.location.uri} "
                    f"({type(err).__name__}: {err}); nothing was committed. The file may have "
                    "been deleted (VACUUM) or damaged since it was committed."
                ) from err
        yield from self._kept(pending, counted)

    def _kept(self, batches: list[pa.RecordBatch], counted: _Counted) -> Iterator[pa.Table]:
        """``batches`` (of the logical schema) filtered and cast to the file schema, if any row
        remains. (Filtered a row group at a time: a filter may cost per call.)"""
        if not batches:
            return
        table: Any = pa.Table.from_batches(batches)
        if self._row_filter is not None:
            before = table.num_rows
            table = self._row_filter(table)
            counted.dropped += before - table.num_rows
        if table.num_rows:
            shaped = _as_file_schema(table, self._snapshot.shape, self._layout.file_schema)
            if self._lineage is not None:  # the lineage columns as read, after the table's
                for f in self._lineage.fields:
                    shaped = shaped.append_column(f, table.column(f.name))
            yield shaped


def _as_file_schema(table: pa.Table, shape: TableShape, file_schema: pa.Schema) -> pa.Table:
    """``table`` (rows of the logical schema) as the files hold them: its data columns cast
    to the table's types and, under column mapping, under their physical names (nested ones
    too) with their field ids. (Renamed by a zero-copy view: the types differ in names only;
    a cast would match struct fields by name and null them.)"""
    if not shape.column_mapping:
        return table.select(file_schema.names).cast(file_schema)
    logical = arrow_schema(shape.schema, physical=False, skip=frozenset(shape.partition_by))
    table = table.select(logical.names).cast(logical)
    columns = [
        pa.chunked_array([chunk.view(f.type) for chunk in c.chunks], f.type)
        for c, f in zip(table.columns, file_schema, strict=True)
    ]
    return pa.Table.from_arrays(columns, schema=file_schema)


@dataclass
class _Counted:
    """Rows one group's task read and dropped so far."""

    read: int = 0
    dropped: int = 0


@contextlib.contextmanager
def alongside(work: Callable[[], Rewritten]) -> Iterator[Callable[[], Rewritten]]:
    """Run ``work`` (Spark jobs) in another thread while the body runs its own: Spark's
    scheduler then fills the cores the body's job leaves idle. Yields the way to ``work``'s
    result once the body is done (re-raising its error). The thread inherits this thread's
    job group, so a failed batch's clean-up waits for its tasks too; leaving the body always
    waits for ``work`` to end, so nothing it writes can follow the clean-up."""
    from pyspark.util import InheritableThread

    outcome: list[Rewritten | BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as err:  # re-raised on the caller's thread
            outcome.append(err)

    thread = InheritableThread(run)
    thread.start()

    def result() -> Rewritten:
        done = outcome[0]
        if isinstance(done, BaseException):
            raise done
        return done

    try:
        yield result
    finally:
        thread.join()
