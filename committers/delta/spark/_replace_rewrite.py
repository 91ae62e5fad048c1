"""An overwrite whose ``replace_where`` reads data columns: the live files that may hold
matching rows are read, and those that do are rewritten without them, for the commit that
removes them (see :mod:`committers.delta.table._replace_where` for the predicate).

Runs right before the epoch's commit (from the committer's ``combine``), on the table's newest
snapshot V, once the new rows are staged and checked:

1. **Classify** every live file (:class:`~committers.delta.table._replace_where.FileClassifier`): no
   row can match (left alone), every row matches by its partition values (removed whole by the
   commit, never read), or maybe some: a *candidate*.
2. **Rewrite** each candidate into a file of its rows for which the predicate is not TRUE
   (FALSE or NULL: they stay, as a SQL ``DELETE ... WHERE`` keeps them). By default pyarrow
   does it in Spark tasks (:mod:`committers.delta.spark._arrow_rewrite`), or in this process when it
   has no Spark (the ``"deltalake"`` format commits in a Python worker without one); with
   ``staging="spark"``, Spark's reader counts each candidate's matching rows and Spark's writer
   writes the kept rows of those that have some. A candidate without a matching row is left as
   it is (its copy, if one was written, is never committed); one whose rows all match leaves
   no file. On a table that tracks row ids the Python tasks rewrite (whatever the staging),
   writing each kept row's id and commit version into the materialized columns
   (:mod:`committers.delta.read._row_lineage`). The rows read from each candidate must be
   the rows the log records for it.
   On a table that enables deletion vectors (``deletion_vectors="auto"``), no file is
   rewritten: the matching rows are marked in new vectors instead
   (:mod:`committers.delta.spark._replace_marks`) and the commit adds back each candidate
   that keeps rows with its new vector.
3. The result names the replaced candidates, the unchanged ones and V. The commit removes the
   replaced files and the whole-match files with the adds, only if every replaced file is
   still live and no file that may hold a matching row appeared since V; otherwise the
   committer computes this once more on the newer snapshot (see ``DeltaGlobalCommitter``).

The kept rows go under ``batch-<epoch>-<run id>-rewrite<n>/``, named in a staging manifest
before anything is written, so an abandoned rewrite is deleted by the epoch's clean-up like
any staged file. The files written carry the sink's Parquet settings and statistics.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from committers.delta.read._row_lineage import RowLineage, keeps_row_ids, row_lineage
from committers.delta.spark._arrow_rewrite import (
    GroupOutcome,
    GroupRewriter,
    GroupToRewrite,
    check_rows,
    file_group,
    in_tasks_or_threads,
    rewrite_vectors,
    rewriting,
)
from committers.delta.spark._change_data import change_directory, stage_changes, staged_rows
from committers.delta.spark._deleted_rows import decoded_path, drop_deleted_rows
from committers.delta.spark._replace_marks import mark_replaced_rows
from committers.delta.spark._scan import logical_columns, read_schema, scan_root_path
from committers.delta.spark._spark_staging import (
    SparkParquetStager,
    run_directory,
    spark_manifest_path,
    spark_uri,
)
from committers.delta.spark._upsert_marks import DeletionVectorMode, can_mark, merges_on_read
from committers.delta.storage._staging import write_manifest
from committers.delta.storage._storage import TableLocation
from committers.delta.table._change_feed import (
    CHANGE_DATA_FEED,
    CHANGE_TYPE,
    DELETE,
    INSERT,
    writes_change_data,
)
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor, deleted_rows_of
from committers.delta.table._delta_schema import quote
from committers.delta.table._live_vectors import live_adds, vector_of
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._replace_where import FileClassifier, ReplaceWhere
from committers.delta.table._rules import TableShape, WritePlan, plan_write
from committers.delta.table._snapshot import Snapshot, reader_features
from committers.delta.table._table import removal_path
from committers.delta.write._committable import MarkedFile, ReplacedFile, Rewrite, StagedFile
from committers.delta.write._options import Staging, WriterOptions
from framework.errors import RowCountMismatchError, StagingError
from framework.sink import Epoch, InputPlan, PlannedColumn
from framework.spark.connector import apply_input_plan, parquet_files

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["replace_rows"]

_FILE = "__sparksink_file__"
_MATCHED = "__sparksink_matched__"
_ROW = "__sparksink_row_index__"
# Hadoop expands these in the paths Spark is given to read.
_GLOB_CHARACTERS = frozenset("{}[]*?\\")


@dataclass(frozen=True)
class _Candidate:
    """A live file that may hold matching rows."""

    logged_path: str  # as the log stores it (URL-encoded)
    path: str  # decoded, relative to the table root
    size: int
    records: int | None  # live rows: its deletion vector's are not counted
    partition: tuple[tuple[str, Any], ...]  # typed values, in partition column order
    deletion_vector: DeletionVectorDescriptor | None = None
    # As its add logs them, where the log was replayed (tables with deletion vectors): what a
    # re-add with a new vector repeats.
    logged_stats: str | None = None
    modification_time: int | None = None
    logged_partition: Mapping[str, str | None] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class _Job:
    """One rewrite: of ``candidates`` of the table at ``location`` (planned as ``plan``),
    without the rows ``where`` matches, into ``epoch``'s run directory."""

    location: TableLocation
    plan: WritePlan
    where: ReplaceWhere
    candidates: list[_Candidate]
    options: WriterOptions
    epoch: Epoch
    #: What the kept rows carry over on a table that tracks row ids (None: it does not).
    lineage: RowLineage | None = None


