"""What the sink reads from and keeps in a streaming checkpoint directory."""

from __future__ import annotations

import json
from dataclasses import dataclass

import fsspec

from framework.errors import ConfigurationError

__all__ = ["CheckpointInfo", "read_checkpoint", "save_epoch_offset"]

_SINK_STATE = "two_phase_sink.json"


def _fs_and_path(checkpoint_location: str) -> tuple[fsspec.AbstractFileSystem, str]:
    url = checkpoint_location.replace("s3a://", "s3://", 1)
    fs, path = fsspec.core.url_to_fs(url)
    return fs, path.rstrip("/")


@dataclass(frozen=True)
class CheckpointInfo:
    """Attributes:
    fresh: Spark has not started a query from this checkpoint yet (no ``metadata`` file).
    epoch_offset: added to Spark batch ids to form epoch ids; non-zero only after a reset
        checkpoint was explicitly continued.
    """

    fresh: bool
    epoch_offset: int | None


def read_checkpoint(checkpoint_location: str) -> CheckpointInfo:
    """Read what Spark and the sink keep in the checkpoint, through fsspec.

    Raises:
        ConfigurationError: the checkpoint cannot be read from this (driver) process.
    """
    try:
        return _read_checkpoint(checkpoint_location)
    except Exception as err:
        raise ConfigurationError(
            f"cannot read the checkpoint {checkpoint_location} from the driver ({err}). The sink "
            "reads <checkpoint>/metadata through fsspec to detect a reset checkpoint: use a path "
            "fsspec can read with default credentials (a local or cluster file system path)."
        ) from err


def _read_checkpoint(checkpoint_location: str) -> CheckpointInfo:
    fs, root = _fs_and_path(checkpoint_location)
    offset = None
    try:
        with fs.open(f"{root}/{_SINK_STATE}", "rb") as src:
            offset = int(json.loads(src.read())["epoch_offset"])
    except FileNotFoundError:
        pass
    return CheckpointInfo(fresh=not fs.exists(f"{root}/metadata"), epoch_offset=offset)


def save_epoch_offset(checkpoint_location: str, app_id: str, offset: int) -> None:
    fs, root = _fs_and_path(checkpoint_location)
    fs.makedirs(root, exist_ok=True)
    with fs.open(f"{root}/{_SINK_STATE}", "wb") as out:
        out.write(json.dumps({"app_id": app_id, "epoch_offset": offset}).encode())
