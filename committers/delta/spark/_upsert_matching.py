"""Which touched files hold the rows an upsert batch replaces, mixed into
:class:`~committers.delta.spark._upsert.UpsertStager` (step 3 of its module docstring): the
driver's key matching in pyarrow when it can (:mod:`committers.delta.spark._upsert_touched`),
else a Spark join of the candidates' keys with the batch's changes; the stale changes; and,
for merge-on-read, the row indexes of the replaced rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from committers.delta.spark._upsert_candidates import BatchKeys
from committers.delta.spark._upsert_marks import counted_positions
from committers.delta.spark._upsert_stored import (
    _APPLIES,
    _DELETE,
    _FILE,
    _ROW_INDEX,
    StoredRows,
    _applies,
    _key,
    _LiveFile,
    _stored,
)
from committers.delta.spark._upsert_touched import (
    Candidate,
    KeyColumn,
    KeysToDrop,
    Matches,
    SequenceColumn,
    driver_matches,
    keys_to_drop,
)
from committers.delta.table._delta_schema import arrow_type, quote, spark_type
from committers.delta.write._options import Staging
from framework.errors import StagingError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["MatchedRows"]


@dataclass(frozen=True)
class _Stale:
    """The batch's stale changes (older than a row they match: not applied): how many, how
    many are not deletes, and their keys (positional names) to leave out of the new rows."""

    changes: int = 0
    upserts: int = 0
    keys: DataFrame | None = None


class MatchedRows(StoredRows):
    """The matching of an upsert batch's changes with the table's rows (see the module
    docstring); :class:`~committers.delta.spark._upsert.UpsertStager` defines the attributes."""

    _staging: Staging

    def _touched(
        self,
        session: SparkSession,
        candidates: list[_LiveFile],
        actions: pa.Table | None,
        keys: BatchKeys,
        batch_changes: Callable[[], DataFrame],
        positions: dict[str, np.ndarray] | None = None,
    ) -> tuple[list[_LiveFile], dict[tuple[str, bool], int], _Stale]:
        """The candidates holding a row the batch replaces, those rows per (file, delete), and
        the stale changes: counted on the driver when it can
        (:mod:`committers.delta.spark._upsert_touched`), else by a Spark join of the candidates'
        keys with the batch's changes (``batch_changes()``, planned only then). Given
        ``positions``, it is filled with the row indexes the batch replaces, by decoded path
        (what merge-on-read marks in deletion vectors)."""
        from pyspark.sql import functions as F

        if not candidates:
            return [], {}, _Stale()
        assert actions is not None
        on_driver = self._driver_matches(candidates, keys)
        if on_driver is not None:
            holding = {i for i, _ in on_driver.rows}
            touched = [f for i, f in enumerate(candidates) if i in holding]
            rows = {
                (candidates[i].logged_path, delete): n for (i, delete), n in on_driver.rows.items()
            }
            if positions is not None:
                positions.update({candidates[i].path: p for i, p in on_driver.positions.items()})
            return touched, rows, self._collected_stale(session, on_driver.stale)
        partition_by = set(self._plan.shape.partition_by)
        data_keys = [k for k in self._upsert.table_keys if k not in partition_by]
        sequence = list(self._upsert.table_sequence)
        marking = positions is not None
        scan, by_key = self._scan(
            session, candidates, [*data_keys, *sequence] or self._data_columns()[:1], marking
        )
        if len(data_keys) < len(self._upsert.table_keys):
            scan = scan.join(self._partitions(session, by_key, actions), on=_FILE)
        stored = scan.select(
            F.col(_FILE),
            *[F.col(quote(k)).alias(_key(i)) for i, k in enumerate(self._upsert.table_keys)],
            *[F.col(quote(c)).alias(_stored(i)) for i, c in enumerate(sequence)],
            *([F.col(_ROW_INDEX)] if marking else []),
        )
        names = [_key(i) for i in range(len(self._upsert.table_keys))]
        joined = stored.join(batch_changes(), on=names).withColumn(_APPLIES, _applies(sequence))
        counted: list[Any]
        if positions is not None:  # the matched rows themselves, in the job that counts them
            counted = counted_positions(
                joined.select(_FILE, _DELETE, _APPLIES, _ROW_INDEX).toArrow(), positions
            )
        else:
            counted = joined.groupBy(_FILE, _DELETE, _APPLIES).count().collect()
        matched: dict[tuple[str, bool], int] = {}
        stale_rows = 0
        for row in counted:
            path = row[_FILE]
            if path not in by_key:
                raise StagingError(
                    f"the upsert into {self._location.uri} read a row of {path!r}, which is not "
                    "a file it asked Spark to read; nothing was committed"
                )
            if row[_APPLIES]:
                matched[(path, bool(row[_DELETE]))] = int(row["count"])
            else:
                stale_rows += int(row["count"])
        touched_paths = {path for path, _ in matched}
        touched = [f for path, f in by_key.items() if path in touched_paths]
        if positions is not None:  # (by the file's own path, as the driver's)
            for key in list(positions):
                positions[by_key[key].path] = positions.pop(key)
        stale = _Stale()
        if stale_rows:  # one more job, only then: which changes they are
            stale_keys = joined.where(~F.col(_APPLIES)).select(*names, _DELETE).distinct()
            count = stale_keys.agg(F.count(F.lit(1)), F.count_if(~F.col(_DELETE))).first()
            assert count is not None
            stale = _Stale(int(count[0]), int(count[1]), stale_keys.select(*names))
        return touched, {(by_key[p].logged_path, d): n for (p, d), n in matched.items()}, stale

    def _collected_stale(self, session: SparkSession, stale: pa.Table) -> _Stale:
        """The stale changes the driver found (keys typed as the table, delete flags)."""
        from pyspark.sql import functions as F

        if stale.num_rows == 0:
            return _Stale()
        names = [_key(i) for i in range(len(self._upsert.keys))]
        fields = {f.name: f for f in self._plan.shape.schema.fields}
        keys = session.createDataFrame(stale.select(names)).select(
            *[
                F.col(n).cast(spark_type(fields[k].type, physical=False)).alias(n)
                for n, k in zip(names, self._upsert.table_keys, strict=True)
            ]
        )
        deletes = sum(map(bool, stale.column(_DELETE).to_pylist()))
        return _Stale(stale.num_rows, stale.num_rows - deletes, F.broadcast(keys))

    def _driver_matches(self, candidates: list[_LiveFile], keys: BatchKeys) -> Matches | None:
        if keys.collected is None:
            return None
        columns = self._key_columns()
        deleted = self._deleted_rows(candidates)  # (DeletionVectorError: the file named)
        files = [
            Candidate(
                path=f.path,
                size=f.size,
                partition_values=tuple(
                    b[0] if c.partition and b is not None else None
                    for c, b in zip(columns, f.bounds, strict=True)
                ),
                deleted=deleted.get(f.path),
            )
            for f in candidates
        ]
        try:
            return driver_matches(
                self._location, columns, files, keys.collected, self._sequence_columns()
            )
        except (OSError, pa.ArrowException) as err:
            raise StagingError(
                f"the upsert into {self._location.uri} could not read a file of the snapshot it "
                f"rewrites ({type(err).__name__}: {err}); nothing was committed. It may have "
                "been deleted by a VACUUM with too short a retention, or damaged."
            ) from err

    def _keys_to_drop(self, keys: BatchKeys) -> KeysToDrop | None:
        """The filter that drops the replaced rows in Python tasks, or ``None`` when Spark
        must: ``staging="spark"``, keys not collected, or keys or sequence values that do not
        cast exactly."""
        if self._staging == "spark" or keys.collected is None:
            return None
        return keys_to_drop(self._key_columns(), keys.collected, self._sequence_columns())

    def _key_columns(self) -> list[KeyColumn]:
        fields = {f.name: f for f in self._plan.shape.schema.fields}
        partition_by = set(self._plan.shape.partition_by)
        return [
            KeyColumn(
                k,
                arrow_type(fields[k].type, physical=False),
                k in partition_by,
                self._plan.shape.stored_name(k),
            )
            for k in self._upsert.table_keys
        ]

    def _sequence_columns(self) -> list[SequenceColumn]:
        fields = {f.name: f for f in self._plan.shape.schema.fields}
        return [
            SequenceColumn(
                s, arrow_type(fields[s].type, physical=False), self._plan.shape.stored_name(s)
            )
            for s in self._upsert.table_sequence
        ]
