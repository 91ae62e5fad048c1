"""The row ids and row commit versions of a row-tracking table's rows, for rewrites that copy
rows and must keep them (PROTOCOL.md, "Row Tracking"): a row's id is the value of the file's
materialized row id column where it has one, else the file's ``baseRowId`` plus the row's
physical position in the file; its commit version is the materialized commit version, else
the file's ``defaultRowCommitVersion``. A copy keeps both by writing them into the
materialized columns, whose names the table's configuration gives
(``delta.rowTracking.materializedRowIdColumnName`` and ``...RowCommitVersionColumnName``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from committers.delta.read._source import DeltaFileReader
from committers.delta.storage._storage import TableLocation
from committers.delta.table._live_vectors import live_adds
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._snapshot import Snapshot
from framework.source import FileSplit

__all__ = ["RowLineage", "RowLineageReader", "assigns_row_ids", "keeps_row_ids", "row_lineage"]

MATERIALIZED_ROW_ID = "delta.rowTracking.materializedRowIdColumnName"
MATERIALIZED_ROW_COMMIT_VERSION = "delta.rowTracking.materializedRowCommitVersionColumnName"
_SUSPENDED = "delta.rowTrackingSuspended"
ROW_TRACKING_ENABLED = "delta.enableRowTracking"


def assigns_row_ids(table: DeltaTable) -> bool:
    """Whether commits to ``table`` must assign row ids: the feature is supported and not
    suspended."""
    features = table.protocol().writer_features or ()
    suspended = str(table.metadata().configuration.get(_SUSPENDED, "false")).lower() == "true"
    return "rowTracking" in features and not suspended


def keeps_row_ids(table: DeltaTable) -> bool:
    """Whether rewrites of ``table`` must keep the stable ids and commit versions of the rows
    they copy or update: row tracking is assigned and enabled (``delta.enableRowTracking``).
    Supported but not enabled, writers cannot preserve them (PROTOCOL.md): fresh ids only."""
    enabled = str(table.metadata().configuration.get(ROW_TRACKING_ENABLED, "false")).lower()
    return assigns_row_ids(table) and enabled == "true"


@dataclass(frozen=True)
class RowLineage:
    """What a rewrite of some files of a row-tracking table carries over.

    Attributes:
        id_column, version_column: the materialized columns the copies are written with.
        files: decoded path -> (``baseRowId``, ``defaultRowCommitVersion``) of each file.
    """

    id_column: str
    version_column: str
    files: tuple[tuple[str, int, int], ...]

    @property
    def fields(self) -> list[pa.Field]:
        """The two columns as the rewritten files hold them."""
        return [pa.field(self.id_column, pa.int64()), pa.field(self.version_column, pa.int64())]


def row_lineage(
    location: TableLocation, configuration: Mapping[str, str], version: int, paths: Iterable[str]
) -> RowLineage:
    """The lineage of the files ``paths`` (decoded) at ``version``, from the log's adds.

    Raises:
        UnsupportedTableFeatureError: the configuration names no materialized columns, or a
            file has no ``baseRowId`` (added before row tracking was enabled and not yet
            backfilled); nothing was written.
    """
    id_column = configuration.get(MATERIALIZED_ROW_ID)
    version_column = configuration.get(MATERIALIZED_ROW_COMMIT_VERSION)
    if not id_column or not version_column:
        raise UnsupportedTableFeatureError(
            f"cannot rewrite files of {location.uri}: it tracks row ids but names no "
            f"materialized columns to keep them in ({MATERIALIZED_ROW_ID}, "
            f"{MATERIALIZED_ROW_COMMIT_VERSION}). Nothing was written."
        )
    adds = live_adds(location, version)
    files = []
    for path in paths:
        add: dict[str, Any] = adds.get(unquote(path)) or adds.get(path) or {}
        base, default = add.get("baseRowId"), add.get("defaultRowCommitVersion")
        if base is None or default is None:
            raise UnsupportedTableFeatureError(
                f"cannot rewrite {path!r} of {location.uri}: the file has no baseRowId or "
                "defaultRowCommitVersion (added before row tracking was enabled), so its rows' "
                "ids are not known yet. Nothing was written; let delta-spark backfill them "
                "(ALTER TABLE ... SET TBLPROPERTIES ('delta.enableRowTracking' = 'true'))."
            )
        files.append((path, int(base), int(default)))
    return RowLineage(id_column, version_column, tuple(files))


class RowLineageReader(DeltaFileReader):
    """A :class:`DeltaFileReader` whose batches also hold each row's id and commit version
    (the :class:`RowLineage` columns), as the files of ``lineage`` give them."""

    def __init__(self, snapshot: Snapshot, lineage: RowLineage) -> None:
        super().__init__(snapshot)
        self._lineage = lineage
        self._files = {path: (base, default) for path, base, default in lineage.files}
        self._lineage_schema = pa.schema([*super().schema, *lineage.fields])

    @property
    def schema(self) -> pa.Schema:
        return self._lineage_schema

    def _extra_columns(self, file: FileSplit, file_schema: pa.Schema) -> list[str]:
        wanted = (self._lineage.id_column, self._lineage.version_column)
        return [c for c in wanted if c in file_schema.names]

    def _finish(
        self, file: FileSplit, batch: pa.RecordBatch, raw: pa.RecordBatch | None, first_row: int
    ) -> pa.RecordBatch:
        base, default = self._files[file.path]
        rows = batch.num_rows
        fresh_ids = pa.array(np.arange(base + first_row, base + first_row + rows, dtype=np.int64))
        ids = _materialized(raw, self._lineage.id_column, fresh_ids)
        versions = _materialized(
            raw, self._lineage.version_column, pa.repeat(pa.scalar(default, pa.int64()), rows)
        )
        return pa.RecordBatch.from_arrays([*batch.columns, ids, versions], schema=self.schema)


def _materialized(raw: pa.RecordBatch | None, column: str, default: pa.Array) -> pa.Array:
    """The materialized ``column`` of ``raw`` where it is not null, else ``default``."""
    if raw is None or column not in raw.schema.names:
        return default
    stored = raw.column(column).cast(pa.int64())
    return pc.coalesce(stored, default)
