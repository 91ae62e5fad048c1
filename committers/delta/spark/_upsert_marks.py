"""Merge-on-read upserts: the rows a batch replaces are marked in deletion vectors instead of
the files holding them being rewritten.

On a table that enables deletion vectors (``delta.enableDeletionVectors=true`` and the
``deletionVectors`` reader and writer features), an upsert's touched files stay where they
are: each gets a new vector deleting the rows its old vector deleted plus the rows the batch
replaces (PROTOCOL.md, "Deletion Vectors": a new vector replaces the old one on the same file
and must keep its rows deleted), and only the batch's new rows are written. All the batch's
vectors go into one vector file in its run directory, which the run's manifest owns: a batch
that does not commit leaves it to the clean-up, as any staged file. The commit removes each
touched file with its old vector and adds it back with the new one
(:class:`~committers.delta.write._committable.MarkedFile`), its stats those its writer logged
with ``tightBounds: false``, as delta-spark's ``MERGE`` does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow as pa
from deltalake import DeltaTable
from pyroaring import BitMap64

from committers.delta.spark._upsert_stored import _APPLIES, _DELETE, _FILE, _ROW_INDEX, _LiveFile
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor, write_vector_file
from committers.delta.table._snapshot import reader_features
from committers.delta.write._committable import MarkedFile
from framework.errors import ConfigurationError, RowCountMismatchError

__all__ = [
    "DeletionVectorMode",
    "MarkableFile",
    "can_mark",
    "check_deletion_vector_mode",
    "check_marked",
    "counted_positions",
    "mark_rows",
    "merges_on_read",
]

DeletionVectorMode = Literal["auto", "off"]

ENABLE_DELETION_VECTORS = "delta.enableDeletionVectors"


def check_deletion_vector_mode(mode: object) -> None:
    """Raises ConfigurationError unless ``mode`` is ``"auto"`` or ``"off"``."""
    if mode not in ("auto", "off"):
        raise ConfigurationError(
            f"deletion_vectors must be 'auto' (an upsert marks the rows it replaces in deletion "
            "vectors where the table enables them) or 'off' (it rewrites the files), got "
            f"{mode!r}"
        )


def merges_on_read(mode: DeletionVectorMode, table: DeltaTable | None) -> bool:
    """Whether an upsert into ``table`` marks replaced rows in deletion vectors: ``mode`` is
    ``"auto"`` and the table enables them (its property and both features). (Its commits go
    through the sink's log writer, as every rewrite of a table with vectors: upserts into such
    tables on other storage than local and S3 are refused before they start.)"""
    if mode != "auto" or table is None:
        return False
    configuration = table.metadata().configuration
    writer = set(table.protocol().writer_features or ())
    return (
        str(configuration.get(ENABLE_DELETION_VECTORS, "false")).lower() == "true"
        and "deletionVectors" in reader_features(table)[1]
        and "deletionVectors" in writer
    )


class MarkableFile(Protocol):
    """A live file as a merge-on-read rewrite read it, with what its re-add repeats."""

    @property
    def path(self) -> str: ...  # decoded, relative to the root

    @property
    def size(self) -> int: ...

    @property
    def records(self) -> int | None: ...  # live rows: its deletion vector's not counted

    @property
    def deletion_vector(self) -> DeletionVectorDescriptor | None: ...

    @property
    def logged_stats(self) -> str | None: ...  # as its add logs them

    @property
    def modification_time(self) -> int | None: ...


def can_mark(files: Sequence[MarkableFile]) -> bool:
    """Whether every file's add logs what its re-add must repeat: its row count (a vector's
    add must carry the physical file's ``numRecords``) and its modification time."""
    return all(f.records is not None and f.modification_time is not None for f in files)


