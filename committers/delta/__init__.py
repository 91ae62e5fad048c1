"""Exactly-once Delta Lake destination: Parquet staged by tasks, one Delta commit per batch.

The public names are imported on first use (PEP 562): a Spark task's Python worker that
unpickles one of the connector's task functions imports that function's modules, not the
whole connector (about half a second of CPU per worker)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from committers.delta.table._shutdown import register as _register_clean_exit

if TYPE_CHECKING:
    from committers.delta._sink import DeltaSink
    from committers.delta.commit._committer import DeltaGlobalCommitter
    from committers.delta.commit._compact import CompactionConflictError, CompactionResult
    from committers.delta.format._read_table import read_table, register
    from committers.delta.read._stream import SourceTableChangedError
    from committers.delta.table._deletion_vectors import DeletionVectorError
    from committers.delta.table._protocol import UnsupportedTableFeatureError
    from committers.delta.write._committable import (
        DeltaCommittable,
        StagedFile,
        StagedFileSerializer,
    )
    from committers.delta.write._options import WriterOptions
    from committers.delta.write._upsert_spec import UpsertConflictError

# A table read back with delta-rs can otherwise abort the interpreter at exit (SIGABRT,
# "terminate called without an active exception"): see committers/delta/table/_shutdown.py.
_register_clean_exit()

#: Public name -> the module defining it.
_EXPORTS = {
    "CompactionConflictError": "committers.delta.commit._compact",
    "CompactionResult": "committers.delta.commit._compact",
    "DeltaCommittable": "committers.delta.write._committable",
    "DeltaGlobalCommitter": "committers.delta.commit._committer",
    "DeletionVectorError": "committers.delta.table._deletion_vectors",
    "DeltaSink": "committers.delta._sink",
    "SourceTableChangedError": "committers.delta.read._stream",
    "StagedFile": "committers.delta.write._committable",
    "StagedFileSerializer": "committers.delta.write._committable",
    "UnsupportedTableFeatureError": "committers.delta.table._protocol",
    "UpsertConflictError": "committers.delta.write._upsert_spec",
    "WriterOptions": "committers.delta.write._options",
    "read_table": "committers.delta.format._read_table",
    "register": "committers.delta.format._read_table",
}

__all__ = [
    "CompactionConflictError",
    "CompactionResult",
    "DeletionVectorError",
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
