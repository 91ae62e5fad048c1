"""What :func:`~committers.delta.read_table` learns from a snapshot's log before Spark plans
its scan (the files, how Spark spells their paths, the rows their deletion vectors delete),
kept for the last few versions read, as delta-spark keeps its snapshots in the session.

A version of a table never changes (its log entries and vector files are written once), so a
kept plan is exactly what reading the log again would give; which version is the latest is
still resolved on every call, and a table made anew at the same place has another table id
(its ``metaData.id``), which is part of the key. Plans are kept per Spark JVM (the path
spellings are its), at most :data:`KEPT_PLANS` of them, and only while small
(:data:`KEPT_DELETED_ROWS`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from committers.delta.read._source import DataFile, list_data_files
from committers.delta.table._deletion_vectors import deleted_rows_of
from committers.delta.table._snapshot import Snapshot

if TYPE_CHECKING:
    from deltalake import DeltaTable
    from pyspark.sql import SparkSession

__all__ = ["FilePlan", "file_plan"]

KEPT_PLANS = 4
KEPT_DELETED_ROWS = 10_000_000  # in all of a plan's vectors (8 bytes each)

_kept: OrderedDict[tuple[Any, ...], FilePlan] = OrderedDict()
_lock = threading.Lock()


@dataclass(frozen=True)
class FilePlan:
    """A snapshot's data files, in log order, with what a Spark scan of them needs."""

    files: Sequence[DataFile]
    #: log path -> ``_metadata.file_path`` as Spark spells it, for every file when any file
    #: has a deletion vector (else empty).
    keys: Mapping[str, str]
    #: that spelling -> the sorted row indexes its deletion vector deletes.
    vectors: Mapping[str, np.ndarray]


def file_plan(
    spark: SparkSession,
    table: DeltaTable,
    snapshot: Snapshot,
    storage_options: Mapping[str, Any] | None,
    spell: Callable[[SparkSession, Snapshot, Sequence[DataFile]], dict[str, str]],
) -> FilePlan:
    """The plan of ``snapshot``, from the log (``spell`` gives the files' spellings) or as kept.

    Raises:
        DeletionVectorError: a file's deletion vector is missing or damaged (nothing kept).
    """
    session: Any = spark
    key = (
        session.sparkContext._jsc.sc().hashCode(),
        snapshot.location.uri,
        table.metadata().id,
        tuple(sorted((str(k), str(v)) for k, v in (storage_options or {}).items())),
        snapshot.version,
    )
    with _lock:
        if key in _kept:
            _kept.move_to_end(key)
            return _kept[key]
    files = list_data_files(table, snapshot)
    keys = spell(spark, snapshot, files) if any(f.deletion_vector for f in files) else {}
    descriptors = {f.path: f.deletion_vector for f in files if f.deletion_vector is not None}
    vectors = {
        keys[path]: rows for path, rows in deleted_rows_of(snapshot.location, descriptors).items()
    }
    plan = FilePlan(files, keys, vectors)
    if sum(len(rows) for rows in vectors.values()) <= KEPT_DELETED_ROWS:
        with _lock:
            _kept[key] = plan
            while len(_kept) > KEPT_PLANS:
                _kept.popitem(last=False)
    return plan