@dataclass(frozen=True)
class _KeepUnmatched:
    """The row filter of the rewrite: keeps the rows for which ``where`` is not TRUE."""

    where: ReplaceWhere

    def __call__(self, rows: pa.Table) -> pa.Table:
        return rows.filter(pc.invert(self.where.mask(rows)))


@dataclass(frozen=True)
class _RewriteFile:
    """A task's work on one candidate: (its index, its rewrite: the file of its kept rows and
    the rows counted)."""

    rewriter: GroupRewriter

    def __call__(self, group: GroupToRewrite) -> tuple[int, GroupOutcome]:
        return group.index, self.rewriter.rewrite(group)


def replace_rows(
    location: TableLocation,
    table: DeltaTable,
    where: ReplaceWhere,
    options: WriterOptions,
    epoch: Epoch,
    *,
    attempt: int,
    staging: Staging,
    session: SparkSession | None,
    new_files: Sequence[StagedFile] = (),
    deletion_vectors: DeletionVectorMode = "auto",
) -> tuple[list[StagedFile], Rewrite]:
    """Rewrite, for ``epoch``'s overwrite, the files of ``table`` (at its current version)
    that hold rows ``where`` matches (see the module docstring); ``attempt`` numbers the
    computations of one run (each writes its own directory). ``session``: the Spark that runs
    the rewrite (``None``: this process does it with pyarrow). ``new_files``: the overwrite's
    staged rows, which the change files of a table with the change data feed on report as
    inserted (with the rows replaced as deleted; files whose rows all match are read then too).
    ``deletion_vectors``: ``"auto"`` marks the replaced rows in deletion vectors where the
    table enables them, ``"off"`` rewrites the files holding them.

    Returns:
        The staged files of the kept rows, and the :class:`Rewrite` the commit checks and
        removes (``metrics``: ``numCopiedRows``, ``numDeletedRows`` of the rewritten files).

    Raises:
        UnsupportedTableFeatureError: a candidate's logged path cannot be removed exactly (or,
            for Spark, read by its path).
        RowCountMismatchError: a candidate held another number of rows than its log entry
            says, or the files written do not hold the rows the rewrite wrote; its files are
            left for the epoch's clean-up.
        StagingError: the rewrite failed; its files are left for the epoch's clean-up.
        DeletionVectorError: a candidate's deletion vector is missing or damaged.
    """
    read_version = table.version()
    shape = TableShape.of_table(table)
    bound = where.bind(shape.arrow_schema(), location.uri, shape.partition_by)
    feed = writes_change_data(shape.configuration)
    if feed and session is None:
        raise UnsupportedTableFeatureError(
            f"the overwrite of {location.uri} where {where.text} must write change files (its "
            f"change data feed is on: {CHANGE_DATA_FEED}=true), which Spark writes, and no "
            "classic Spark session runs here (Spark Connect, or a Python worker). Nothing was "
            "committed; write it with DeltaSink from a classic Spark session."
        )
    features = reader_features(table)[1]
    adds = live_adds(location, read_version) if "deletionVectors" in features else {}
    candidates = _candidates(table, shape, bound, location.uri, whole_too=feed, adds=adds)
    if not candidates:
        return [], Rewrite(read_version=read_version)
    # The kept rows have the table's columns now (a merge's new columns come later, as null).
    table_plan = plan_write(shape, shape.arrow_schema(), "strict", location.uri)
    rewrite_epoch = dataclasses.replace(epoch, run_id=f"{epoch.run_id}-rewrite{attempt}")
    lineage = None
    if keeps_row_ids(table):  # the kept rows keep their ids: only the Python tasks write them
        paths = [c.path for c in candidates]
        lineage = row_lineage(location, dict(shape.configuration), read_version, paths)
    job = _Job(location, table_plan, bound, candidates, options, rewrite_epoch, lineage)
    snapshot = Snapshot(location, read_version, shape, features, table.schema().to_json())
    staged: list[StagedFile] = []
    marked: tuple[MarkedFile, ...] = ()
    if merges_on_read(deletion_vectors, table) and can_mark(candidates):
        marks = mark_replaced_rows(session, snapshot, bound, candidates, rewrite_epoch)
        counts, marked = marks.counts, marks.marked
    elif staging == "spark" and session is not None and lineage is None:
        staged, counts = _with_spark(session, job)
    else:
        staged, counts = _with_arrow(session, snapshot, job)
    rewrite = _rewrite(location.uri, read_version, candidates, counts, marked)
    if feed and rewrite.replaced:
        assert session is not None
        changes_epoch = dataclasses.replace(epoch, run_id=f"{epoch.run_id}-changes{attempt}")
        change_files = _stage_changes(session, job, counts, new_files, changes_epoch)
        rewrite = dataclasses.replace(rewrite, change_files=change_files)
    return staged, rewrite


