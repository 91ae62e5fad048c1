"""A bounded :class:`~framework.source.Source` as a Spark Python data source reader.

Spark's Python Data Source API (``pyspark.sql.datasource``) plans a batch read in two steps:
``partitions()`` runs once, in a Python worker on the driver, and ``read(partition)`` runs once
per partition, in a task. :class:`BoundedSourceReader` maps FLIP-27 onto them:

* planning drives the source's :class:`~framework.source.SplitEnumerator` in-process
  (:class:`~framework.source.LocalEnumeratorContext`) until it has no more splits, and makes
  one :class:`SplitsPartition` per split, carrying the split through the source's versioned
  split serializer. Spark cannot ask for splits lazily (its partitions are fixed at planning
  time), but it hands the partitions to free task slots one after the other, which is what a
  reader pulling its next split achieves in Flink;
* a task creates the source's :class:`~framework.source.SourceReader`, hands it the split,
  signals that no more will come and polls it to the end of its input. The records must be
  ``pyarrow.RecordBatch`` es (or tables); each is conformed to the Arrow schema Spark expects
  for the read schema (columns by name, cast where the types differ), which Spark checks.

A failed task is retried by Spark from the start of its split (a Spark batch read has no
checkpoints), so each split is read once per successful task attempt: every record exactly
once in the result.

The adapter knows nothing of any destination or format; filter pushdown is the concrete
reader's business (see :func:`register_data_source`). A reader that narrows its input in
``pushFilters`` must know that Spark 4.1/4.2 keeps the plan of the last query whose filters it
pushed on the ``load()``-ed DataFrame (``PythonDataSourceV2.setReadInfo``) and reuses it for a
later query on that DataFrame that pushes no filter at all: that query reads only what the
earlier filters kept. Pruning there is only safe when each query starts from its own load().
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from framework.errors import ConfigurationError, SinkError
from framework.sink import deserialize_versioned, serialize_versioned
from framework.source import Boundedness, InputStatus, LocalEnumeratorContext, Source, Split

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource
    from pyspark.sql.types import StructType

__all__ = [
    "FILTER_PUSHDOWN_CONF",
    "MAX_PLANNED_SPLITS",
    "WORKER_PYTHON_CONF",
    "BoundedSourceReader",
    "SplitsPartition",
    "plan_partitions",
    "plan_splits",
    "read_partition",
    "register_data_source",
]

log = logging.getLogger("framework.spark")

#: Spark's switch for ``DataSourceReader.pushFilters`` (off by default in Spark 4.1 and 4.2; a
#: reader that implements ``pushFilters`` fails to plan while it is off).
FILTER_PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
#: Most splits one planning accepts: past this the enumerator is assumed not to terminate.
MAX_PLANNED_SPLITS = 10_000_000
#: The interpreter of the executors' Python workers for SQL (UDFs, ``mapInArrow``, Python data
#: source reads and writes); unset, they use the one a function was registered with.
WORKER_PYTHON_CONF = "spark.sql.execution.pyspark.python"
# Held while SparkContext.pythonExec names the driver's interpreter for a registration.
_registration_lock = threading.Lock()


class SplitsPartition(InputPartition):
    """One Spark input partition: the serialized splits one task reads.

    Attributes:
        index: the partition's position in the plan (the reader's subtask id).
        splits: each split as written by ``serialize_versioned(source.split_serializer(), ...)``.
    """

    def __init__(self, index: int, splits: tuple[bytes, ...]) -> None:
        super().__init__(index)
        self.index = index
        self.splits = splits

    def __repr__(self) -> str:  # Spark shows partitions in errors; the bytes say nothing
        return f"SplitsPartition(index={self.index}, splits={len(self.splits)})"


def plan_splits(source: Source[Any, Any, Any]) -> list[Split]:
    """Every split of a bounded ``source``, in the order its enumerator hands them out.

    The enumerator runs in this process with a parallelism of one; each request is answered
    with one split until it signals that there are no more.

    Raises:
        ConfigurationError: the source is not bounded.
        SinkError: the enumerator answered a request with nothing, or kept producing splits
            past :data:`MAX_PLANNED_SPLITS`.
    """
    if source.boundedness is not Boundedness.BOUNDED:
        raise ConfigurationError(
            f"{type(source).__name__} is unbounded; a Spark batch read needs a bounded source"
        )
    context: LocalEnumeratorContext[Split] = LocalEnumeratorContext(1)
    enumerator = source.create_enumerator(context)
    splits: list[Split] = []
    try:
        enumerator.start()
        while not context.has_no_more_splits(0):
            enumerator.handle_split_request(0)
            assigned = context.take_assignments(0)
            if not assigned and not context.has_no_more_splits(0):
                raise SinkError(
                    f"the enumerator of {type(source).__name__} answered a split request with "
                    "neither a split nor 'no more splits'"
                )
            splits.extend(assigned)
            if len(splits) > MAX_PLANNED_SPLITS:
                raise SinkError(
                    f"the enumerator of {type(source).__name__} produced more than "
                    f"{MAX_PLANNED_SPLITS} splits; a bounded source must come to an end"
                )
    finally:
        enumerator.close()
    return splits


class _TaskContext:
    """The reader context of one Spark task: its split is handed over up front."""

    def __init__(self, subtask_id: int) -> None:
        self._subtask_id = subtask_id

    @property
    def subtask_id(self) -> int:
        return self._subtask_id

    def send_split_request(self) -> None:
        """Nothing to ask for: the task's splits were assigned at planning time."""


