"""The unified sink API (after Flink's FLIP-143), independent of any engine.

A :class:`Sink` is a factory. Its :class:`SinkWriter` runs in parallel tasks and turns input
batches into *committables* (descriptions of staged data); a :class:`GlobalCommitter` runs once,
on the coordinator, combines the committables of one epoch and commits them atomically.

Guarantees by shape:

* writer returns committables + global committer present -> exactly-once, provided the global
  committer's :meth:`GlobalCommitter.is_committed` is answered from the destination itself;
* writer returns no committables and flushes everything in ``prepare_commit(flush=True)``
  -> at-least-once (the epoch boundary is the checkpoint).

The engine guarantees the rest: it calls ``is_committed`` before staging an epoch, only hands the
committables of successful task attempts to ``combine`` (and only once the rows they hold,
:meth:`GlobalCommitter.committed_rows`, are the rows its writers wrote), calls ``abort`` for an
epoch it gives up on, and ``clean_up`` then ``after_epoch`` once an epoch is committed or
skipped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from framework.sink._plan import InputPlan
from framework.sink._serializers import VersionedSerializer

InputT = TypeVar("InputT")
CommT = TypeVar("CommT")
GlobalCommT = TypeVar("GlobalCommT")
OutputMode = Literal["append", "complete"]

__all__ = [
    "Committer",
    "Epoch",
    "GlobalCommitter",
    "OutputMode",
    "Sink",
    "SinkWriter",
    "WriterContext",
]


@dataclass(frozen=True, kw_only=True)
class Epoch:
    """One unit of atomic commit: a streaming micro-batch or a whole bounded job.

    Attributes:
        app_id: stable identity of the writing application; the destination records
            ``(app_id, epoch_id)`` with every commit.
        epoch_id: increases monotonically per ``app_id``; a replay reuses the same id.
        writer_identity: identity of the writing instance that is stable across its restarts
            (e.g. the streaming query id stored in the checkpoint). Two instances that share an
            ``app_id`` differ here, which lets a committer tell a replay from a second writer.
        run_id: unique per attempt of the coordinator to process this epoch; staged data is
            tagged with it so that leftovers of earlier attempts can be recognised.
        bounded: the epoch of a bounded job, whose id the caller chooses: ids of one app id
            need not arrive in increasing order across jobs. ``False`` for streaming, where one
            writer identity only ever moves forward (so an epoch below its newest commit is a
            replay even when its own commit is no longer in the destination's history).
        output_mode: ``"append"`` adds the epoch's rows to the destination; ``"complete"``
            replaces its whole contents with them (Spark's complete output mode), in the same
            one transaction.
        query_id: the streaming query's id (``None`` for bounded jobs), for commit metadata.
        user_metadata: a free-text note to record with the commit (Delta's ``userMetadata``);
            ``None`` leaves the sink's own default.
        one_off: a bounded write without an application identity (no app id configured): its
            ``app_id`` is made up for this run alone, so nothing can ever replay it. The
            destination then records no replay marker (no Delta ``txn``), which would only
            accumulate; an unknown commit outcome is reconciled by ``run_id`` instead.
    """

    app_id: str
    epoch_id: int
    writer_identity: str
    run_id: str
    bounded: bool = False
    output_mode: OutputMode = "append"
    query_id: str | None = None
    user_metadata: str | None = None
    one_off: bool = False


@dataclass(frozen=True, kw_only=True)
class WriterContext:
    """Where a writer runs: which epoch, which task, which attempt of that task."""

    epoch: Epoch
    partition_id: int
    attempt_number: int
    task_attempt_id: int


class SinkWriter(ABC, Generic[InputT, CommT]):
    """Writes the input of one task. Runs on an executor; never shared between tasks."""

    @abstractmethod
    def write(self, batch: InputT) -> None:
        """Accept one batch of input. May block for back-pressure."""

    @abstractmethod
    def prepare_commit(self, flush: bool) -> list[CommT]:
        """Finish what is in progress and return committables for it.

        With ``flush=True`` (end of the epoch or of the input) everything accepted so far must be
        durably staged (exactly-once sinks) or delivered (at-least-once sinks) on return.
        """

    def snapshot_state(self) -> list[Any]:
        """State to restore this writer from after a failure (FLIP-143). None by default."""
        return []

    def task_metrics(self) -> Mapping[str, int]:
        """Counters of this writer (requests, retries, ...), read after ``prepare_commit``.

        The engine sums them over the successful task attempts of an epoch into the epoch's
        metrics on the coordinator. Empty by default.
        """
        return {}

    def abort(self) -> None:
        """Called instead of ``prepare_commit`` when the task fails: best-effort removal of what
        this writer staged. Correctness must not depend on it (a killed task never gets here)."""

    def close(self) -> None:
        """Release resources. Always called last."""


class Committer(ABC, Generic[CommT]):
    """Commits committables individually (FLIP-143), on the coordinator, after collection."""

    @abstractmethod
    def commit(self, committables: list[CommT]) -> list[CommT]:
        """Commit; return the committables that must be retried (empty when all succeeded)."""

    def close(self) -> None:
        """Release resources."""


class GlobalCommitter(ABC, Generic[CommT, GlobalCommT]):
    """Combines all committables of an epoch and commits them as one transaction.

    Runs once per job, on the coordinator (the Spark driver). Implementations must be
    idempotent per epoch: committing an epoch the destination already holds must not add data.
    """

    def filter_recovered_committables(
        self, global_committables: list[GlobalCommT]
    ) -> list[GlobalCommT]:
        """Return the recovered global committables that still need committing (FLIP-143)."""
        return global_committables

    def last_committed_epoch(self, app_id: str) -> int | None:
        """The newest epoch id the destination records for ``app_id``; ``None`` if none or
        unknown. Engines use it to number bounded jobs and to detect a reset checkpoint."""
        return None

    def recent_app_ids(self, prefix: str) -> list[str]:
        """App ids starting with ``prefix`` that recently committed to the destination (best
        effort; empty if unknown). Engines use it to warn when a new checkpoint writes under a
        derived app id while other derived ids already wrote: a replaced checkpoint whose
        batches will be written again."""
        return []

    @abstractmethod
    def is_committed(self, epoch: Epoch) -> bool:
        """Whether the destination already holds a commit for ``epoch`` (a replay).

        Raises:
            ConcurrentWriterError: the epoch was committed by another instance sharing the
                app id, so skipping it would lose this instance's data.
        """

    def committed_rows(self, committables: list[CommT]) -> int | None:
        """The rows that committing ``committables`` would add, as the destination will record
        them (e.g. the sum of the files' record counts); ``None`` when it records no count.

        Engines compare it with the rows their writers wrote, counted as they wrote them, and
        fail the epoch before its commit on a difference (``RowCountMismatchError``)."""
        return None

    @abstractmethod
    def combine(self, epoch: Epoch, committables: list[CommT]) -> GlobalCommT:
        """Combine the committables of the successful task attempts of one epoch."""

    @abstractmethod
    def commit(self, global_committables: list[GlobalCommT]) -> list[GlobalCommT]:
        """Commit; return those to retry. Raises a ``CommitError`` subclass on failure."""

    def committed_version(self, epoch: Epoch) -> int | None:
        """The destination's version that holds ``epoch`` (e.g. the Delta table version), once
        it was committed or found as a replay by this committer; ``None`` if unknown."""
        return None

    def abort(self, epoch: Epoch) -> None:
        """Discard what was staged for ``epoch`` and not committed. Never touches committed data."""

    def clean_up(self, epoch: Epoch) -> None:
        """After ``epoch`` is committed or skipped as a replay: remove staged leftovers."""

    def after_epoch(self, epoch: Epoch) -> None:
        """After ``epoch`` was committed (or skipped as a replay) and cleaned up, before the
        next epoch starts: upkeep of the destination that may take a while (e.g. compacting
        small files). The epoch is done whatever happens here: engines log what this raises
        as a warning and go on, so it can neither fail nor retry the epoch."""

    def end_of_input(self) -> None:
        """Bounded input is exhausted; the final epoch has been committed."""

    def close(self) -> None:
        """Release resources."""


class Sink(ABC, Generic[InputT, CommT, GlobalCommT]):
    """Factory for the parts of a sink. Must pickle: it is shipped to every task.

    Attributes:
        app_id: the configured application identity, or ``None`` to let the engine derive a
            stable one (e.g. from the streaming query).
    """

    app_id: str | None = None
    #: Output modes the sink honours; ``"complete"`` needs a committer that replaces contents.
    #: Empty: the sink writes bounded DataFrames only.
    output_modes: frozenset[OutputMode] = frozenset({"append"})

    @property
    def destination(self) -> str:
        """Where the sink writes, for log lines and metrics (e.g. the table URI)."""
        return type(self).__name__

    @abstractmethod
    def create_writer(self, context: WriterContext) -> SinkWriter[InputT, CommT]:
        """Create the writer of one task attempt."""

    def prepare(self, input_schema: Any) -> None:
        """Called once on the coordinator before any task runs, with the input schema.

        Validates the input against the destination and creates the destination if needed.
        Raises an ``InputError`` or ``DestinationError`` subclass when writing cannot succeed.

        Called again, on the same sink and with the same schema, after its global committer
        raised :class:`~framework.errors.StaleStagingError`: the sink then plans against the
        destination as it is now, and its live global committer commits under that plan.
        """

    def input_plan(self) -> InputPlan | None:
        """What the engine must do to every row before the writers see it (after
        :meth:`prepare`): the destination's rules, evaluated in the engine's tasks. ``None``
        hands the input to the writers as it is."""
        return None

    def create_committer(self) -> Committer[CommT] | None:
        """The per-committable committer, or ``None``."""
        return None

    def create_global_committer(self) -> GlobalCommitter[CommT, GlobalCommT] | None:
        """The global committer, or ``None`` for sinks without a commit step."""
        return None

    def committable_serializer(self) -> VersionedSerializer[CommT] | None:
        """How committables travel from tasks to the coordinator; required with committers."""
        return None
