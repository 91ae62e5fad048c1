"""Delta file statistics computed from the Parquet footer the writer just produced.

Reading the footer costs nothing extra (the writer has it in memory) and guarantees the stats
describe exactly the bytes in the file. Min/max are recorded for top-level numeric, string,
date and timestamp columns; nullCount for every top-level column. A statistic that cannot be
stated exactly (NaN bounds, long strings' maxima, nested columns) is omitted, which readers
treat as "unknown" and never as a wrong answer.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["STRING_STATS_PREFIX", "delta_stats"]

STRING_STATS_PREFIX = 32  # as Delta's Spark writer: a prefix is a valid lower bound
# Floating-point columns get a min but no max (see delta_stats).


def _json_value(value: Any, arrow_type: pa.DataType, is_max: bool) -> Any:
    """Convert a Parquet statistic to its Delta JSON form, or None to omit it."""
    if value is None:
        return None
    if isinstance(value, bool):
        return None  # Delta keeps no min/max for booleans
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, int):
        return value
    if isinstance(value, decimal.Decimal):
        # JSON numbers are read back as doubles: only state values a double holds exactly.
        exact = value.is_finite() and len(value.as_tuple().digits) <= 15
        return float(value) if exact else None
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        text = value.isoformat(timespec="milliseconds")
        if is_max and value.microsecond % 1000:
            # Millisecond precision truncates downwards; a max must not shrink below the data.
            bumped = value.replace(microsecond=value.microsecond - value.microsecond % 1000)
            text = (bumped + datetime.timedelta(milliseconds=1)).isoformat(timespec="milliseconds")
        return text + ("Z" if arrow_type.tz else "")
    if isinstance(value, datetime.date):
        return value.isoformat()
    if isinstance(value, str):
        if len(value) <= STRING_STATS_PREFIX:
            return value
        return None if is_max else value[:STRING_STATS_PREFIX]
    return None


def delta_stats(metadata: pq.FileMetaData, schema: pa.Schema) -> str:
    """Delta ``stats`` JSON for a file with Arrow ``schema`` and Parquet footer ``metadata``."""
    top_level = {name: schema.field(name).type for name in schema.names}
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = dict.fromkeys(top_level, 0)
    no_min: set[str] = set()
    no_max: set[str] = set()
    for rg in range(metadata.num_row_groups):
        row_group = metadata.row_group(rg)
        for ci in range(row_group.num_columns):
            column = row_group.column(ci)
            name = column.path_in_schema
            arrow_type = top_level.get(name)
            if arrow_type is None:  # nested leaf: path is "a.b"; keep no stats for it
                root = name.split(".", 1)[0]
                if root in nulls:
                    no_min.add(root)
                    no_max.add(root)
                    nulls.pop(root, None)
                continue
            stats = column.statistics
            if stats is None:
                no_min.add(name)
                no_max.add(name)
                nulls.pop(name, None)
                continue
            if name in nulls:
                nulls[name] += stats.null_count if stats.null_count is not None else 0
            if not stats.has_min_max:
                if stats.null_count != column.num_values:
                    no_min.add(name)  # values exist but bounds are unknown
                    no_max.add(name)
                continue
            lo = _json_value(stats.min, arrow_type, is_max=False)
            # Parquet bounds leave NaN out, but NaN sorts above every number in Spark SQL and
            # Delta: a float max from the footer could wrongly skip a file holding NaN.
            floating = pa.types.is_floating(arrow_type)
            hi = None if floating else _json_value(stats.max, arrow_type, is_max=True)
            if lo is None:
                no_min.add(name)
            elif name not in mins or lo < mins[name]:
                mins[name] = lo
            if hi is None:
                no_max.add(name)
            elif name not in maxs or hi > maxs[name]:
                maxs[name] = hi
    for name in no_min:
        mins.pop(name, None)
    for name in no_max:
        maxs.pop(name, None)
    return json.dumps(
        {
            "numRecords": metadata.num_rows,
            "minValues": mins,
            "maxValues": maxs,
            "nullCount": nulls,
        },
        separators=(",", ":"),
        default=str,
    )
