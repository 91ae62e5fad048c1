"""Staging with the engine's own writer: a sink may let Spark write its files.

A sink that implements :class:`StagesWithSpark` is asked, per batch, for a
:class:`SparkStager`. If it returns one, the stager writes the batch (already shaped by the
sink's input plan) with Spark's own writers and returns the committables; otherwise the batch
goes through the sink's Python writers in ``mapInArrow`` tasks. Either way the replay check,
the commit and the clean-up are the framework's, unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from framework.sink import Epoch, InputPlan

__all__ = ["PlansEachBatch", "SparkStager", "StagesWithSpark", "is_connect_dataframe"]


def is_connect_dataframe(df: Any) -> bool:
    """Whether ``df`` belongs to a Spark Connect client (no JVM in this process)."""
    return type(df).__module__.startswith("pyspark.sql.connect")


class SparkStager(Protocol):
    def stage(self, df: DataFrame, epoch: Epoch) -> tuple[list[Any], int]:
        """Write ``df`` for ``epoch``; return the committables and the number of rows.

        Must leave, before anything is written, what the sink's committer needs to delete the
        output of a run that never commits (the committer's ``abort`` runs on failure)."""
        ...


@runtime_checkable
class StagesWithSpark(Protocol):
    def spark_stager(self, df: DataFrame) -> SparkStager | None:
        """The stager for batches like ``df``, or None to stage through Python writers."""
        ...


@runtime_checkable
class PlansEachBatch(Protocol):
    def batch_input_plan(self, df: DataFrame) -> InputPlan | None:
        """The input plan of the batch ``df`` (asked right before it is staged, after its
        replay check), used instead of ``Sink.input_plan()``: for rules whose expressions
        depend on the destination's state at that moment or on ``df`` itself (identity values
        reserved per batch, say)."""
        ...
