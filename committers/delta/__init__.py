"""Exactly-once Delta Lake destination: Parquet staged by tasks, one Delta commit per batch."""

from committers.delta._sink import DeltaSink
from committers.delta.commit._committer import DeltaGlobalCommitter
from committers.delta.commit._compact import CompactionConflictError, CompactionResult
from committers.delta.format._read_table import read_table, register
from committers.delta.read._stream import SourceTableChangedError
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._shutdown import register as _register_clean_exit
from committers.delta.write._committable import DeltaCommittable, StagedFile, StagedFileSerializer
from committers.delta.write._options import WriterOptions
from committers.delta.write._upsert_spec import UpsertConflictError

# A table read back with delta-rs can otherwise abort the interpreter at exit (SIGABRT,
# "terminate called without an active exception"): see committers/delta/table/_shutdown.py.
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