class _Collect:
    def __init__(self) -> None:
        self.records: list[Any] = []

    def collect(self, record: Any) -> None:
        self.records.append(record)


def _spark_arrow_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema Spark checks the batches of ``read`` against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


class BoundedSourceReader(DataSourceReader):
    """A Spark ``DataSourceReader`` over a bounded source of Arrow record batches.

    Subclasses that build their source from planning state (e.g. filters pushed by Spark)
    override :meth:`source`; it is called once for planning and once in every task, and must
    not list or read anything itself (listing is the enumerator's job). The reader is pickled
    to every task before :meth:`partitions` runs, so anything :meth:`source` needs must be
    plain, picklable state.

    Args:
        schema: the read schema Spark passed to ``DataSource.reader``; records are conformed
            to it.
        source: the source to read; ``None`` when a subclass overrides :meth:`source`.
    """

    def __init__(self, schema: StructType, source: Source[Any, Any, Any] | None = None) -> None:
        self._schema = schema
        self._source = source

    def source(self) -> Source[Any, Any, Any]:
        """The source to plan and read."""
        if self._source is None:
            raise NotImplementedError(f"{type(self).__name__} must pass a source or override")
        return self._source

    def partitions(self) -> list[SplitsPartition]:
        """One partition per split of the source (see the module docstring). An input without
        splits gives no partition (Spark then runs one task that reads nothing)."""
        planned = plan_partitions(self.source())
        log.debug("%s planned %d partitions", type(self).__name__, len(planned))
        return planned

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Read the partition's splits to their end (see :func:`read_partition`)."""
        return read_partition(self.source(), partition, self._schema)


def plan_partitions(source: Source[Any, Any, Any]) -> list[SplitsPartition]:
    """One partition per split of a bounded ``source`` (see the module docstring)."""
    serializer = source.split_serializer()
    return [
        SplitsPartition(index, (serialize_versioned(serializer, split),))
        for index, split in enumerate(plan_splits(source))
    ]


def read_partition(
    source: Source[Any, Any, Any], partition: InputPartition, schema: StructType
) -> Iterator[pa.RecordBatch]:
    """Read a planned partition's splits with ``source``'s reader to their end, as batches of
    the read ``schema``.

    Raises:
        SinkError: a record is not Arrow data, or lacks a column of the read schema; the
            reader polled nothing while holding splits.
        Exception: whatever the source's reader raised (Spark retries the task).
    """
    if not isinstance(partition, SplitsPartition):
        if getattr(partition, "value", 0) is None:
            return  # Spark's stand-in partition for a plan without any
        raise SinkError(f"cannot read partition {partition!r}: it was not planned by this adapter")
    serializer = source.split_serializer()
    splits = [deserialize_versioned(serializer, data) for data in partition.splits]
    target = _spark_arrow_schema(schema)
    reader = source.create_reader(_TaskContext(partition.index))
    try:
        reader.add_splits(splits)
        reader.notify_no_more_splits()
        reader.start()
        output = _Collect()
        while True:
            status = reader.poll_next(output)
            records, output.records = output.records, []
            for record in records:
                yield from _conform(record, target)
            if status is InputStatus.END_OF_INPUT:
                return
            if status is InputStatus.NOTHING_AVAILABLE:
                raise SinkError(
                    f"the reader of {type(source).__name__} has nothing to read but did "
                    "not reach the end of its input after being told no more splits come"
                )
    finally:
        reader.close()


