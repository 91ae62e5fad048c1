"""Exactly-once and at-least-once sinks for Spark, built on engine-agnostic Flink-style APIs.

``framework`` itself never imports pyspark: :class:`TwoPhaseSink` is loaded on first access from
``framework.spark``, so the core stays usable (and testable) without a JVM.
"""

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

from framework import errors
from framework.errors import SinkError
from framework.sink import (
    Committer,
    Epoch,
    GlobalCommitter,
    Sink,
    SinkWriter,
    WriterContext,
)

try:  # the installed distribution is the one source of truth for the version
    __version__ = _metadata.version("sparksink")
except _metadata.PackageNotFoundError:  # a source tree used without installing it
    __version__ = "0+unknown"

if TYPE_CHECKING:
    from framework.spark import TwoPhaseSink

__all__ = [
    "Committer",
    "Epoch",
    "GlobalCommitter",
    "Sink",
    "SinkError",
    "SinkWriter",
    "TwoPhaseSink",
    "WriterContext",
    "errors",
]


def __getattr__(name: str) -> Any:
    if name == "TwoPhaseSink":
        from framework.spark import TwoPhaseSink

        return TwoPhaseSink
    raise AttributeError(f"module 'framework' has no attribute {name!r}")
