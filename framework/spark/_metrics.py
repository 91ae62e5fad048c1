"""Per-batch figures: logged once per batch, handed to a callback, readable from Python."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

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
        stage_ms: time spent in Spark tasks; commit_ms: time of the commit on the driver;
            upkeep_ms: time on the driver after the commit (or the replay check of a skipped
            batch) before the batch returned: the staging clean-up (handed to a worker on
            object stores) and the committer's upkeep, such as an auto-compaction.
        destination: where the sink writes (a Delta table's URI).
        version: the destination's version holding the batch (the Delta table version of the
            commit, or of the earlier commit a skipped replay found), ``None`` if unknown.
        output_mode: ``append`` or ``complete`` (the batch replaced the table's contents).
        writer_metrics: the writers' counters summed over the batch's successful task
            attempts, e.g. an async sink's ``num_requests``, ``num_retries``,
            ``num_throttled_requests``, ``num_dead_lettered`` (empty for Delta).
        restaged: how often the batch was staged again because the destination's rules
            changed between its staging and its commit (another writer's ALTER TABLE).
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
    destination: str = ""
    version: int | None = None
    output_mode: str = "append"
    writer_metrics: Mapping[str, int] = field(default_factory=dict)
    upkeep_ms: float = 0.0
    restaged: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain values, e.g. for JSON or a metrics exporter."""
        values = asdict(self)
        values["writer_metrics"] = dict(self.writer_metrics)
        return values

    def log_line(self) -> str:
        """``key=value`` pairs: batch, epoch, app id, status, destination, version, output."""
        version = "" if self.version is None else f" version={self.version}"
        mode = "" if self.output_mode == "append" else f" output_mode={self.output_mode}"
        counters = "".join(f" {name}={value}" for name, value in self.writer_metrics.items())
        if self.restaged:
            counters += f" restaged={self.restaged}"
        return (
            f"batch={self.batch_id} epoch={self.epoch_id} app_id={self.app_id} "
            f"status={self.status} destination={self.destination}{version}{mode} "
            f"files={self.files} rows={self.rows} bytes={self.bytes} "
            f"stage_ms={self.stage_ms:.0f} commit_ms={self.commit_ms:.1f} "
            f"upkeep_ms={self.upkeep_ms:.1f}{counters}"
        )
