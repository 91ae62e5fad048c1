"""Layout of staging manifests: how uncommitted files are found again after any failure.

Before a task opens a data file it records the file's path in its *manifest*, an object under
``<table>/_sink_staging/<app>/<writer>/<epoch>/``. A killed task, a failed attempt or a crashed
driver therefore always leaves a manifest naming every file it may have created, and the
driver can delete exactly the files that were not committed, without listing the table.
Delta readers ignore directories whose name starts with ``_``.

A run that lets Spark write its files (``staging="spark"``) cannot name them in advance: its
manifest names the run's own directory instead, and everything below it belongs to the run
(Spark's ``_temporary`` attempt files included).
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from urllib.parse import quote

from committers.delta.storage._storage import TableLocation
from framework.sink import Epoch

__all__ = [
    "STAGING_DIR",
    "ManifestListing",
    "epoch_staging_dir",
    "is_run_manifest",
    "manifest_path",
    "manifest_task_attempt",
    "read_manifests",
    "remove_empty_directories",
    "remove_empty_staging_dirs",
    "write_manifest",
]

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


def manifest_path(epoch: Epoch, partition_id: int, task_attempt_id: int) -> str:
    """Manifest of one task attempt, relative to the table root.

    Spark's task attempt id is unique within the application (``attemptNumber`` restarts at 0
    when a stage is resubmitted while a zombie attempt may still run), and the run id tells the
    driver-side runs of one epoch apart.
    """
    name = f"{epoch.run_id}-{partition_id:05d}-{task_attempt_id}.json"
    return f"{epoch_staging_dir(epoch)}/{name}"


def is_run_manifest(manifest: str, epoch: Epoch) -> bool:
    """Whether ``manifest`` (any path form) was written by ``epoch``'s run."""
    return manifest.rsplit("/", 1)[-1].startswith(f"{epoch.run_id}-")


def write_manifest(
    location: TableLocation,
    relative: str,
    files: Iterable[str],
    directories: Iterable[str] = (),
) -> None:
    """(Re)write a manifest listing ``files`` and whole ``directories`` (paths relative to the
    table root).

    Never leaves a truncated manifest: object stores replace an object atomically, and on a
    local file system the manifest is written to a temporary name and renamed.
    """
    fs = location.filesystem()
    path = location.path(relative)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    content: dict[str, list[str]] = {"files": sorted(files)}
    if directories:
        content["directories"] = sorted(directories)
    body = json.dumps(content).encode()
    if not location.is_local:
        fs.pipe_file(path, body)
        return
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(temporary, "wb") as out:
        out.write(body)
    os.replace(temporary, path)


def manifest_task_attempt(manifest: str) -> int | None:
    """The task attempt id in a manifest's name, or ``None`` for a name we did not write."""
    stem = manifest.rsplit("/", 1)[-1].removesuffix(".json")
    tail = stem.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else None


@dataclass
class ManifestListing:
    """What one manifest accounts for: files, and directories owned whole by its run (their
    files, as found when the manifest was read, are in ``files`` too)."""

    files: set[str] = field(default_factory=set)
    directories: set[str] = field(default_factory=set)


def read_manifest(location: TableLocation, manifest: str) -> ManifestListing:
    """The listing of ``manifest`` (an fsspec path), directories expanded.

    Raises FileNotFoundError when the manifest is gone; an unreadable manifest lists nothing
    (its files are left to ``remove_orphan_files``)."""
    fs = location.filesystem()
    with fs.open(manifest, "rb") as src:
        raw = src.read()
    try:
        content = json.loads(raw)
        listing = ManifestListing(set(content["files"]), set(content.get("directories", ())))
    except (ValueError, KeyError, TypeError):
        return ManifestListing()
    for directory in listing.directories:
        listing.files.update(map(location.relative, fs.find(location.path(directory))))
    return listing


def read_manifests(
    location: TableLocation, epoch: Epoch, *, committed_attempts: Collection[int] = ()
) -> dict[str, ManifestListing]:
    """Map each manifest (fsspec path) of ``epoch``'s writer to what it lists.

    Manifests of this run (``epoch.run_id``) written by a task attempt in
    ``committed_attempts`` (whose every file the caller knows to be committed) are not read
    and map to an empty listing: on object stores that saves one GET per task.
    """
    fs = location.filesystem()
    directory = location.path(epoch_staging_dir(epoch))
    try:
        entries = fs.ls(directory, detail=False)
    except FileNotFoundError:
        return {}
    manifests: dict[str, ManifestListing] = {}
    for manifest in entries:
        if not manifest.endswith(".json"):
            continue
        if (
            committed_attempts
            and is_run_manifest(manifest, epoch)
            and manifest_task_attempt(manifest) in committed_attempts
        ):
            manifests[manifest] = ManifestListing()
            continue
        try:
            manifests[manifest] = read_manifest(location, manifest)
        except FileNotFoundError:
            continue  # removed meanwhile by a concurrent clean-up
    return manifests


def remove_empty_directories(location: TableLocation, relative: str) -> None:
    """Remove the empty directories at and below ``relative`` (a run directory whose
    uncommitted files were deleted), on file systems that have real directories."""
    if not location.is_local:
        return
    top = location.path(relative)
    for directory, _, _ in sorted(os.walk(top), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(directory)  # fails, as it should, while a committed file remains


def remove_empty_staging_dirs(location: TableLocation, relative: str) -> None:
    """Remove the staging directory ``relative`` and its parents (below ``_sink_staging``)
    while they are empty, on file systems that have real directories."""
    if not location.is_local:
        return
    parts = relative.split("/")
    while len(parts) > 1 and parts[0] == STAGING_DIR:
        try:
            os.rmdir(location.path("/".join(parts)))
        except FileNotFoundError:
            pass
        except OSError:
            return  # not empty: another run or epoch is still staging there
        parts.pop()
