"""``staging="spark"``: Spark's own Parquet writer stages the batch; the driver reads footers.

Rows never cross into a Python worker. For each run of a batch:

1. the driver writes a manifest naming the run's directory, ``<table>/batch-<epoch>-<run id>/``
   (a name VACUUM of delta-spark and delta-rs considers, unlike ``_`` or ``.`` names);
2. Spark writes the shaped rows there with ``partitionBy`` (Hive directories, as Delta lays
   them out), through its commit protocol, which keeps exactly one attempt of every task and
   drops failed and speculative ones; timestamps are INT64 microseconds, set on a clone of the
   session so the user's configuration is never touched;
3. the driver lists the directory once and reads the footers (in a thread pool) into
   :class:`StagedFile` committables with Delta stats. Every Parquet file under partition
   directories (``name=value``, whatever the name starts with: ``_2=``, ``.x=`` and ``__x=``
   are partition directories too) is data; only the file system's and the commit protocol's
   bookkeeping is not (``.crc`` checksums, ``_SUCCESS``, ``_temporary`` and any other
   directory that is no partition directory);
4. the rows the write job wrote, counted by a Spark observation on the written DataFrame as
   its tasks wrote them (no extra job: the count rides along the write, and only the
   successful attempt of each task counts), must be the rows of the files found: otherwise
   ``RowCountMismatchError``, before anything is committed.

A run that does not commit leaves only its directory, which the committer's clean-up deletes
whole because the manifest names it.
"""

from __future__ import annotations

import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow.parquet as pq

from committers.delta.spark._field_ids import with_field_ids
from committers.delta.storage._staging import epoch_staging_dir, write_manifest
from committers.delta.storage._storage import TableLocation
from committers.delta.table._rules import FileLayout
from committers.delta.table._schema import HIVE_NULL
from committers.delta.table._stats import FileStatsCollector
from committers.delta.write._committable import StagedFile, logged_records
from committers.delta.write._options import WriterOptions
from framework.connector import check_row_count, crash_point
from framework.errors import StagingError
from framework.spark.connector import is_connect_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from framework.sink import Epoch

__all__ = [
    "RUN_DIR_PREFIX",
    "SparkParquetStager",
    "hadoop_can_write",
    "hadoop_has_filesystem",
    "is_run_directory",
    "spark_uri",
]

RUN_DIR_PREFIX = "batch-"
_FOOTER_THREADS = 16
# How long to wait for Spark to hand over the observed row count once its write returned
# (Spark 4.2 completes it before; a listener-based completion takes milliseconds).
_OBSERVATION_SECONDS = 60.0
# Hadoop configuration for the write only (DataFrameWriter options reach the job's
# configuration): no _SUCCESS marker, whose absence nobody here reads.
_WRITE_OPTIONS = {"mapreduce.fileoutputcommitter.marksuccessfuljobs": "false"}


def hadoop_can_write(df: DataFrame, uri: str) -> bool:
    """Whether this process can run Spark's writer for ``df`` (a classic, not a Spark Connect
    DataFrame) and Spark's Hadoop layer has a FileSystem class for ``uri``'s scheme."""
    if is_connect_dataframe(df):
        return False
    scheme = spark_uri(uri).split("://", 1)[0]
    return scheme == "file" or hadoop_has_filesystem(df.sparkSession, scheme)


def hadoop_has_filesystem(spark: SparkSession, scheme: str) -> bool:
    """Whether Spark's Hadoop layer has a FileSystem class for ``scheme`` (False without a
    JVM, as in Spark Connect)."""
    try:
        session: Any = spark
        conf = session._jsc.hadoopConfiguration()
        session._jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(scheme, conf)
        return True
    except Exception:  # no JVM (Spark Connect) or no class for the scheme
        return False


def spark_uri(uri: str) -> str:
    """``uri`` as Spark's file sources take it: a local path becomes a ``file://`` URL, an
    ``s3://`` URL the same objects through Hadoop's S3A file system (``s3a://``)."""
    if uri.startswith("s3://"):
        return "s3a://" + uri[len("s3://") :]
    return uri if "://" in uri else f"file://{uri}"


