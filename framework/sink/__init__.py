"""Unified sink API: writers, committables, committers, global committers, serializers."""

from framework.sink._api import (
    Committer,
    Epoch,
    GlobalCommitter,
    OutputMode,
    Sink,
    SinkWriter,
    WriterContext,
)
from framework.sink._plan import InputPlan, PlannedColumn, RowCheck, sql_string
from framework.sink._serializers import (
    VersionedSerializer,
    deserialize_versioned,
    serialize_versioned,
)

__all__ = [
    "Committer",
    "Epoch",
    "GlobalCommitter",
    "InputPlan",
    "OutputMode",
    "PlannedColumn",
    "RowCheck",
    "Sink",
    "SinkWriter",
    "VersionedSerializer",
    "WriterContext",
    "deserialize_versioned",
    "serialize_versioned",
    "sql_string",
]
