"""Per-batch figures, logged once per batch and readable from Python."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["BatchMetrics"]


@dataclass(frozen=True, kw_only=True)
class BatchMetrics:
    """What one micro-batch (or bounded write) did.

    Attributes:
        batch_id: Spark's micro-batch id (for bounded writes, the epoch id).
        epoch_id: the id committed to the destination (batch id plus any reset offset).
        app_id: the application identity the commit is keyed by.
        status: ``committed``; ``skipped`` (a replay of a committed batch; nothing written);
            ``delivered`` (at-least-once sink, all requests acknowledged).
        files, bytes: committed output (0 for skipped batches and at-least-once sinks).
        rows: input rows the tasks wrote (committed or delivered; 0 for skipped batches).
        stage_ms: time spent in Spark tasks; commit_ms: time of the commit on the driver.
    """

    batch_id: int
    epoch_id: int
    app_id: str
    status: Literal["committed", "skipped", "delivered"]
    files: int
    rows: int
    bytes: int
    stage_ms: float
    commit_ms: float

    def log_line(self) -> str:
        return (
            f"batch={self.batch_id} epoch={self.epoch_id} app_id={self.app_id} "
            f"status={self.status} files={self.files} rows={self.rows} bytes={self.bytes} "
            f"stage_ms={self.stage_ms:.0f} commit_ms={self.commit_ms:.1f}"
        )