def is_written_data_file(inside: str) -> bool:
    """Whether ``inside`` (a path below the directory Spark wrote) is a data file: a Parquet
    file whose every directory is a partition directory (``name=value``). Not data: the
    bookkeeping of the file system and of the commit protocol (``.crc`` checksums next to
    each file, ``_SUCCESS``, ``_temporary/`` and any other directory without ``=``).

    Only the file name is judged by a leading ``_`` or ``.`` (Hadoop's hidden files): a
    partition directory may start with either (a column named ``_2`` or ``.x``)."""
    *directories, name = inside.split("/")
    return (
        name.endswith(".parquet")
        and not name.startswith(("_", "."))
        and all("=" in d for d in directories)
    )


def _observed_rows(observation: Any, path: str) -> int:
    """The row count ``observation`` holds once Spark's write of ``path`` returned.

    Raises:
        StagingError: Spark did not complete it (the rows written cannot be checked).
    """
    future = observation.future()
    deadline = time.monotonic() + _OBSERVATION_SECONDS
    while not future.isCompleted():
        if time.monotonic() > deadline:
            raise StagingError(
                f"Spark did not report how many rows its write of {path} wrote, so the files "
                "cannot be checked against them; nothing was committed."
            )
        time.sleep(0.01)
    return int(observation.getAsJava().get("rows"))


def run_directory(epoch: Epoch) -> str:
    return f"{RUN_DIR_PREFIX}{epoch.epoch_id}-{epoch.run_id}"


#: :func:`run_directory`'s names: a run id is a UUID, with the suffixes of a run's rewrites
#: (``-rewrite<n>``, ``-changes<n>``, ``-redo``) and of an upsert's kept rows (``-kept``).
_RUN_DIRECTORY = re.compile(
    re.escape(RUN_DIR_PREFIX) + r"\d+-[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"
    r"(?:-(?:rewrite\d+|changes\d+|redo|kept))*"
)


def is_run_directory(name: str) -> bool:
    """Whether ``name`` (one path segment) is a directory :func:`run_directory` names."""
    return _RUN_DIRECTORY.fullmatch(name) is not None


def spark_manifest_path(epoch: Epoch) -> str:
    return f"{epoch_staging_dir(epoch)}/{epoch.run_id}-spark.json"


