"""The task side of the Delta sink: Arrow batches in, large Parquet files out, one committable
per file.

Batches are grouped by partition, buffered into large row groups (small row groups cost up to
40% more bytes and slower scans) and rolled into a new file once a file reaches its target size.
Every file is listed in this attempt's staging manifest *before* it is created, so that whatever
happens to the task, the driver can find and delete files that do not get committed.
"""

from __future__ import annotations

import contextlib
import decimal
import itertools
import random
import string
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from committers.delta.storage._staging import manifest_path, write_manifest
from committers.delta.storage._storage import TableLocation
from committers.delta.storage._upload import S3Uploader, UploadStream
from committers.delta.table._rules import FileLayout
from committers.delta.table._schema import partition_dir, serialize_partition_value
from committers.delta.table._stats import FileStatsCollector
from committers.delta.write._committable import StagedFile
from committers.delta.write._options import WriterOptions
from framework.errors import SchemaMismatchError, StagingError
from framework.sink import SinkWriter, WriterContext

__all__ = ["DeltaStagingWriter", "parquet_writer"]


def parquet_writer(stream: Any, schema: pa.Schema, compression: str) -> pq.ParquetWriter:
    """A Parquet writer with the sink's settings: INT64 timestamps, footer statistics."""
    return pq.ParquetWriter(
        stream,
        schema,
        compression=compression,
        use_deprecated_int96_timestamps=False,
        write_statistics=True,
    )


@dataclass
class _OpenFile:
    """One Parquet file being written, plus the rows buffered for its next row group."""

    relative_path: str
    partition_values: dict[str, str | None]
    stream: Any
    writer: pq.ParquetWriter
    stats: FileStatsCollector
    pending: list[pa.RecordBatch] = field(default_factory=list)
    pending_rows: int = 0
    pending_bytes: int = 0
    full: bool = False  # set by the background thread once the file reached its target size


