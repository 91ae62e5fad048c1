"""Row ids and row commit versions for the commits the sink's log writer writes to a table
with row tracking (PROTOCOL.md, "Row Tracking"): each ``add`` gets a ``baseRowId`` above the
table's high-water mark and a ``defaultRowCommitVersion`` equal to the commit's version, and
the same commit carries the ``delta.rowTracking`` domain with the new mark.

Appends add new rows: their stable id is their fresh id. The one rewrite written this way is
compaction, whose files (``dataChange=false``) carry each copied row's id and commit version
in the materialized columns (:mod:`committers.delta.read._row_lineage`), which override the
fresh ones. Other rewrites (an overwrite, an upsert) would copy rows without their ids: they
are refused before staging (``table/_protocol.check_appends_only``), and here. Either way the
commitInfo says ``delta.rowTracking.preserved``.

The mark is read from the log (its checkpoint's and later commits' ``domainMetadata``) at the
version the commit lands on top of; a commit landing first changes it, and the put-if-absent
of the next version fails, as every log-writer commit does under a race.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from committers.delta.commit._log_append import LogView, LogViewUnavailable
from committers.delta.commit._log_store import LogStore
from committers.delta.table._protocol import UnsupportedTableFeatureError

__all__ = ["ROW_TRACKING_DOMAIN", "RowIds", "assigns_row_ids", "row_ids"]

ROW_TRACKING_DOMAIN = "delta.rowTracking"
_SUSPENDED = "delta.rowTrackingSuspended"


def assigns_row_ids(table: DeltaTable) -> bool:
    """Whether commits to ``table`` must assign row ids: the feature is supported and not
    suspended."""
    features = table.protocol().writer_features or ()
    suspended = str(table.metadata().configuration.get(_SUSPENDED, "false")).lower() == "true"
    return "rowTracking" in features and not suspended


@dataclass(frozen=True)
class RowIds:
    """What row tracking adds to a commit."""

    adds: list[dict[str, Any]]
    domain: dict[str, Any] | None  # the new high-water mark (None: no row added)
    tags: dict[str, str]


def row_ids(
    store: LogStore, version: int, adds: Sequence[Mapping[str, Any]], removes: int
) -> RowIds:
    """``adds`` with their row ids and commit version, for commit ``version``.

    Raises:
        UnsupportedTableFeatureError: the commit removes files and adds data (it would copy
            rows whose stable ids it does not preserve; a compaction's adds change no data),
            or the log cannot be followed to the high-water mark (a checkpoint
            ``_last_checkpoint`` names is missing, say); nothing was written.
        CommitFailedError: the log moved past ``version - 1`` (a race: retried on a fresh
            snapshot).
    """
    if removes and any(add.get("dataChange", True) for add in adds):
        raise UnsupportedTableFeatureError(
            f"cannot commit to {store.uri}: it tracks row ids, and this commit removes files "
            "whose rows the sink cannot carry over with their ids. Nothing was written."
        )
    try:
        view = LogView.load(store)
    except LogViewUnavailable as err:
        raise UnsupportedTableFeatureError(
            f"cannot commit to {store.uri}: it tracks row ids, and the sink reads the table's "
            f"row id high-water mark from its log, which it cannot follow here ({err}). "
            "Nothing was written. Write this table with delta-spark."
        ) from err
    if view.version != version - 1:
        raise CommitFailedError(f"version {version} of {store.uri} was written first")
    mark = first_mark = high_water_mark(view.domains.get(ROW_TRACKING_DOMAIN))
    numbered = []
    for add in adds:
        records = json.loads(add.get("stats") or "{}").get("numRecords")
        if records is None:
            raise UnsupportedTableFeatureError(
                f"cannot commit {add['path']!r} to {store.uri}: it tracks row ids, and the "
                "file has no record count to number its rows by. Nothing was written."
            )
        numbered.append({**add, "baseRowId": mark + 1, "defaultRowCommitVersion": version})
        mark += int(records)
    domain = None
    if numbered and mark > first_mark:
        configuration = {"rowIdHighWaterMark": mark, "domainName": ROW_TRACKING_DOMAIN}
        domain = {
            "domain": ROW_TRACKING_DOMAIN,
            "configuration": json.dumps(configuration, separators=(",", ":")),
            "removed": False,
        }
    return RowIds(numbered, domain, {"delta.rowTracking.preserved": "true"})


def high_water_mark(domain: Mapping[str, Any] | None) -> int:
    """The highest row id a ``delta.rowTracking`` domain action records (-1: none yet)."""
    if domain is None or domain.get("removed"):
        return -1
    return int(json.loads(domain["configuration"])["rowIdHighWaterMark"])