class SparkParquetStager:
    """Stages one batch with ``DataFrame.write.parquet`` (see the module docstring).

    Guarantees: before Spark writes anything, the run's manifest names its directory; the
    committables describe exactly the files Spark committed, and hold exactly the rows the
    write job wrote. On failure the error propagates and the run's directory is left for the
    committer's clean-up.
    """

    def __init__(
        self,
        location: TableLocation,
        layout: FileLayout,
        options: WriterOptions,
        bytes_per_row: float | None = None,
    ):
        """``bytes_per_row``: the compressed size of a row in the table's files so far, if
        known; files are then capped at ``target_file_size`` worth of rows."""
        self._location = location
        self._layout = layout
        self._options = options
        self._bytes_per_row = bytes_per_row

    def stage(self, df: DataFrame, epoch: Epoch) -> tuple[list[StagedFile], int]:
        """Write ``df`` into the run's directory (named by the run's manifest first); its
        staged files and the rows the write job wrote (which they hold).

        Raises:
            RowCountMismatchError: the files found do not hold the rows the job wrote.
        """
        self.write_manifest(epoch)
        return self.write(df, epoch)

    def write_manifest(self, epoch: Epoch, also_owned: tuple[str, ...] = ()) -> None:
        """Name the run's directory, and ``also_owned`` (directories others write for the
        run), in the run's manifest: what a clean-up deletes if the run does not commit."""
        directories = [run_directory(epoch), *also_owned]
        write_manifest(self._location, spark_manifest_path(epoch), [], directories=directories)

    def write(
        self, df: DataFrame, epoch: Epoch, directory: str | None = None
    ) -> tuple[list[StagedFile], int]:
        """:meth:`stage` once :meth:`write_manifest` has run; into ``directory`` (relative to
        the table root; the manifest must name it) instead of the run's directory if given.

        Raises:
            RowCountMismatchError: the files found do not hold the rows the job wrote.
        """
        directory = directory or run_directory(epoch)
        # Spark's writer has no hook inside its tasks: a fault campaign's kill lands while
        # they run, from a timer.
        crash_point("staging", epoch.epoch_id, within_seconds=0.3)
        if not self._layout.hive_directories:  # column mapping: every field's id
            df = with_field_ids(df, self._layout.file_schema)
        written = self._write(df, self._spark_path(directory))
        # Spark writes an empty file for an empty batch: not worth an add action (the
        # clean-up deletes it with the rest of the directory's uncommitted files).
        staged = [f for f in self._read_footers(directory) if f.num_records]
        check_row_count(
            f"the write of {self._location.uri} staged in {directory}",
            written=written,
            committed=sum(logged_records(f) for f in staged),
        )
        return staged, written

    def _spark_path(self, directory: str) -> str:
        return f"{spark_uri(self._location.uri.rstrip('/'))}/{directory}"

    def _write(self, df: DataFrame, path: str) -> int:
        """Write ``df`` to ``path``; the rows the job wrote, as Spark counted them."""
        from pyspark.sql import functions as F

        jdf: Any = df._jdf
        python_session: Any = df.sparkSession
        jvm = python_session._jvm
        context = python_session.sparkContext
        # A clone has the user's configuration; ours changes only the clone (two writes at
        # once in one session, or the user's own writes, never see it).
        session = jdf.sparkSession().cloneSession()
        session.conf().set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        plan = jdf.queryExecution().analyzed()  # (already analyzed: not analyzed again)
        dataset = jvm.org.apache.spark.sql.classic.Dataset.ofRows(session, plan)
        # Registered with the clone, which runs the write and completes the observation.
        observation = jvm.org.apache.spark.sql.Observation(f"sparksink-written-{uuid.uuid4()}")
        count: Any = F.count(F.lit(1)).alias("rows")
        no_more = jvm.PythonUtils.toSeq([])
        writer = dataset.observe(observation, count._jc, no_more).write()
        columns = self._layout.partition_columns
        if columns:
            names = context._gateway.new_array(jvm.java.lang.String, len(columns))
            for index, name in enumerate(columns):
                names[index] = name
            writer = writer.partitionBy(names)
        for key, value in _WRITE_OPTIONS.items():
            writer = writer.option(key, value)
        if self._bytes_per_row:
            # Spark writes one file per task and partition; it can only roll by row count.
            rows = max(1, int(self._options.target_file_size / self._bytes_per_row))
            writer = writer.option("maxRecordsPerFile", str(rows))
        writer.option("compression", self._options.compression).mode("errorifexists").parquet(path)
        return _observed_rows(observation, path)

    def _read_footers(self, directory: str) -> list[StagedFile]:
        fs = self._location.filesystem()
        found = fs.find(self._location.path(directory), detail=True)
        data: list[tuple[str, int]] = []
        litter: list[str] = []
        for full, info in found.items():
            relative = self._location.relative(full)
            if is_written_data_file(relative[len(directory) + 1 :]):
                data.append((relative, int(info["size"])))
            else:
                litter.append(full)  # Hadoop's .crc checksums, _temporary leftovers
        if litter:
            fs.rm(litter)
        with ThreadPoolExecutor(max_workers=_FOOTER_THREADS) as pool:
            return list(pool.map(lambda item: self._staged(fs, directory, *item), data))

    def _staged(self, fs: Any, directory: str, relative: str, size: int) -> StagedFile:
        try:
            with fs.open(self._location.path(relative), "rb") as src:
                footer = pq.read_metadata(src)
        except OSError as err:
            raise StagingError(
                f"cannot read the footer of staged file {relative!r}: {err}"
            ) from err
        return StagedFile(
            path=relative,
            size=size,
            partition_values=self._partition_values(directory, relative),
            num_records=footer.num_rows,
            stats=FileStatsCollector(self._layout.file_schema).to_json(footer),
            modification_time=int(time.time() * 1000),
        )

    def _partition_values(self, directory: str, relative: str) -> dict[str, str | None]:
        """Partition values from Spark's Hive directories (``name=escaped value``)."""
        segments = relative[len(directory) + 1 :].split("/")[:-1]
        values: dict[str, str | None] = {}
        for segment in segments:
            name, _, value = segment.partition("=")
            values[unquote(name)] = None if value == HIVE_NULL else unquote(value)
        if set(values) != set(self._layout.partition_columns):
            raise StagingError(
                f"staged file {relative!r} is not under the partition directories "
                f"{list(self._layout.partition_columns)}"
            )
        return values
