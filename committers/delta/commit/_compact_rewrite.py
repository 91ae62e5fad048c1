"""Compaction's rewrite (step 2 of :mod:`._compact`): the planned groups of small files
rewritten into a run directory, by Python tasks (pyarrow) or by Spark's own reader and writer,
and the rows written checked against the rows of the files they replace."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from committers.delta.commit._compact_plan import CompactionGroup
from committers.delta.read._row_lineage import RowLineage
from committers.delta.spark._arrow_rewrite import (
    GroupToRewrite,
    rewrite_groups,
    rewrite_vectors,
    rewriting,
)
from committers.delta.spark._s3a import prepare_s3a
from committers.delta.spark._scan import grouped_rows, scan_root_path
from committers.delta.spark._spark_staging import (
    SparkParquetStager,
    hadoop_can_write,
    run_directory,
    spark_manifest_path,
    spark_uri,
)
from committers.delta.storage._staging import write_manifest
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import deleted_rows_of
from committers.delta.table._delta_schema import walk
from committers.delta.table._rules import FileLayout, TableShape
from committers.delta.table._snapshot import Snapshot
from committers.delta.write._committable import StagedFile, logged_records
from committers.delta.write._options import WriterOptions
from framework.errors import ConfigurationError, RowCountMismatchError
from framework.sink import Epoch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "check_rewritten_rows",
    "check_spark_can_rewrite",
    "rewrite_with_arrow",
    "rewrite_with_spark",
]


def check_spark_can_rewrite(
    spark: SparkSession, shape: TableShape, location: TableLocation
) -> None:
    """Refuse what only Spark's reader and writer cannot do (``staging="spark"``); on S3,
    configure Spark's s3a from the table's options (see ``_s3a``).

    Raises:
        ConfigurationError: Spark cannot write the table's storage, or the table has NOT NULL
            fields inside structs.
    """
    uri = location.uri
    problem = prepare_s3a(spark, location) if location.is_s3 else None
    if problem:
        raise ConfigurationError(
            f"compaction with staging='spark' cannot rewrite {uri}: {problem}. Use "
            "staging='arrow' or 'auto' (Python tasks rewrite the files)."
        )
    if not hadoop_can_write(spark.range(0), uri):
        raise ConfigurationError(
            f"compaction with staging='spark' rewrites files with Spark's own Parquet reader "
            f"and writer, and Spark cannot write {uri} here (no Hadoop file system for its "
            "scheme, e.g. s3:// without hadoop-aws, or a Spark Connect session). Use "
            "staging='arrow' or 'auto' (Python tasks rewrite the files)."
        )
    if any(len(path) > 1 and not f.nullable for path, f in walk(shape.schema)):
        raise ConfigurationError(
            f"table {uri} has NOT NULL fields inside structs, which Spark's Parquet writer "
            "writes as optional fields that deltalake's reader then refuses; nothing was done. "
            "Compact it with staging='arrow' or 'auto'."
        )


# -- rewrite --------------------------------------------------------------------------------


def rewrite_with_spark(
    spark: SparkSession,
    location: TableLocation,
    layout: FileLayout,
    groups: list[CompactionGroup],
    options: WriterOptions,
    epoch: Epoch,
    cluster_by: Sequence[str] = (),
    lineage: RowLineage | None = None,
) -> list[StagedFile]:
    """Rewrite every group in Spark tasks; the staged files, checked against the groups.
    ``cluster_by``: the clustering columns of a clustered table; the rows of all groups are
    then written as many files, each holding one range of those columns, sorted by them.
    ``lineage``: the row ids and commit versions to carry over (a row-tracking table)."""
    root = spark_uri(location.uri.rstrip("/"))
    # Spark writes one file per task and partition; the groups hash onto tasks, so one task
    # may get two groups of a partition: cap its files at the largest group's rows. (Ranges
    # of clustering columns are about even: a quarter more than the mean is headroom.)
    most_rows = max(g.records for g in groups)
    if cluster_by:
        most_rows = max(most_rows, (sum(g.records for g in groups) * 5) // (4 * len(groups)))
    bytes_per_row = options.target_file_size / (most_rows + 0.5)  # -> maxRecordsPerFile
    stager = SparkParquetStager(location, layout, options, bytes_per_row)
    with _rewriting(spark, location, "Spark"):
        files = [(tuple(f.path for f in g.files), g.partition) for g in groups]
        deleted = deleted_rows_of(
            location,
            {f.path: f.deletion_vector for g in groups for f in g.files if f.deletion_vector},
        )
        df = grouped_rows(
            spark, root, scan_root_path(spark, root), layout, files, deleted, cluster_by, lineage
        )
        staged, _ = stager.stage(df, epoch)
    check_rewritten_rows(location.uri, groups, staged, layout)
    return staged


def rewrite_with_arrow(
    spark: SparkSession,
    snapshot: Snapshot,
    layout: FileLayout,
    groups: list[CompactionGroup],
    options: WriterOptions,
    epoch: Epoch,
    lineage: RowLineage | None = None,
) -> list[StagedFile]:
    """Rewrite every group in Python tasks (pyarrow); the staged files, checked against the
    groups. ``lineage``: the row ids and commit versions to carry over (a row-tracking
    table)."""
    location = snapshot.location
    directory = run_directory(epoch)
    write_manifest(location, spark_manifest_path(epoch), [], directories=[directory])
    work = [
        GroupToRewrite(
            index=index,
            files=tuple((f.path, f.size) for f in group.files),
            partition_values=tuple(zip(layout.partition_columns, group.partition, strict=True)),
            vectors=rewrite_vectors(group.files),
        )
        for index, group in enumerate(groups)
    ]
    with _rewriting(spark, location, "Python tasks"):
        staged = rewrite_groups(
            spark, snapshot, layout, work, options, directory, lineage=lineage
        ).files
    check_rewritten_rows(location.uri, groups, staged, layout)
    return staged


def _rewriting(spark: SparkSession, location: TableLocation, who: str) -> Any:
    """:func:`rewriting`, failing with a ``StagingError`` that says ``who`` failed."""
    return rewriting(spark, f"compaction of {location.uri} failed while {who} rewrote the files")


def check_rewritten_rows(
    uri: str, groups: list[CompactionGroup], staged: list[StagedFile], layout: FileLayout
) -> None:
    """Every partition got back exactly the rows its compacted files held (rows in, from
    their stats in the log, == rows out, the record counts of the files to add).

    Raises:
        RowCountMismatchError: a file was not read, a row landed in another partition, or
            rows were lost or doubled (e.g. ``spark.sql.files.ignoreMissingFiles`` skipped a
            file).
    """
    expected: dict[tuple[str | None, ...], int] = defaultdict(int)
    for group in groups:
        expected[group.partition] += group.records
    written: dict[tuple[str | None, ...], int] = defaultdict(int)
    for f in staged:
        values = tuple(f.partition_values.get(c) for c in layout.partition_columns)
        written[values] += logged_records(f)
    # A group whose rows its deletion vectors all delete writes no file.
    expected = defaultdict(int, {p: n for p, n in expected.items() if n})
    if dict(written) != dict(expected):
        differences = {
            p: (expected.get(p, 0), written.get(p, 0))
            for p in set(expected) | set(written)
            if expected.get(p, 0) != written.get(p, 0)
        }
        raise RowCountMismatchError(
            f"compaction of {uri} did not reproduce the rows of the files it rewrote: it would "
            f"commit {sum(written.values())} rows where they held {sum(expected.values())} "
            f"(partition -> (rows in, rows out): {dict(list(differences.items())[:5])}); "
            "nothing was committed. A file may have "
            "been deleted while it was read (VACUUM) or skipped by "
            "spark.sql.files.ignoreMissingFiles / ignoreCorruptFiles."
        )
