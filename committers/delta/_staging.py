"""Layout of staging manifests: how uncommitted files are found again after any failure.

Before a task opens a data file it records the file's path in its *manifest*, an object under
``<table>/_sink_staging/<app>/<writer>/<epoch>/``. A killed task, a failed attempt or a crashed
driver therefore always leaves a manifest naming every file it may have created, and the
driver can delete exactly the files that were not committed, without listing the table.
Delta readers ignore directories whose name starts with ``_``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from urllib.parse import quote

from committers.delta._storage import TableLocation
from framework.sink import Epoch

__all__ = ["STAGING_DIR", "epoch_staging_dir", "manifest_path", "read_manifests", "write_manifest"]

STAGING_DIR = "_sink_staging"


def _segment(text: str) -> str:
    return quote(text, safe="") or "_"


def epoch_staging_dir(epoch: Epoch) -> str:
    """Directory (relative to the table root) holding the manifests of ``epoch``'s writer."""
    return "/".join(
        (
            STAGING_DIR,
            _segment(epoch.app_id),
            _segment(epoch.writer_identity),
            str(epoch.epoch_id),
        )
    )


def manifest_path(epoch: Epoch, partition_id: int, attempt_number: int) -> str:
    """Manifest of one task attempt, relative to the table root."""
    name = f"{epoch.run_id}-{partition_id:05d}-{attempt_number}.json"
    return f"{epoch_staging_dir(epoch)}/{name}"


def write_manifest(location: TableLocation, relative: str, files: Iterable[str]) -> None:
    """(Re)write a manifest listing ``files`` (paths relative to the table root)."""
    fs = location.filesystem()
    path = location.path(relative)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as out:
        out.write(json.dumps({"files": sorted(files)}).encode())


def read_manifests(location: TableLocation, epoch: Epoch) -> tuple[list[str], set[str]]:
    """Return (manifest paths, data files they list) for ``epoch``; empty when none exist."""
    fs = location.filesystem()
    directory = location.path(epoch_staging_dir(epoch))
    try:
        manifests = [p for p in fs.ls(directory, detail=False) if p.endswith(".json")]
    except FileNotFoundError:
        return [], set()
    files: set[str] = set()
    for manifest in manifests:
        try:
            with fs.open(manifest, "rb") as src:
                files.update(json.loads(src.read())["files"])
        except (FileNotFoundError, ValueError, KeyError):
            # A manifest cut short by a crash: its files were never reported, so they are
            # orphans the retention-based cleanup removes; nothing here is committed data.
            continue
    return manifests, files