def _stage_changes(
    session: SparkSession,
    job: _Job,
    counts: dict[int, tuple[int, int]],
    new_files: Sequence[StagedFile],
    epoch: Epoch,
) -> tuple[StagedFile, ...]:
    """The overwrite's change files, as delta-spark's replaceWhere writes them: the rows it
    replaces (``where`` TRUE) of the candidates holding some, as ``delete``; the rows of
    ``new_files``, as ``insert``. Their directory is named in ``epoch``'s manifest first."""
    from pyspark.sql import functions as F

    location, plan = job.location, job.plan
    directory = change_directory(epoch)
    write_manifest(location, spark_manifest_path(epoch), [], directories=[directory])
    replaced = [i for i, (_, matched) in counts.items() if matched]
    scan, _ = _scan(session, job, replaced)
    names = [f.name for f in plan.shape.schema.fields]
    identity = tuple(PlannedColumn(name=n, expression=quote(n)) for n in names)
    kind = PlannedColumn(name=CHANGE_TYPE, expression=quote(CHANGE_TYPE))
    deleted = apply_input_plan(
        scan.where(F.col(_MATCHED)).select(
            *[F.col(quote(n)) for n in names], F.lit(DELETE).alias(CHANGE_TYPE)
        ),
        InputPlan(columns=(*identity, kind), checks=(), output=(*plan.input_plan.output, kind)),
    )
    changes = deleted
    if new_files:
        inserted = staged_rows(session, location, plan.layout, new_files)
        changes = deleted.unionByName(inserted.withColumn(CHANGE_TYPE, F.lit(INSERT)))
    return stage_changes(
        location,
        plan.layout,
        job.options,
        changes,
        epoch,
        expected_rows=sum(counts[i][1] for i in replaced) + sum(f.num_records for f in new_files),
        what=f"the overwrite of {location.uri}",
    )


def _candidates(
    table: DeltaTable,
    shape: TableShape,
    where: ReplaceWhere,
    uri: str,
    *,
    whole_too: bool,
    adds: Mapping[str, Mapping[str, Any]],
) -> list[_Candidate]:
    """The live files that may hold matching rows (``whole_too``: also those whose every row
    matches by its partition values, whose rows the change files must report), with their
    deletion vectors and what their adds log (``adds``, by decoded path: empty for a table
    without deletion vectors).

    Raises:
        UnsupportedTableFeatureError: one's logged path cannot be removed exactly.
    """
    classify = FileClassifier(where, shape)
    found = []
    for action in pa.table(table.get_add_actions(flatten=True)).to_pylist():
        outcome = classify(action)
        if outcome == "none" or (outcome == "all" and not whole_too):
            continue
        logged = action["path"]
        decoded = unquote(logged)
        if removal_path(logged) is None or "://" in decoded or decoded.startswith("/"):
            raise UnsupportedTableFeatureError(
                f"cannot overwrite {uri} where {where.text}: file {logged!r} may hold rows it "
                "matches, and its logged path is absolute or uses a URL encoding delta-rs "
                "cannot write in a remove action, so the file could not be replaced. Nothing "
                "was committed; rewrite the file with the tool that wrote it (e.g. delta-rs's "
                "optimize.compact())."
            )
        add = adds.get(decoded, {})
        vector = vector_of(add, decoded)
        records = action.get("num_records")
        if records is not None and vector is not None:
            records -= vector.cardinality
        found.append(
            _Candidate(
                logged_path=logged,
                path=decoded,
                size=int(action["size_bytes"]),
                records=records,
                partition=tuple((c, action.get(f"partition.{c}")) for c in shape.partition_by),
                deletion_vector=vector,
                logged_stats=add.get("stats"),
                modification_time=add.get("modificationTime"),
                logged_partition=add.get("partitionValues") or {},
            )
        )
    return found