class _SerialWorker:
    """Runs jobs in submission order on one background thread, with at most ``depth`` queued.

    Encoding Parquet then overlaps with receiving the next Arrow batches from Spark (uploads
    to S3 overlap with both, through :class:`S3Uploader`). A job's exception is raised on the
    submitting thread by a later ``submit`` or by ``drain``. ``depth`` bounds the memory held
    by queued row groups.
    """

    def __init__(self, depth: int = 2) -> None:
        self._depth = depth
        self._pool: ThreadPoolExecutor | None = None
        self._futures: deque[Future[None]] = deque()

    def submit(self, job: Callable[[], None]) -> None:
        while self._futures and (self._futures[0].done() or len(self._futures) >= self._depth):
            self._futures.popleft().result()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="parquet-stager")
        self._futures.append(self._pool.submit(job))

    def drain(self) -> None:
        while self._futures:
            self._futures.popleft().result()

    def shutdown(self) -> None:
        """Wait for queued jobs, ignoring their errors (used on abort)."""
        while self._futures:
            with contextlib.suppress(Exception):
                self._futures.popleft().result()
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class DeltaStagingWriter(SinkWriter[pa.RecordBatch, StagedFile]):
    """Stages one task attempt's rows as Parquet files under the table root.

    It receives rows shaped by the sink's input plan (see ``_rules.py``): the data columns under
    the names and types of ``layout.file_schema`` and the partition columns already spelled as
    the log stores them. The table's rules were checked on those rows by the engine; this
    writer only lays them out (a partition value that is not a string is spelled here, for
    callers that drive the writer without an engine).

    Guarantees: every file this writer may have created is named in its manifest before it
    exists; a file is reported (as a :class:`StagedFile`) only after it is completely written
    and closed. On failure nothing is reported and :meth:`abort` deletes what was written.

    Raises (from :meth:`write`): ``SchemaMismatchError`` when a batch does not have the
    expected columns, ``StagingError`` when the storage write fails.
    """

    def __init__(
        self,
        context: WriterContext,
        location: TableLocation,
        layout: FileLayout,
        options: WriterOptions,
    ) -> None:
        self._context = context
        self._location = location
        self._fs = location.filesystem()
        self._data_schema = layout.file_schema
        self._partition_by = list(layout.partition_columns)
        self._hive_directories = layout.hive_directories
        self._options = options
        self._manifest = manifest_path(context.epoch, context.partition_id, context.task_attempt_id)
        self._created: list[str] = []
        self._open: dict[tuple[Any, ...], _OpenFile] = {}
        self._opened: list[_OpenFile] = []  # every file ever opened, for abort
        # Appended by the background thread; an S3 file counts once its upload completed.
        self._finished: list[tuple[StagedFile, UploadStream | None]] = []
        self._worker = _SerialWorker()
        self._uploader: S3Uploader | None = None
        self._made_dirs: set[str] = set()

    # -- input ---------------------------------------------------------------------------

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        data = self._file_rows(batch)
        if not self._partition_by:
            self._append((), {}, data)
            return
        for key, values, rows in self._split_by_partition(batch):
            self._append(key, values, data if rows is None else data.take(rows))

    def _file_rows(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The batch's data columns, in file order and with the file's types. A data column
        absent from the batch is written as nulls."""
        names = set(batch.schema.names)
        expected = set(self._data_schema.names) | set(self._partition_by)
        if not names <= expected:
            raise SchemaMismatchError(
                f"input has columns not in the table schema: {sorted(names - expected)}"
            )
        columns = []
        for f in self._data_schema:
            if f.name not in names:
                columns.append(pa.nulls(batch.num_rows, f.type))
                continue
            try:
                columns.append(_to_file_type(batch.column(f.name), f.type))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise SchemaMismatchError(
                    f"column {f.name!r} does not convert to the table's type {f.type}: {err}"
                ) from err
        return pa.RecordBatch.from_arrays(columns, schema=self._data_schema)

    def _split_by_partition(
        self, batch: pa.RecordBatch
    ) -> list[tuple[tuple[Any, ...], dict[str, str | None], np.ndarray | None]]:
        """Group rows by partition values with one sort (no per-key scans): for each
        partition, its key, its values as the log spells them and its row indices (``None``:
        every row)."""
        codes = np.zeros(batch.num_rows, dtype=np.int64)
        for name in self._partition_by:
            encoded = pc.dictionary_encode(batch.column(name), null_encoding="encode")
            indices = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
            codes = codes * max(len(encoded.dictionary), 1) + indices
            if len(self._partition_by) > 2:  # keep codes dense so the products cannot overflow
                codes = np.unique(codes, return_inverse=True)[1].astype(np.int64)
        if codes.size and (codes == codes[0]).all():
            order: np.ndarray | None = None
            bounds = [0, batch.num_rows]
        else:
            order = np.argsort(codes, kind="stable")
            sorted_codes = codes[order]
            bounds = [0, *(np.flatnonzero(np.diff(sorted_codes)) + 1).tolist(), batch.num_rows]
        result = []
        for start, end in itertools.pairwise(bounds):
            first = start if order is None else int(order[start])
            values = {
                name: _partition_value(batch.column(name)[first].as_py())
                for name in self._partition_by
            }
            rows = None if order is None else order[start:end]
            result.append((tuple(values.values()), values, rows))
        return result

    # -- buffering and files ------------------------------------------------------------------

    def _append(
        self, key: tuple[Any, ...], values: dict[str, str | None], batch: pa.RecordBatch
    ) -> None:
        current = self._open.get(key) or self._open_file(key, values)
        current.pending.append(batch)
        current.pending_rows += batch.num_rows
        current.pending_bytes += batch.nbytes
        if (
            current.pending_bytes >= self._options.row_group_bytes
            or current.pending_rows >= self._options.row_group_rows
        ):
            self._flush_row_group(current)
        if current.full:
            self._finish(key)

    def _open_file(self, key: tuple[Any, ...], values: dict[str, str | None]) -> _OpenFile:
        if len(self._open) >= self._options.max_open_files:
            # Too many partitions at once: finish the fullest file to bound memory.
            fullest = max(self._open, key=lambda k: self._open[k].pending_bytes)
            self._finish(fullest)
        if not self._hive_directories:
            directory = "".join(random.choices(string.ascii_letters + string.digits, k=2))
        elif self._partition_by:
            directory = partition_dir(self._partition_by, values)
        else:
            directory = ""
        name = (
            f"part-{self._context.partition_id:05d}-{uuid.uuid4()}"
            f".{self._options.compression}.parquet"
        )
        relative = f"{directory}/{name}" if directory else name
        self._created.append(relative)
        try:
            # The manifest names the file before the file exists: no file can escape cleanup.
            write_manifest(self._location, self._manifest, self._created)
            stream = self._open_stream(self._location.path(relative))
            writer = parquet_writer(stream, self._data_schema, self._options.compression)
        except OSError as err:
            raise StagingError(f"cannot create staged file {relative!r}: {err}") from err
        opened = _OpenFile(relative, values, stream, writer, FileStatsCollector(self._data_schema))
        self._open[key] = opened
        self._opened.append(opened)
        return opened

    def _open_stream(self, full: str) -> Any:
        if self._location.is_s3:
            # Uploaded in parts while it is written, through the async writer.
            if self._uploader is None:
                self._uploader = S3Uploader(
                    self._location,
                    part_size=self._options.upload_part_size,
                    concurrency=self._options.upload_concurrency,
                )
            return self._uploader.open(full)
        parent = full.rsplit("/", 1)[0]
        if parent not in self._made_dirs:
            self._fs.makedirs(parent, exist_ok=True)
            self._made_dirs.add(parent)
        return self._fs.open(full, "wb")

    def _flush_row_group(self, current: _OpenFile) -> None:
        """Hand the buffered rows of ``current`` to the background thread as one row group."""
        if not current.pending_rows:
            return
        batches = current.pending
        current.pending, current.pending_rows, current.pending_bytes = [], 0, 0
        self._worker.submit(lambda: self._write_row_group(current, batches))

    def _write_row_group(self, current: _OpenFile, batches: list[pa.RecordBatch]) -> None:
        """Background thread: encode and write one row group; flag the file once it is full."""
        table = pa.Table.from_batches(batches, schema=self._data_schema)
        current.stats.observe(table)
        try:
            current.writer.write_table(table, row_group_size=table.num_rows)
            if current.stream.tell() >= self._options.target_file_size:
                current.full = True
        except OSError as err:
            raise StagingError(f"writing {current.relative_path!r} failed: {err}") from err

    def _finish(self, key: tuple[Any, ...]) -> None:
        current = self._open.pop(key)
        self._flush_row_group(current)
        self._worker.submit(lambda: self._close(current))

    def _close(self, current: _OpenFile) -> None:
        """Background thread: write the footer, close the file, report it as staged."""
        try:
            current.writer.close()
            size = current.stream.tell()
            current.stream.close()
        except OSError as err:
            raise StagingError(f"closing {current.relative_path!r} failed: {err}") from err
        metadata = current.writer.writer.metadata
        upload = current.stream if isinstance(current.stream, UploadStream) else None
        staged = StagedFile(
            path=current.relative_path,
            size=size,
            partition_values=current.partition_values,
            num_records=metadata.num_rows,
            stats=current.stats.to_json(metadata),
            modification_time=int(time.time() * 1000),
            task_attempt_id=self._context.task_attempt_id,
        )
        self._finished.append((staged, upload))

    # -- lifecycle ------------------------------------------------------------------------

    def prepare_commit(self, flush: bool) -> list[StagedFile]:
        if flush:
            for key in list(self._open):
                self._finish(key)
            self._worker.drain()
            if self._uploader is not None:
                self._uploader.flush()
        done: list[tuple[StagedFile, UploadStream | None]] = []
        waiting: list[tuple[StagedFile, UploadStream | None]] = []
        for staged, upload in self._finished:
            (done if upload is None or upload.upload.finished else waiting).append((staged, upload))
        self._finished = waiting
        return [staged for staged, _ in done]

    def task_metrics(self) -> dict[str, int]:
        """S3 upload counters of this task (``"arrow"`` staging to S3), e.g. to see throttling
        in the batch's metrics; empty elsewhere."""
        if self._uploader is None:
            return {}
        upload = self._uploader.metrics
        return {
            "upload_requests": upload.num_requests,
            "upload_failed_requests": upload.num_failed_requests,
            "upload_throttled_requests": upload.num_throttled_requests,
            "upload_retries": upload.num_retries,
        }

    def close(self) -> None:
        self._worker.shutdown()
        if self._uploader is not None:
            self._uploader.close()

    def abort(self) -> None:
        self._worker.shutdown()
        if self._uploader is not None:
            self._uploader.abort()  # before the writers close: their tails need not go up
        for current in self._opened:
            for closer in (current.writer.close, current.stream.close):
                with contextlib.suppress(Exception):  # best effort: the manifest names the file
                    closer()
        self._open.clear()
        leftovers = False
        for relative in self._created:
            try:
                self._fs.rm(self._location.path(relative))
            except FileNotFoundError:
                pass
            except OSError:
                leftovers = True  # keep the manifest: the driver's cleanup finds the file
        if not leftovers:
            with contextlib.suppress(OSError):
                self._fs.rm(self._location.path(self._manifest))


def _partition_value(value: Any) -> str | None:
    """A partition value as the log spells it (the input plan already spelled it as a string
    when an engine ran it)."""
    return value if value is None or isinstance(value, str) else serialize_partition_value(value)


def _to_file_type(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` cast to ``target``. A NOT NULL struct field holds nulls where its parent is
    null (that is how engines hand such rows over): those slots get a placeholder value, since
    the parent's null hides them, and Parquet refuses nulls in a required field. A null where
    the parent is not null (a broken rule) is left as it is, so the Parquet writer refuses it.
    """
    if not pa.types.is_struct(target) or not pa.types.is_struct(array.type):
        return array.cast(target)
    parent_null = array.is_null()
    children = []
    for index, child_field in enumerate(target):
        child = _to_file_type(array.field(index), child_field.type)
        if not child_field.nullable and child.null_count:
            child = pc.if_else(parent_null, _placeholder(child), child)
        children.append(child)
    mask = parent_null if array.null_count else None
    return pa.StructArray.from_arrays(children, fields=list(target), mask=mask)


def _placeholder(array: pa.Array) -> pa.Array:
    """``array`` with every null replaced by a value of its type (zero, empty, false)."""
    t = array.type
    if pa.types.is_struct(t):
        return pa.StructArray.from_arrays(
            [_placeholder(array.field(i)) for i in range(t.num_fields)], fields=list(t)
        )
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        zero = pa.scalar("", t)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        zero = pa.scalar(b"", t)
    elif pa.types.is_boolean(t):
        zero = pa.scalar(False)
    elif pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_map(t):
        zero = pa.scalar([], t)
    elif pa.types.is_date32(t):
        zero = pa.scalar(0, pa.int32()).cast(t)
    elif pa.types.is_timestamp(t):
        zero = pa.scalar(0, pa.int64()).cast(t)
    elif pa.types.is_decimal(t):
        zero = pa.scalar(decimal.Decimal(0), t)
    else:
        zero = pa.scalar(0, t)
    return pc.fill_null(array, zero)
