"""Exactly-once Delta Lake destination: Parquet staged by tasks, one Delta commit per batch."""

from committers.delta._committable import DeltaCommittable, StagedFile, StagedFileSerializer
from committers.delta._committer import DeltaGlobalCommitter
from committers.delta._compact import CompactionConflictError, CompactionResult
from committers.delta._options import WriterOptions
from committers.delta._protocol import UnsupportedTableFeatureError
from committers.delta._read_table import read_table, register
from committers.delta._shutdown import register as _register_clean_exit
from committers.delta._sink import DeltaSink
from committers.delta._stream import SourceTableChangedError
from committers.delta._upsert import UpsertConflictError

# A table read back with delta-rs can otherwise abort the interpreter at exit (SIGABRT,
# "terminate called without an active exception"): see committers/delta/_shutdown.py.
_register_clean_exit()

__all__ = [
    "CompactionConflictError",
    "CompactionResult",
    "DeltaCommittable",
    "DeltaGlobalCommitter",
    "DeltaSink",
    "SourceTableChangedError",
    "StagedFile",
    "StagedFileSerializer",
    "UnsupportedTableFeatureError",
    "UpsertConflictError",
    "WriterOptions",
    "read_table",
    "register",
]