def _rewrite(
    uri: str,
    read_version: int,
    candidates: list[_Candidate],
    counts: dict[int, tuple[int, int]],
    marked: tuple[MarkedFile, ...] = (),
) -> Rewrite:
    """The :class:`Rewrite` of the candidates, given (rows read, rows matched) per candidate
    and the files ``marked`` (added back with new deletion vectors: no row copied).

    Raises:
        RowCountMismatchError: a candidate was read with another number of rows than its log
            entry says (deleted or replaced underneath, or skipped by the reader).
    """
    replaced, unchanged = [], []
    copied = deleted = 0
    for index, candidate in enumerate(candidates):
        rows, matched = counts.get(index, (0, 0))
        if candidate.records is not None and rows != candidate.records:
            raise RowCountMismatchError(
                f"the overwrite of {uri} read {rows} rows of {candidate.path!r} where the log "
                f"records {candidate.records}; nothing was committed. The file may have been "
                "deleted or damaged (a VACUUM with too short a retention), or skipped by "
                "spark.sql.files.ignoreMissingFiles / ignoreCorruptFiles."
            )
        if not matched:
            unchanged.append(candidate.logged_path)
            continue
        replaced.append(
            ReplacedFile(
                logged_path=candidate.logged_path,
                path=candidate.path,
                size=candidate.size,
                num_records=candidate.records,
                deletion_vector=candidate.deletion_vector,
            )
        )
        copied += rows - matched
        deleted += matched
    metrics = {"numCopiedRows": copied, "numDeletedRows": deleted}
    if marked:  # (delta-spark's names for a DELETE with vectors)
        metrics.update(
            numCopiedRows=0,
            numDeletionVectorsAdded=len(marked),
            numDeletionVectorsRemoved=sum(f.deletion_vector is not None for f in replaced),
        )
    return Rewrite(
        read_version=read_version,
        replaced=tuple(replaced),
        unchanged=tuple(unchanged),
        metrics=metrics,
        marked=marked,
    )


def _with_arrow(
    session: SparkSession | None, snapshot: Snapshot, job: _Job
) -> tuple[list[StagedFile], dict[int, tuple[int, int]]]:
    """Each candidate rewritten by pyarrow without its matching rows: in Spark tasks, or in
    this process without ``session``. The files of the candidates that had matching rows,
    and (rows read, rows matched) per candidate."""
    location = job.location
    directory = run_directory(job.epoch)
    write_manifest(location, spark_manifest_path(job.epoch), [], directories=[directory])
    keep = _KeepUnmatched(job.where)
    rewriter = GroupRewriter(
        snapshot, job.plan.layout, job.options, directory, "the overwrite", keep, job.lineage
    )
    groups = [
        dataclasses.replace(
            file_group(i, c.path, c.size, dict(c.partition), job.plan.shape),
            vectors=rewrite_vectors([c]),
        )
        for i, c in enumerate(job.candidates)
    ]
    failure = f"the overwrite of {location.uri} failed while Python tasks rewrote its files"
    results = in_tasks_or_threads(session, groups, _RewriteFile(rewriter), failure)
    check_rows(
        f"the overwrite of {location.uri} (rewritten in {directory})", [o for _, o in results]
    )
    staged, counts = [], {}
    for index, outcome in results:
        counts[index] = (outcome.rows_read, outcome.rows_dropped)
        if outcome.file is not None and outcome.rows_dropped:  # (a copy without a match
            staged.append(outcome.file)  # stays uncommitted)
    return staged, counts


