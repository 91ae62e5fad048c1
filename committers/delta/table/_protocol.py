"""Which Delta reader and writer features a table asks for, and whether this sink can honour them.

A Delta writer must honour every writer feature of the table's protocol or not write at all
(PROTOCOL.md, "Writer Requirements"). Features come from ``writerFeatures`` on writer version 7,
and are implied by the version number on older (legacy) protocols. This module names them and
refuses, with the feature's name and what to do, every table the sink cannot write correctly.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from framework.errors import DestinationError

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = [
    "APPEND_ONLY",
    "DELTA_RS_REFUSES",
    "ENFORCED_FEATURES",
    "TableFeatures",
    "UnsupportedTableFeatureError",
    "check_appends_only",
    "check_replaceable",
    "protocol_reader_features",
    "reader_features",
    "recorded_in_commit_timestamp",
    "uses_in_commit_timestamps",
]

#: The table property that forbids removing rows (PROTOCOL.md, "Append-only Tables").
APPEND_ONLY = "delta.appendOnly"

# Features implied by a legacy writer version (each version includes the ones below it).
_LEGACY_WRITER_FEATURES = {
    2: ("appendOnly", "invariants"),
    3: ("checkConstraints",),
    4: ("changeDataFeed", "generatedColumns"),
    5: ("columnMapping",),
    6: ("identityColumns",),
}

#: Writer features delta-rs 1.6 refuses to commit to ("Unsupported table features
#: required"), which the sink honours: its own log writer commits to such tables, and
#: metadata changes made through delta-rs (columns added by schema_mode="merge") are refused.
DELTA_RS_REFUSES = frozenset(
    {
        "allowColumnDefaults",
        "inCommitTimestamp",
        "clustering",
        "domainMetadata",
        "rowTracking",
        "typeWidening",
    }
)

# Features the sink honours when it appends. How each is honoured:
ENFORCED_FEATURES = {
    "appendOnly": "the sink only appends",
    "invariants": "checked on every row in the Spark tasks",
    "checkConstraints": "checked on every row in the Spark tasks",
    "generatedColumns": "computed when absent, checked when given",
    "columnMapping": "files, stats and partition values use physical names and field ids",
    "changeDataFeed": "rewrites of files (upserts, replace_where on data columns) commit "
    "change files with their data; appends and whole-file overwrites need none (their adds "
    "and removes are the change data)",
    "identityColumns": "appends generate values beyond each column's high-water mark and "
    "advance it in their commit; operations that remove rows are refused",
    "deletionVectors": "appends add no deletion vectors",
    "timestampNtz": "written as Parquet timestamps without time zone",
    "allowColumnDefaults": "a column the input lacks gets its default (its CURRENT_DEFAULT, "
    "evaluated by Spark once per batch, as delta-spark does per statement); a value given, "
    "NULL included, is kept",
    "inCommitTimestamp": "every commit's commitInfo comes first with an inCommitTimestamp "
    "after the previous commit's; time travel by timestamp resolves versions by them",
    "v2Checkpoint": "checkpoints are written by delta-rs in the table's format",
    "rowTracking": "appends give every file a baseRowId above the table's high-water mark "
    "and a defaultRowCommitVersion, and advance the mark in the same commit; rewrites keep "
    "the ids and commit versions of the rows they copy (updates keep their ids)",
    "typeWidening": "appends and rewrites write the current (widened) types, rewrites read "
    "older files' narrower types as the current ones, and the schema's delta.typeChanges "
    "are kept",
    "domainMetadata": "the table's domains are kept as they are (the sink's commits carry "
    "none; delta-rs's checkpoints keep them)",
    "clustering": "every file's stats cover every column, the clustering columns included; "
    "files are added unclustered (no clusteringProvider), for the table's clustering to "
    "recluster",
    # delta-rs enables it on every table it upgrades to writer version 7; a variant column
    # itself is refused as a type the sink cannot write.
    "variantType": "variant columns are refused by type",
    "variantType-preview": "variant columns are refused by type",
}

# Why the others are refused (delta-rs cannot commit to these tables either).
_REFUSED_FEATURES = {
    "icebergCompatV1": "Iceberg compatibility metadata is not written by this sink",
    "icebergCompatV2": "Iceberg compatibility metadata is not written by this sink",
    "vacuumProtocolCheck": "delta-rs does not support it for writes",
}


class UnsupportedTableFeatureError(DestinationError):
    """The table requires a writer feature this sink cannot honour; nothing was written."""


@dataclass(frozen=True)
class TableFeatures:
    """The writer features a table's protocol enables."""

    min_writer_version: int
    enabled: frozenset[str]

    @classmethod
    def of(cls, min_writer_version: int, writer_features: Iterable[str] | None) -> TableFeatures:
        if min_writer_version >= 7:
            return cls(min_writer_version, frozenset(writer_features or ()))
        implied = [
            feature
            for version, features in _LEGACY_WRITER_FEATURES.items()
            if min_writer_version >= version
            for feature in features
        ]
        return cls(min_writer_version, frozenset(implied))

    def __contains__(self, feature: object) -> bool:
        return feature in self.enabled

    def check_writable(self, table_uri: str) -> None:
        """Refuse a table with a writer feature this sink cannot honour.

        Raises:
            UnsupportedTableFeatureError: naming each such feature and why.
        """
        refused = sorted(self.enabled - ENFORCED_FEATURES.keys())
        if not refused:
            return
        reasons = "; ".join(
            f"{name}: {_REFUSED_FEATURES.get(name, 'unknown to this sink')}" for name in refused
        )
        legacy = (
            ""
            if self.min_writer_version >= 7
            else (f" (implied by legacy writer version {self.min_writer_version})")
        )
        raise UnsupportedTableFeatureError(
            f"table {table_uri} requires the writer feature(s) {', '.join(refused)}{legacy}, "
            f"which this sink cannot honour ({reasons}). Writing anyway could corrupt the "
            "table for other readers, so nothing was written. Write to this table with an "
            "engine that supports the feature (delta-spark), or to a table without it."
        )


