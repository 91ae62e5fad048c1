"""Exactly-once Delta Lake destination: Parquet staged by tasks, one Delta commit per batch."""

from committers.delta._committable import DeltaCommittable, StagedFile, StagedFileSerializer
from committers.delta._committer import DeltaGlobalCommitter
from committers.delta._options import WriterOptions
from committers.delta._protocol import UnsupportedTableFeatureError
from committers.delta._sink import DeltaSink

__all__ = [
    "DeltaCommittable",
    "DeltaGlobalCommitter",
    "DeltaSink",
    "StagedFile",
    "StagedFileSerializer",
    "UnsupportedTableFeatureError",
    "WriterOptions",
]
