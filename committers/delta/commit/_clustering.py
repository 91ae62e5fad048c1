"""Liquid clustering (PROTOCOL.md, "Clustered Table"): the clustering columns a table records in
its ``delta.clustering`` domain, the checks of ``DeltaSink(cluster_by=[...])``, and the first
commit of a clustered table, which the sink writes itself (delta-rs 1.6.6 can neither create
nor commit to such tables).

A clustered table's protocol supports the ``clustering`` and ``domainMetadata`` writer features;
its ``delta.clustering`` domain names the clustering columns by their physical paths; it has no
partition columns; every file has statistics for the clustering columns (delta-spark refuses
clustering columns outside the table's statistics columns, and so does the sink). The files
the sink writes carry no ``clusteringProvider``, so delta-spark's ``OPTIMIZE`` counts them as
unclustered; the sink's own compaction (:mod:`._compact`) spreads the rows it rewrites over its
files by ranges of the clustering columns.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake import Schema as DeltaSchema

from committers.delta.commit._log_append import LogView, LogViewUnavailable, commit_lines
from committers.delta.commit._log_store import LOG_DIR, LogStore
from committers.delta.storage._storage import TableLocation
from committers.delta.table._protocol import TableFeatures, UnsupportedTableFeatureError
from committers.delta.table._stats import has_min_max_stats
from framework.errors import ConfigurationError, SchemaMismatchError

__all__ = [
    "CLUSTERING_DOMAIN",
    "MAX_CLUSTERING_COLUMNS",
    "check_cluster_by",
    "check_clustering_kept",
    "clustering_columns",
    "create_clustered_table",
    "planned_clustering",
]

CLUSTERING_DOMAIN = "delta.clustering"
#: delta-spark's limit (``clusteredTable.numClusteringColumnsLimit``).
MAX_CLUSTERING_COLUMNS = 4
_CLUSTERING_FEATURES = ("domainMetadata", "clustering")
_NUM_INDEXED_COLS = "delta.dataSkippingNumIndexedCols"
_STATS_COLUMNS = "delta.dataSkippingStatsColumns"


def check_cluster_by(
    cluster_by: Sequence[str] | str | None, partition_by: Sequence[str]
) -> list[str]:
    """The ``cluster_by`` option as a list (empty: the sink creates no clustered table).

    Raises:
        ConfigurationError: not a list of distinct column names, more than
            :data:`MAX_CLUSTERING_COLUMNS`, or given with ``partition_by`` (a clustered table
            has no partition columns).
    """
    if cluster_by is None:
        return []
    columns = [cluster_by] if isinstance(cluster_by, str) else list(cluster_by)
    if not all(isinstance(c, str) and c for c in columns):
        raise ConfigurationError(f"cluster_by must list column names, got {cluster_by!r}")
    if len({c.lower() for c in columns}) != len(columns):
        raise ConfigurationError(f"cluster_by lists a column twice: {columns}")
    if len(columns) > MAX_CLUSTERING_COLUMNS:
        raise ConfigurationError(
            f"cluster_by lists {len(columns)} columns; a clustered table has at most "
            f"{MAX_CLUSTERING_COLUMNS} (delta-spark's limit). Cluster by the columns queries "
            "filter on most."
        )
    if columns and partition_by:
        raise ConfigurationError(
            f"cluster_by={columns} and partition_by={list(partition_by)} exclude each other: a "
            "clustered table has no partition columns. Give one of them."
        )
    return columns


def _check_clustering_columns(
    schema: pa.Schema, cluster_by: Sequence[str], configuration: Mapping[str, str], uri: str
) -> list[str]:
    """``cluster_by`` spelled as the columns of ``schema`` (the new table's) are, after checking
    that each can cluster a table.

    Raises:
        SchemaMismatchError: a column is not a top-level column of the input, or of a type
            without statistics to skip files by (delta-spark clusters by numbers, strings,
            dates and timestamps only), or outside the statistics columns ``configuration``
            names.
    """
    spelled = {name.lower(): name for name in schema.names}
    stats_columns = _stats_columns(schema, configuration)
    columns = []
    for wanted in cluster_by:
        name = spelled.get(wanted.lower())
        if name is None:
            raise SchemaMismatchError(
                f"cannot cluster {uri} by {wanted!r}: the input has no such top-level column "
                f"(it has {schema.names}). Name a column of the input."
            )
        t = schema.field(name).type
        if not has_min_max_stats(t):
            raise SchemaMismatchError(
                f"cannot cluster {uri} by {name!r}: its type {t} has no min/max statistics to "
                "skip files by. Cluster by numeric, string, date or timestamp columns."
            )
        if name not in stats_columns:
            raise SchemaMismatchError(
                f"cannot cluster {uri} by {name!r}: it is not among the columns the table "
                f"keeps statistics for ({_NUM_INDEXED_COLS} / {_STATS_COLUMNS}). Widen those "
                "in table_configuration, or move the column to the front of the input."
            )
        columns.append(name)
    return columns


def clustering_columns(location: TableLocation) -> list[str] | None:
    """The logical names of the columns ``location``'s table is clustered by (an empty list:
    clustered by nothing since an ``ALTER TABLE ... CLUSTER BY NONE``), or ``None`` when it is
    not a clustered table.

    Raises:
        UnsupportedTableFeatureError: the table's log cannot be followed to its domains.
    """
    try:
        view = LogView.load(LogStore(location))
    except LogViewUnavailable as err:
        raise UnsupportedTableFeatureError(
            f"cannot read the clustering columns of {location.uri}: the sink cannot follow its "
            f"log here ({err})."
        ) from err
    if "clustering" not in view.writer_features:
        return None
    domain = view.domains.get(CLUSTERING_DOMAIN)
    if domain is None or domain.get("removed"):
        return []
    paths = json.loads(domain["configuration"]).get("clusteringColumns") or []
    logical = _logical_names(json.loads(view.metadata["schemaString"]))
    return [".".join(logical.get(tuple(path), tuple(path))) for path in paths]


def create_clustered_table(
    location: TableLocation,
    schema: DeltaSchema,
    cluster_by: Sequence[str],
    adds: Sequence[Mapping[str, Any]],
    *,
    configuration: Mapping[str, str],
    txn: tuple[str, int] | None,
    custom_metadata: Mapping[str, Any],
) -> bool:
    """Write version 0 of a table clustered by ``cluster_by`` (columns of ``schema``) holding
    ``adds``: the protocol and metadata delta-rs would create for ``schema`` and
    ``configuration``, with the clustering features, the ``delta.clustering`` domain, the adds
    and ``txn``; one put-if-absent, so a failed write leaves no table. Returns ``False`` when
    another writer created the table first (nothing was written).

    Raises:
        UnsupportedTableFeatureError: the storage is neither local nor S3 (the sink's log
            writer's stores), or ``configuration`` asks for a feature whose commits the sink
            cannot write here (row tracking); nothing was written.
        OSError: the outcome of the write is unknown (the caller reconciles).
    """
    if not LogStore.supports(location):
        raise UnsupportedTableFeatureError(
            f"cannot create the clustered table {location.uri}: delta-rs cannot create one, "
            "and the sink's own log writer writes only to local and S3 tables. Nothing was "
            "written."
        )
    protocol, metadata = _new_table_actions(schema, configuration)
    if "rowTracking" in (protocol.get("writerFeatures") or ()):
        raise UnsupportedTableFeatureError(
            f"cannot create {location.uri} clustered with row tracking: the sink numbers rows "
            "only on tables that already track them. Create the table with delta-spark "
            "(CREATE TABLE ... CLUSTER BY ... TBLPROPERTIES ('delta.enableRowTracking' = "
            "'true')), and the sink writes into it. Nothing was written."
        )
    physical = _physical_names(json.loads(metadata["schemaString"]))
    domain = {
        "domain": CLUSTERING_DOMAIN,
        "configuration": json.dumps(
            {
                "clusteringColumns": [[physical[c]] for c in cluster_by],
                "domainName": CLUSTERING_DOMAIN,
            },
            separators=(",", ":"),
        ),
        "removed": False,
    }
    parameters = {"clusterBy": json.dumps(list(cluster_by), separators=(",", ":"))}
    data = commit_lines(
        adds,
        txn=txn,
        custom_metadata={**custom_metadata, "operationParameters": parameters},
        partition_by=[],
        now_ms=int(time.time() * 1000),
        protocol_action=_with_clustering(protocol),
        metadata_action=metadata,
        domains=[domain],
        mode="ErrorIfExists",
    )
    if location.is_local:  # (an object store has no directories to make)
        os.makedirs(location.path(LOG_DIR), exist_ok=True)
    return LogStore(location).put_if_absent(f"{0:020d}.json", data)


def _new_table_actions(
    schema: DeltaSchema, configuration: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``protocol`` and ``metaData`` actions delta-rs writes when it creates a table of
    ``schema`` with ``configuration`` (it decides the features a schema and properties need;
    the table is created empty in a temporary directory and read back)."""
    with tempfile.TemporaryDirectory(prefix="clustered-") as scratch:
        DeltaTable.create(scratch, schema, configuration=dict(configuration) or None)
        lines = (Path(scratch) / "_delta_log" / f"{0:020d}.json").read_text().splitlines()
    actions = [json.loads(line) for line in lines]
    protocol = next(a["protocol"] for a in actions if "protocol" in a)
    metadata = next(a["metaData"] for a in actions if "metaData" in a)
    return protocol, metadata


def _with_clustering(protocol: Mapping[str, Any]) -> dict[str, Any]:
    """``protocol`` at writer version 7, supporting the clustering features too."""
    version = int(protocol["minWriterVersion"])
    features = list(protocol.get("writerFeatures") or ())
    if version < 7:  # the features the legacy version implies, named
        features = sorted(TableFeatures.of(version, None).enabled)
    features += [f for f in _CLUSTERING_FEATURES if f not in features]
    return {**protocol, "minWriterVersion": 7, "writerFeatures": features}


def _stats_columns(schema: pa.Schema, configuration: Mapping[str, str]) -> set[str]:
    """The top-level columns a table of ``schema`` keeps statistics for (PROTOCOL.md,
    "Per-file Statistics": the columns ``delta.dataSkippingStatsColumns`` names, else the first
    ``delta.dataSkippingNumIndexedCols`` leaf columns, 32 by default, -1 for all)."""
    named = configuration.get(_STATS_COLUMNS)
    if named:
        listed = {c.strip().strip("`").lower() for c in named.split(",")}
        return {name for name in schema.names if name.lower() in listed}
    limit = int(configuration.get(_NUM_INDEXED_COLS, "32"))
    kept, leaves = set(), 0
    for field in schema:
        if limit >= 0 and leaves >= limit:
            break
        kept.add(field.name)
        leaves += _leaf_count(field.type)
    return kept


def _leaf_count(t: pa.DataType) -> int:
    if pa.types.is_struct(t):
        return sum(_leaf_count(t.field(i).type) for i in range(t.num_fields))
    return 1


def _physical_names(schema: Mapping[str, Any]) -> dict[str, str]:
    """Top-level column -> its physical name (the name itself without column mapping)."""
    return {
        f["name"]: (f.get("metadata") or {}).get("delta.columnMapping.physicalName", f["name"])
        for f in schema["fields"]
    }


def _logical_names(schema: Mapping[str, Any]) -> dict[tuple[str, ...], tuple[str, ...]]:
    """Physical path -> logical path of every field of a Delta schema (as JSON)."""
    found: dict[tuple[str, ...], tuple[str, ...]] = {}

    def visit(
        fields: Sequence[Mapping[str, Any]], physical: tuple[str, ...], logical: tuple[str, ...]
    ) -> None:
        for f in fields:
            name = (f.get("metadata") or {}).get("delta.columnMapping.physicalName", f["name"])
            p, n = (*physical, name), (*logical, f["name"])
            found[p] = n
            if isinstance(f["type"], dict) and f["type"].get("type") == "struct":
                visit(f["type"]["fields"], p, n)

    visit(schema["fields"], (), ())
    return found


def check_clustering_kept(
    location: TableLocation, schema: pa.Schema, configuration: Mapping[str, str]
) -> None:
    """Before an overwrite replaces the schema of a clustered table (which keeps its
    clustering, as delta-spark's ``overwriteSchema`` does): every clustering column must be a
    column of the new ``schema`` that can cluster a table.

    Raises:
        SchemaMismatchError: naming the clustering column the new schema lacks or cannot
            cluster by; nothing was written.
        UnsupportedTableFeatureError: the clustering cannot be read.
    """
    current = clustering_columns(location)
    if not current:
        return
    try:
        _check_clustering_columns(schema, current, configuration, location.uri)
    except SchemaMismatchError as err:
        raise SchemaMismatchError(
            f"the overwrite replaces the schema of {location.uri}, which is clustered by "
            f"{current} and stays so: {err} Keep the clustering columns in the input, or "
            "change the clustering first (delta-spark: ALTER TABLE ... CLUSTER BY ...). "
            "Nothing was written."
        ) from err


def planned_clustering(
    location: TableLocation,
    table_exists: bool,
    schema: pa.Schema,
    cluster_by: Sequence[str],
    configuration: Mapping[str, str],
) -> list[str]:
    """The columns a table the sink creates is clustered by (``cluster_by`` checked against
    the input ``schema``, spelled as it spells them), or ``[]``; for an existing table,
    ``cluster_by`` must be its clustering.

    Raises:
        SchemaMismatchError: see :func:`_check_clustering_columns`; or the existing table is not
            clustered by exactly ``cluster_by``.
        UnsupportedTableFeatureError: the clustering of the existing table cannot be read.
    """
    if not cluster_by:
        return []
    if not table_exists:
        return _check_clustering_columns(schema, cluster_by, configuration, location.uri)
    current = clustering_columns(location)
    if current is None or [c.lower() for c in current] != [c.lower() for c in cluster_by]:
        what = "not clustered" if current is None else f"clustered by {current}"
        raise SchemaMismatchError(
            f"table {location.uri} is {what}, but the write asks for cluster_by="
            f"{list(cluster_by)}. Leave cluster_by out to write it as it is, or change its "
            f"clustering with delta-spark (ALTER TABLE ... CLUSTER BY ({', '.join(cluster_by)}))."
        )
    return []