def _conform(record: Any, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    if isinstance(record, pa.Table):
        batches = record.to_batches()
    elif isinstance(record, pa.RecordBatch):
        batches = [record]
    else:
        raise SinkError(
            f"a Spark data source reads Arrow record batches, but the source emitted "
            f"{type(record).__name__}"
        )
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if batch.schema.equals(target):
            yield batch
            continue
        missing = [name for name in target.names if name not in batch.schema.names]
        if missing:
            raise SinkError(
                f"the source's batch lacks the column(s) {missing} of the read schema "
                f"(it has {batch.schema.names})"
            )
        yield batch.select(target.names).cast(target)


def register_data_source(
    spark: SparkSession, data_source: type[DataSource], *, filter_pushdown: bool
) -> None:
    """Register ``data_source`` with ``spark`` (``spark.read.format(name)``).

    With ``filter_pushdown``, also turns on :data:`FILTER_PUSHDOWN_CONF` for the session when
    it is off: Spark refuses to plan a read whose reader implements ``pushFilters`` while the
    setting is off (``DATA_SOURCE_PUSHDOWN_DISABLED``). Turning it on makes Spark run one more
    Python worker while planning each read of a Python data source that pushes filters; readers
    without ``pushFilters`` are unaffected. The change is logged at INFO. See the module
    docstring for the plan Spark reuses after a pushdown.

    Spark plans a Python data source (its schema and partitions, a stream's offsets, a write's
    commit) in Python processes it starts on the driver, with the interpreter the data source
    was registered with: the workers' (``spark.pyspark.python`` / ``PYSPARK_PYTHON``). A
    deployment that ships its environment in ``--archives env.tar.gz#environment`` names it
    relative to each executor's working directory (``./environment/bin/python``), which the
    driver does not have: planning would fail with ``Cannot run program``. When the workers'
    interpreter cannot be found from the driver, the data source is registered with this
    process's own interpreter (the driver's, which runs the job and has what the data source
    needs), and :data:`WORKER_PYTHON_CONF`, unless already set, is set for the session to the
    workers' interpreter, so that the executors' Python workers keep theirs (logged at INFO).
    """
    _register_planned_on_driver(spark, data_source)
    if not filter_pushdown:
        return
    current = str(spark.conf.get(FILTER_PUSHDOWN_CONF, "false")).strip().lower()
    if current != "true":
        spark.conf.set(FILTER_PUSHDOWN_CONF, "true")
        log.info(
            "set %s=true for this session: the %r data source pushes filters to its reader",
            FILTER_PUSHDOWN_CONF,
            data_source.name(),
        )


def _register_planned_on_driver(spark: SparkSession, data_source: type[DataSource]) -> None:
    """``spark.dataSource.register(data_source)`` with an interpreter the driver can start
    (see :func:`register_data_source`)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):  # the server plans it
        spark.dataSource.register(data_source)
        return
    context: Any = spark.sparkContext
    workers = str(context.pythonExec)
    if shutil.which(workers) is not None:
        spark.dataSource.register(data_source)
        return
    if spark.conf.get(WORKER_PYTHON_CONF, None) is None:
        spark.conf.set(WORKER_PYTHON_CONF, workers)
        log.info(
            "set %s=%s for this session: the workers' Python cannot be started on the driver, "
            "so the %r data source is planned with the driver's %s",
            WORKER_PYTHON_CONF,
            workers,
            data_source.name(),
            sys.executable,
        )
    # register() takes the interpreter from SparkContext.pythonExec. The lock keeps two
    # registrations from restoring each other's value; a Python function another thread defines
    # meanwhile gets the driver's interpreter too, which SQL functions override on the
    # executors with the setting above.
    with _registration_lock:
        context.pythonExec = sys.executable
        try:
            spark.dataSource.register(data_source)
        finally:
            context.pythonExec = workers
