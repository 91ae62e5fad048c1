"""Merge-on-read overwrites: an overwrite whose ``replace_where`` reads data columns, on a table
that enables deletion vectors, marks the rows it replaces in new vectors instead of rewriting
the files holding them, as delta-spark's ``replaceWhere`` and ``DELETE`` do on such tables.

For each candidate (a live file that may hold matching rows, see
:mod:`committers.delta.spark._replace_rewrite`), a task reads the file's physical rows in order
with the snapshot's reader (its old vector not applied, so a row's number is its position in
the file) and returns the positions where the predicate is TRUE. In the driver, the positions
the old vector already deletes are set aside: what is left are the live rows replaced.

- none: the file is left as it is;
- all its live rows: the file is removed whole (no vector that deletes every row);
- some: the file is removed with its old vector and added back with a new one deleting the
  old vector's rows and the replaced ones (PROTOCOL.md, "Deletion Vectors"), its stats those
  its writer logged with ``tightBounds: false``
  (:func:`~committers.delta.spark._upsert_marks.mark_rows`).

All the new vectors go into one vector file in the rewrite's run directory, named in its
manifest before it is written: an overwrite that does not commit leaves it to the epoch's
clean-up, as any staged file. No data file is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa

from committers.delta.read._source import DeltaFileReader
from committers.delta.spark._arrow_rewrite import GroupToRewrite, file_group, in_tasks_or_threads
from committers.delta.spark._spark_staging import run_directory, spark_manifest_path
from committers.delta.spark._upsert_marks import MarkableFile, mark_rows
from committers.delta.storage._staging import write_manifest
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import deleted_rows_of
from committers.delta.table._replace_where import ReplaceWhere
from committers.delta.table._snapshot import Snapshot
from committers.delta.write._committable import MarkedFile
from framework.errors import RowCountMismatchError, StagingError
from framework.sink import Epoch
from framework.source import FileSplit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["MarkableCandidate", "Marks", "mark_replaced_rows"]

_NO_ROWS = np.empty(0, np.uint64)


class MarkableCandidate(MarkableFile, Protocol):
    """A candidate of the overwrite, with what its re-add must repeat."""

    @property
    def partition(self) -> tuple[tuple[str, Any], ...]: ...  # typed, in partition order

    @property
    def logged_partition(self) -> Mapping[str, str | None]: ...  # as its add logs them


@dataclass(frozen=True)
class Marks:
    """The outcome: (live rows, rows replaced) per candidate index, and the files added back
    with their new vectors."""

    counts: dict[int, tuple[int, int]]
    marked: tuple[MarkedFile, ...]


@dataclass(frozen=True)
class _MatchedPositions:
    """A task's work on one candidate: (its index, its physical rows, the positions of those
    ``where`` is TRUE for). Pickles to the Python workers."""

    snapshot: Snapshot
    where: ReplaceWhere

    def __call__(self, group: GroupToRewrite) -> tuple[int, int, np.ndarray]:
        ((path, size),) = group.files
        split = FileSplit(path=path, size_bytes=size, partition_values=dict(group.read_values))
        found, offset = [], 0
        try:
            for batch in DeltaFileReader(self.snapshot)(split):  # (no vector: every row)
                mask = self.where.mask(batch).to_numpy(zero_copy_only=False)
                found.append(np.flatnonzero(mask).astype(np.uint64) + np.uint64(offset))
                offset += batch.num_rows
        except (OSError, pa.ArrowException) as err:
            raise StagingError(
                f"the overwrite could not read {path!r} of {self.snapshot.location.uri} "
                f"({type(err).__name__}: {err}); nothing was committed. The file may have been "
                "deleted (VACUUM) or damaged since it was committed."
            ) from err
        return group.index, offset, np.concatenate(found) if found else _NO_ROWS


def mark_replaced_rows(
    session: SparkSession | None,
    snapshot: Snapshot,
    where: ReplaceWhere,
    candidates: Sequence[MarkableCandidate],
    epoch: Epoch,
) -> Marks:
    """Find the rows of ``candidates`` that ``where`` replaces (in Spark tasks, or in this
    process without ``session``) and write the vectors of the files keeping some of their
    rows into ``epoch``'s run directory (see the module docstring).

    Raises:
        DeletionVectorError: a candidate's old vector is missing or damaged.
        StagingError: a candidate could not be read; nothing was written for the commit.
        RowCountMismatchError: a candidate's file has fewer rows than its old vector deletes.
        OSError: the vector file could not be written (the epoch's clean-up deletes it).
    """
    location = snapshot.location
    groups = [
        file_group(i, c.path, c.size, dict(c.partition), snapshot.shape)
        for i, c in enumerate(candidates)
    ]
    failure = f"the overwrite of {location.uri} failed while Python tasks read its files"
    found = in_tasks_or_threads(session, groups, _MatchedPositions(snapshot, where), failure)
    vectors = {c.path: c.deletion_vector for c in candidates if c.deletion_vector is not None}
    deleted = deleted_rows_of(location, vectors)
    counts, partial = {}, []
    for index, physical, positions in found:
        candidate = candidates[index]
        old = deleted.get(candidate.path, _NO_ROWS)
        if old.size and int(old.max()) >= physical:
            raise RowCountMismatchError(
                f"the overwrite of {location.uri} read {physical} rows of {candidate.path!r}, "
                f"whose deletion vector deletes row {int(old.max())}; nothing was committed. "
                "The file may have been replaced or damaged since it was committed."
            )
        replaced = int(np.setdiff1d(positions, old, assume_unique=True).size)
        live = physical - int(old.size)
        counts[index] = (live, replaced)
        if 0 < replaced < live:
            partial.append((candidate, positions, replaced))
    return Marks(counts, _write_vectors(location, partial, deleted, epoch))


def _write_vectors(
    location: TableLocation,
    partial: list[tuple[MarkableCandidate, np.ndarray, int]],
    deleted: Mapping[str, np.ndarray],
    epoch: Epoch,
) -> tuple[MarkedFile, ...]:
    """The vectors of the ``partial`` files (each with its matching positions and the number
    of live rows among them) in one vector file in ``epoch``'s run directory, named in its
    manifest first."""
    if not partial:
        return ()
    directory = run_directory(epoch)
    write_manifest(location, spark_manifest_path(epoch), [], directories=[directory])
    files = [c for c, _, _ in partial]
    marked = mark_rows(
        location,
        files,
        {c.path: positions for c, positions, _ in partial},
        deleted,
        [c.logged_partition for c in files],
        directory,
    )
    _check_marked(location.uri, partial, deleted, marked)
    return marked


def _check_marked(
    uri: str,
    partial: list[tuple[MarkableCandidate, np.ndarray, int]],
    deleted: Mapping[str, np.ndarray],
    marked: tuple[MarkedFile, ...],
) -> None:
    """Each new vector deletes exactly its old vector's rows and the replaced ones.

    Raises:
        RowCountMismatchError: otherwise; nothing was committed.
    """
    for (candidate, _, replaced), file in zip(partial, marked, strict=True):
        expected = deleted.get(candidate.path, _NO_ROWS).size + replaced
        if file.vector.cardinality != expected:
            raise RowCountMismatchError(
                f"the overwrite of {uri} wrote a deletion vector of {file.vector.cardinality} "
                f"rows for {candidate.path!r} where it deletes {expected}; nothing was "
                "committed."
            )
