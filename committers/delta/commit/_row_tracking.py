"""Row ids and row commit versions for the commits the sink's log writer writes to a table
with row tracking (PROTOCOL.md, "Row Tracking"): each ``add`` gets a ``baseRowId`` above the
table's high-water mark and a ``defaultRowCommitVersion`` equal to the commit's version, and
the same commit carries the ``delta.rowTracking`` domain with the new mark.

Appends add new rows: their stable id is their fresh id. Rewrites that copy rows (compaction,
an upsert's and a ``replace_where``'s kept rows) write each copied row's id and commit version
into the materialized columns (:mod:`committers.delta.read._row_lineage`), which override the
fresh ones, and an upsert's updated rows carry the id of the row they replace there (their
commit version is the commit's); a file added back with a new deletion vector keeps its ids;
removes carry their file's. The commitInfo says ``delta.rowTracking.preserved``.

The mark is read from the log (its checkpoint's and later commits' ``domainMetadata``) at the
version the commit lands on top of; a commit landing first changes it, and the put-if-absent
of the next version fails, as every log-writer commit does under a race.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from deltalake.exceptions import CommitFailedError

from committers.delta.commit._log_append import LogView, LogViewUnavailable
from committers.delta.commit._log_store import LogStore
from committers.delta.storage._storage import TableLocation
from committers.delta.table._live_vectors import live_adds
from committers.delta.table._protocol import UnsupportedTableFeatureError

__all__ = ["ROW_TRACKING_DOMAIN", "RowIds", "row_ids"]

ROW_TRACKING_DOMAIN = "delta.rowTracking"


@dataclass(frozen=True)
class RowIds:
    """What row tracking adds to a commit."""

    adds: list[dict[str, Any]]
    removes: list[dict[str, Any]]
    domain: dict[str, Any] | None  # the new high-water mark (None: no row added)
    tags: dict[str, str]


def row_ids(
    location: TableLocation,
    version: int,
    adds: Sequence[Mapping[str, Any]],
    removes: Sequence[Mapping[str, Any]],
) -> RowIds:
    """``adds`` and ``removes`` with their row ids and commit versions, for commit
    ``version``: a new file gets a ``baseRowId`` above the high-water mark and ``version`` as
    its ``defaultRowCommitVersion``; a remove, and an add of a file the commit also removes (a
    file added back with a new deletion vector: the same rows), carry the values of the file's
    live add, as the protocol requires.

    Raises:
        UnsupportedTableFeatureError: the log cannot be followed to the high-water mark (a
            checkpoint ``_last_checkpoint`` names is missing, say), or a new file has no
            record count to number its rows by; nothing was written.
        CommitFailedError: the log moved past ``version - 1`` (a race: retried on a fresh
            snapshot).
    """
    store = LogStore(location)
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
    live = live_adds(location, version - 1) if removes else {}
    ids = {path: _ids_of(add) for path, add in live.items()}
    removed = {unquote(str(r["path"])) for r in removes}
    mark = first_mark = high_water_mark(view.domains.get(ROW_TRACKING_DOMAIN))
    numbered = []
    for add in adds:
        kept = ids.get(add["path"]) if add["path"] in removed else None
        if kept:  # the same file (and rows) again: the same ids
            numbered.append({**add, **kept})
            continue
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
    with_ids = [{**r, **ids.get(unquote(str(r["path"])), {})} for r in removes]
    return RowIds(numbered, with_ids, domain, {"delta.rowTracking.preserved": "true"})


def _ids_of(add: Mapping[str, Any]) -> dict[str, int]:
    """The ``baseRowId`` and ``defaultRowCommitVersion`` a live add logs (those it has)."""
    fields = ("baseRowId", "defaultRowCommitVersion")
    return {f: int(add[f]) for f in fields if add.get(f) is not None}


def high_water_mark(domain: Mapping[str, Any] | None) -> int:
    """The highest row id a ``delta.rowTracking`` domain action records (-1: none yet)."""
    if domain is None or domain.get("removed"):
        return -1
    return int(json.loads(domain["configuration"])["rowIdHighWaterMark"])