def _with_spark(
    session: SparkSession, job: _Job
) -> tuple[list[StagedFile], dict[int, tuple[int, int]]]:
    """Spark counts each candidate's rows and matching rows (one job), then writes the kept
    rows of those with both kinds (another job, Spark's Parquet writer).

    Raises:
        UnsupportedTableFeatureError: a candidate's path holds characters Spark's reader
            would expand as a pattern.
        StagingError: Spark read a file it was not asked to.
        RowCountMismatchError: Spark wrote another number of rows than the rewritten files
            keep.
    """
    from pyspark.sql import functions as F

    location, plan = job.location, job.plan
    globbed = [c.path for c in job.candidates if _GLOB_CHARACTERS & set(c.path)]
    if globbed:
        raise UnsupportedTableFeatureError(
            f"the overwrite of {location.uri} with staging='spark' cannot read {globbed[0]!r}: "
            "Spark's reader would expand its characters as a pattern. Nothing was committed; "
            "use staging='auto' (Python tasks read the files)."
        )
    failure = f"the overwrite of {location.uri} failed while Spark rewrote its files"
    with rewriting(session, failure):
        scan, keys = _scan(session, job, range(len(job.candidates)))
        counted = scan.groupBy(_FILE).agg(
            F.count(F.lit(1)).alias("rows"), F.count_if(F.col(_MATCHED)).alias("matched")
        )
        counts: dict[int, tuple[int, int]] = {}
        for row in counted.collect():
            if row[_FILE] not in keys:
                raise StagingError(
                    f"the overwrite of {location.uri} read a row of {row[_FILE]!r}, which is "
                    "not a file it asked Spark to read; nothing was committed"
                )
            counts[keys[row[_FILE]]] = (int(row["rows"]), int(row["matched"]))
        touched = [i for i, (rows, matched) in counts.items() if 0 < matched < rows]
        if not touched:
            return [], counts
        kept, _ = _scan(session, job, touched)
        names = [f.name for f in plan.shape.schema.fields]
        identity = tuple(PlannedColumn(name=n, expression=quote(n)) for n in names)
        shaped = apply_input_plan(
            kept.where(~F.col(_MATCHED)).select(*[F.col(quote(n)) for n in names]),
            InputPlan(columns=identity, checks=(), output=plan.input_plan.output),
        )
        stager = SparkParquetStager(location, plan.layout, job.options)
        staged, rows = stager.stage(shaped, job.epoch)
    expected = sum(counts[i][0] - counts[i][1] for i in touched)
    if rows != expected:
        raise RowCountMismatchError(
            f"the overwrite of {location.uri} wrote {rows} rows where the files it rewrites "
            f"keep {expected}; nothing was committed. A file may have been deleted while it "
            "was read (VACUUM)."
        )
    return staged, counts


def _scan(
    session: SparkSession, job: _Job, chosen: Sequence[int]
) -> tuple[DataFrame, dict[str, int]]:
    """The live rows of the ``chosen`` candidates (the rows their deletion vectors delete
    dropped): the table's columns (partition values from the log), ``_FILE`` (the decoded path
    Spark read) and ``_MATCHED`` (``where`` is TRUE); and each file's ``_FILE`` value mapped to
    its candidate index.

    Raises:
        DeletionVectorError: a candidate's deletion vector is missing or damaged.
    """
    from pyspark.sql import functions as F

    plan, candidates = job.plan, job.candidates
    root = spark_uri(job.location.uri.rstrip("/"))
    root_path = scan_root_path(session, root)
    files = [candidates[i] for i in chosen]
    scan = parquet_files(
        session, [f"{root}/{c.path}" for c in files], schema=read_schema(plan.layout)
    )
    file_path = scan.metadataColumn("_metadata").getField("file_path")
    key = decoded_path(file_path)
    row_index = scan.metadataColumn("_metadata").getField("row_index")
    rows = scan.select(*logical_columns(plan.shape), key.alias(_FILE), row_index.alias(_ROW))
    keys = {f"{root_path}/{candidates[i].path}": i for i in chosen}
    deleted = deleted_rows_of(
        job.location,
        {c.path: c.deletion_vector for c in files if c.deletion_vector is not None},
    )
    vectors = {
        key: deleted[candidates[i].path] for key, i in keys.items() if candidates[i].path in deleted
    }
    # Every file is mapped: a row of a file the map does not spell fails the query.
    rows = drop_deleted_rows(session, rows, _FILE, _ROW, vectors, every_file=list(keys)).drop(_ROW)
    partition_by = list(plan.shape.partition_by)
    if partition_by:
        schema = plan.shape.arrow_schema()
        values = pa.table(
            [pa.array([f"{root_path}/{c.path}" for c in files], pa.string())]
            + [
                pa.array([dict(c.partition)[p] for c in files], schema.field(p).type)
                for p in partition_by
            ],
            names=[_FILE, *partition_by],
        )
        # Broadcast: Spark cannot size a local relation and would sort every row by file.
        rows = rows.join(F.broadcast(session.createDataFrame(values)), on=_FILE)
    matched = F.expr(f"coalesce(({job.where.sql()}), false)")
    return rows.withColumn(_MATCHED, matched), keys