def mark_rows(
    location: TableLocation,
    touched: Sequence[MarkableFile],
    positions: Mapping[str, np.ndarray],
    deleted: Mapping[str, np.ndarray],
    partition_values: Sequence[Mapping[str, str | None]],
    directory: str,
) -> tuple[MarkedFile, ...]:
    """Write one vector file into ``directory`` (relative to the root, owned by the run's
    manifest) with a vector per touched file: its old vector's rows (``deleted``, by path) and
    the rows the batch replaces (``positions``, by path); the files to add back with them.

    Raises:
        OSError: the vector file could not be written (nothing is committed; the run's
            clean-up deletes what was written).
    """
    bitmaps = []
    for f in touched:
        bitmap = BitMap64(deleted.get(f.path, np.empty(0, np.uint64)).tolist())
        bitmap.update(positions[f.path].tolist())
        bitmaps.append(bitmap)
    _, vectors = write_vector_file(location, bitmaps, prefix=directory)
    return tuple(
        MarkedFile(
            path=f.path,
            size=f.size,
            partition_values=values,
            modification_time=int(f.modification_time or 0),
            stats=_loose_stats(f),
            vector=vector,
        )
        for f, values, vector in zip(touched, partition_values, vectors, strict=True)
    )


def _loose_stats(f: MarkableFile) -> str:
    """``f``'s logged stats with ``tightBounds: false``: its bounds and null counts stay
    those of every physical row (PROTOCOL.md, "Per-file Statistics"); without logged stats,
    the row count alone. Edited as text: a decimal bound must keep every digit its writer
    logged, which a round trip through Python floats would not."""
    physical = (f.records or 0) + (f.deletion_vector.cardinality if f.deletion_vector else 0)
    text = (f.logged_stats or "").strip()
    parsed = json.loads(text) if text else None
    if not isinstance(parsed, dict) or not parsed:
        return json.dumps({"numRecords": physical, "tightBounds": False}, separators=(",", ":"))
    if "tightBounds" in parsed:  # (top level, a boolean: no column statistic looks like it)
        return _TIGHT.sub('"tightBounds":false', text, count=1)
    extra = "" if "numRecords" in parsed else f'"numRecords":{physical},'
    return f'{text[:-1].rstrip()},{extra}"tightBounds":false}}'


_TIGHT = re.compile(r'"tightBounds"\s*:\s*(?:true|false)')


def check_marked(
    uri: str,
    rows: int,
    upserts: int,
    touched: list[_LiveFile],
    marked: tuple[MarkedFile, ...],
    replaced: int,
) -> None:
    """A merge-on-read batch wrote exactly its new rows, and its new vectors delete exactly
    the ``replaced`` rows more than the old ones did.

    Raises:
        RowCountMismatchError: otherwise; nothing was committed.
    """
    before = sum(f.deletion_vector.cardinality for f in touched if f.deletion_vector)
    marks = sum(m.vector.cardinality for m in marked) - before
    if rows != upserts or marks != replaced:
        raise RowCountMismatchError(
            f"the upsert into {uri} wrote {rows} new rows and marked {marks} rows deleted "
            f"where the batch adds {upserts} and replaces {replaced}; nothing was committed."
        )


def counted_positions(rows: pa.Table, positions: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """The counts per (file, delete, applies) of matched ``rows`` (as Spark's ``groupBy``
    gives them), filling ``positions`` with the sorted row indexes of the applied ones by
    file (as ``rows`` spell the file)."""
    counted = rows.group_by([_FILE, _DELETE, _APPLIES]).aggregate([([], "count_all")])
    applied = rows.filter(rows.column(_APPLIES))
    files = applied.column(_FILE).to_pylist()
    indexes = applied.column(_ROW_INDEX).to_numpy().astype(np.uint64)
    by_file: dict[str, list[int]] = {}
    for number, path in enumerate(files):
        by_file.setdefault(path, []).append(number)
    for path, numbers in by_file.items():
        positions[path] = np.sort(indexes[numbers])
    names = ["count" if c == "count_all" else c for c in counted.column_names]
    rows_counted: list[dict[str, Any]] = counted.rename_columns(names).to_pylist()
    return rows_counted