def check_replaceable(configuration: Mapping[str, str], table_uri: str, operation: str) -> None:
    """Refuse an ``operation`` that replaces the table's rows (an overwrite, complete mode) on
    an append-only table: Delta forbids removing its files with ``dataChange=true``, so the
    commit could never land. Checked before anything is staged.

    Raises:
        UnsupportedTableFeatureError: ``delta.appendOnly`` is ``true`` in ``configuration``.
    """
    if str(configuration.get(APPEND_ONLY, "false")).lower() != "true":
        return
    raise UnsupportedTableFeatureError(
        f"{operation} cannot write {table_uri}: it is append-only ({APPEND_ONLY}=true), and "
        f"{operation} removes its rows, which Delta forbids on such a table. Nothing was "
        "written. Append to it (mode='append'), or, if rows may be removed, unset the "
        f"property first (delta-spark: ALTER TABLE ... SET TBLPROPERTIES ('{APPEND_ONLY}' = "
        "'false'))."
    )


#: Writer features of tables the sink writes by appending only, and why.
_APPENDS_ONLY = {
    "identityColumns": "the table has identity columns (writer feature identityColumns), and "
    "the sink writes such tables by appending only (its appends generate the values and "
    "advance the high-water marks); delta-rs, which commits the sink's other operations, "
    "refuses the feature",
}


def check_appends_only(features: TableFeatures, table_uri: str, operation: str) -> None:
    """Refuse an ``operation`` other than an append (an overwrite, complete mode, an upsert, a
    compaction) on a table the sink writes by appending only (identity columns), before
    anything is staged.

    Raises:
        UnsupportedTableFeatureError: the table enables such a feature.
    """
    for feature, why in _APPENDS_ONLY.items():
        if feature in features:
            raise UnsupportedTableFeatureError(
                f"{operation} cannot write {table_uri}: {why}. Nothing was written. Append to "
                "it (mode='append'), or run this operation with delta-spark (MERGE, INSERT "
                "OVERWRITE, OPTIMIZE)."
            )


# Features implied by a legacy reader version (3 lists them explicitly).
_LEGACY_READER_FEATURES = {2: ("columnMapping",)}


def reader_features(table: DeltaTable) -> tuple[int, frozenset[str]]:
    """The table's reader version and the reader features it enables (explicit on version 3,
    implied by the version number before)."""
    protocol = table.protocol()
    version = int(protocol.min_reader_version)
    return version, protocol_reader_features(version, protocol.reader_features)


def protocol_reader_features(
    min_reader_version: int, listed: Iterable[str] | None
) -> frozenset[str]:
    """The reader features a protocol enables: ``listed`` on reader version 3, the ones the
    version number implies before."""
    if min_reader_version >= 3:
        return frozenset(listed or ())
    return frozenset(
        f for v, names in _LEGACY_READER_FEATURES.items() if min_reader_version >= v for f in names
    )


IN_COMMIT_TIMESTAMPS_KEY = "delta.enableInCommitTimestamps"


def uses_in_commit_timestamps(configuration: Mapping[str, str | None]) -> bool:
    """Whether a table's configuration turns in-commit timestamps on."""
    return str(configuration.get(IN_COMMIT_TIMESTAMPS_KEY, "false")).strip().lower() == "true"


def recorded_in_commit_timestamp(commit: bytes) -> int | None:
    """The ``inCommitTimestamp`` (milliseconds) a commit file's content records, if any: it is
    in the ``commitInfo``, which such commits write first (only the first line is parsed)."""
    try:
        info = json.loads(commit.split(b"\n", 1)[0]).get("commitInfo") or {}
    except (ValueError, AttributeError):
        return None
    stamp = info.get("inCommitTimestamp")
    return None if stamp is None else int(stamp)
