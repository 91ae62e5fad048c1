"""The deletion vector of each live file of a table version, from the log itself.

delta-rs resolves a snapshot's live files but does not hand out their deletion-vector
descriptors (``get_add_actions`` has no such column), and a reader, a rewrite's ``remove`` and
an error message all need them. :func:`live_deletion_vectors` replays what the protocol says
makes a version: the newest complete checkpoint at or before it (classic, multi-part, or v2
with its sidecars), then each commit after it, a commit's removes before its adds (a commit may
remove a file with one vector and add it back with another). :func:`live_adds` gives the
live files' whole ``add`` actions, as an upsert that marks rows of a file in a new vector
re-adds it with the stats its writer logged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import unquote

import pyarrow.parquet as pq

from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import (
    DeletionVectorDescriptor,
    DeletionVectorError,
    unique_id,
)

__all__ = [
    "checkpoint_vector",
    "live_adds",
    "live_deletion_vectors",
    "table_deletion_vectors",
    "vector_of",
    "vectors_changed",
]

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(
    r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10})|\.([0-9a-fA-F-]{36}))?\.(parquet|json)$"
)


def live_deletion_vectors(
    location: TableLocation, version: int
) -> dict[str, DeletionVectorDescriptor]:
    """Decoded path (as the log names it: relative to the root, or an absolute URI) -> the
    deletion vector of every file of ``version`` that has one.

    Raises:
        DeletionVectorError: a commit needed to rebuild ``version`` is missing (log cleanup
            without a checkpoint), or a descriptor is malformed.
    """
    vectors = {path: vector_of(add, path) for path, add in live_adds(location, version).items()}
    return {path: vector for path, vector in vectors.items() if vector is not None}


def vector_of(add: Mapping[str, Any], path: str) -> DeletionVectorDescriptor | None:
    """The deletion vector an ``add`` action (as :func:`live_adds` gives it) names, if any;
    ``path``: the data file's, for error messages.

    Raises:
        DeletionVectorError: the descriptor is malformed.
    """
    vector = add.get("deletionVector")
    return None if vector is None else DeletionVectorDescriptor.from_json(vector, path)


def live_adds(location: TableLocation, version: int) -> dict[str, dict[str, Any]]:
    """Decoded path -> the ``add`` action (as logged: ``stats`` text, ``modificationTime``,
    ``deletionVector`` or ``None``...) of every file of ``version``.

    Raises:
        DeletionVectorError: a commit needed to rebuild ``version`` is missing (log cleanup
            without a checkpoint).
    """
    fs = location.filesystem()
    log_dir = location.path("_delta_log")
    # refresh: s3fs caches listings per process, and a cached one misses the newest commits
    listing = fs.ls(log_dir, detail=False, refresh=True)
    names = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in listing]
    commits = {int(m.group(1)) for m in map(_COMMIT.match, names) if m}
    start, parts = _newest_checkpoint(names, version)
    live: dict[str, dict[str, Any]] = {}
    if start is not None:
        for add in _checkpoint_adds(location, parts):
            live[unquote(add["path"])] = add
    first = 0 if start is None else start + 1
    missing = [v for v in range(first, version + 1) if v not in commits]
    if missing:
        raise DeletionVectorError(
            f"cannot find the deletion vectors of {location.uri} at version {version}: the "
            f"commit(s) {missing[:5]} are missing from its log"
        )
    for v in range(first, version + 1):
        with fs.open(f"{log_dir}/{v:020d}.json", "rb") as handle:
            actions = [json.loads(line) for line in handle.read().splitlines() if line.strip()]
        for action in actions:
            if "remove" in action:
                live.pop(unquote(action["remove"]["path"]), None)
        for action in actions:
            if "add" in action:
                live[unquote(action["add"]["path"])] = action["add"]
    return live


def table_deletion_vectors(
    location: TableLocation, reader_features: Iterable[str], version: int
) -> dict[str, DeletionVectorDescriptor]:
    """:func:`live_deletion_vectors` of ``version`` of a table whose protocol has
    ``reader_features``; empty, without reading the log, when they lack ``deletionVectors``."""
    if "deletionVectors" not in set(reader_features):
        return {}
    return live_deletion_vectors(location, version)


class VectoredFile(Protocol):
    """A file as a rewrite read it: its decoded path and the deletion vector it had then."""

    @property
    def path(self) -> str: ...

    @property
    def deletion_vector(self) -> DeletionVectorDescriptor | None: ...


class ReadFile(VectoredFile, Protocol):
    """... and its path as the log spells it (the key of liveness checks)."""

    @property
    def logged_path(self) -> str: ...


def vectors_changed(
    location: TableLocation, reader_features: Iterable[str], version: int, files: Iterable[ReadFile]
) -> list[str]:
    """The logged paths of ``files`` whose deletion vector at ``version`` is not the one they
    were read with: rows of them were deleted since, and a rewrite that removes them would bring
    those rows back (the logical file is the path and the vector, PROTOCOL.md)."""
    now = table_deletion_vectors(location, reader_features, version)
    return [
        f.logged_path for f in files if unique_id(now.get(f.path)) != unique_id(f.deletion_vector)
    ]


def _newest_checkpoint(names: list[str], version: int) -> tuple[int | None, list[str]]:
    """The newest version at or before ``version`` with a complete checkpoint, and its files.

    A version may hold several checkpoints (a classic and a v2 one, or multi-part sets of
    different part counts, one of them left incomplete by a writer that failed): any complete
    one will do."""
    found: dict[int, dict[str, list[str]]] = {}
    for name in names:
        match = _CHECKPOINT.match(name)
        if match and int(match.group(1)) <= version:
            kind = f"of {int(match.group(3))}" if match.group(2) else "single"
            found.setdefault(int(match.group(1)), {}).setdefault(kind, []).append(name)
    for candidate in sorted(found, reverse=True):
        kinds = found[candidate]
        if "single" in kinds:  # a classic or v2 checkpoint: any one of them is complete
            return candidate, sorted(kinds["single"])[:1]
        for kind, parts in sorted(kinds.items()):
            if len(parts) == int(kind.split()[1]):
                return candidate, sorted(parts)
    return None, []


def _checkpoint_adds(location: TableLocation, parts: list[str]) -> Iterator[dict[str, Any]]:
    """Every add in the checkpoint files (and v2 sidecars), a missing vector as ``None``."""
    fs = location.filesystem()
    log_dir = location.path("_delta_log")
    for name in parts:
        path = f"{log_dir}/{name}"
        if name.endswith(".json"):  # a v2 checkpoint written as JSON
            with fs.open(path, "rb") as handle:
                actions = [json.loads(x) for x in handle.read().splitlines() if x.strip()]
            for action in actions:
                if "add" in action:
                    yield action["add"]
                if "sidecar" in action:
                    yield from _parquet_adds(fs, f"{log_dir}/_sidecars/{action['sidecar']['path']}")
            continue
        yield from _parquet_adds(fs, path, sidecars=f"{log_dir}/_sidecars")


def _parquet_adds(fs: Any, path: str, sidecars: str | None = None) -> Iterator[dict[str, Any]]:
    with fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        columns = [c for c in ("add", "sidecar") if c in parquet.schema_arrow.names]
        table = parquet.read(columns=columns)
    if "add" in columns:
        for add in table.column("add").to_pylist():
            if add and add.get("path"):
                yield {**add, "deletionVector": checkpoint_vector(add.get("deletionVector"))}
    if "sidecar" in columns and sidecars is not None:
        for sidecar in table.column("sidecar").to_pylist():
            if sidecar and sidecar.get("path"):
                yield from _parquet_adds(fs, f"{sidecars}/{sidecar['path']}")


def checkpoint_vector(value: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A checkpoint's ``deletionVector`` as a commit logs it: ``None`` for a missing vector
    (a checkpoint's struct of one has every field null)."""
    if value is None or value.get("storageType") is None:
        return None
    return value
