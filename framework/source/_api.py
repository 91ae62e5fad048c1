"""The source API (after Flink's FLIP-27), independent of any engine.

A :class:`Source` is a factory. Its :class:`SplitEnumerator` runs once, on the coordinator, and
hands *splits* (portions of the input) to readers when they ask for one; a :class:`SourceReader`
runs in each parallel task, reads the splits it was given and tracks, per split, how far it got
(a :class:`SplitState`). Both sides can be checkpointed: the enumerator's state holds what it has
not handed out yet, the readers' state holds the splits they own with their progress, so that
after a failure every record is read once, neither skipped nor repeated.

The engine guarantees the rest: it delivers the splits an enumerator assigns, restores readers
and enumerator from the same checkpoint, and when one reader fails hands the splits it held
since that checkpoint back to the enumerator (:meth:`SplitEnumerator.add_splits_back`).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from framework.errors import ConfigurationError
from framework.sink import VersionedSerializer

__all__ = [
    "Boundedness",
    "InputStatus",
    "RecordEmitter",
    "RecordsBySplits",
    "Source",
    "SourceOutput",
    "SourceReader",
    "SourceReaderContext",
    "Split",
    "SplitEnumerator",
    "SplitEnumeratorContext",
    "SplitReader",
    "SplitState",
]

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)
E = TypeVar("E")
SplitT = TypeVar("SplitT", bound="Split")
SplitT_contra = TypeVar("SplitT_contra", bound="Split", contravariant=True)
StateT = TypeVar("StateT", bound="SplitState[Any]")
EnumStateT = TypeVar("EnumStateT")


class Boundedness(enum.Enum):
    """Whether a source ends."""

    BOUNDED = "bounded"
    """The input is finite: readers reach :attr:`InputStatus.END_OF_INPUT`."""
    CONTINUOUS_UNBOUNDED = "continuous_unbounded"
    """The input never ends: new splits or records keep arriving."""


class InputStatus(enum.Enum):
    """What :meth:`SourceReader.poll_next` found."""

    MORE_AVAILABLE = "more_available"
    """Call again: the reader holds splits that are not finished."""
    NOTHING_AVAILABLE = "nothing_available"
    """No split to read right now; call again once the enumerator assigned one."""
    END_OF_INPUT = "end_of_input"
    """Every split this reader was given is finished and no more will come."""


@dataclass(frozen=True, kw_only=True)
class Split:
    """An immutable portion of the input, identified by ``split_id``.

    Subclasses add what identifies the data (a file range, an offset range...) and, when a
    reader can resume inside a split, the progress a :class:`SplitState` recorded: a split
    produced by :meth:`SplitState.to_split` is read from that progress on. Splits travel between
    processes, so they must pickle and have a versioned serializer.

    Attributes:
        split_id: unique among the splits of one source run.

    Raises:
        ConfigurationError: ``split_id`` is empty.
    """

    split_id: str

    def __post_init__(self) -> None:
        if not isinstance(self.split_id, str) or not self.split_id:
            raise ConfigurationError(f"split_id must be a non-empty string, got {self.split_id!r}")


class SplitState(ABC, Generic[SplitT]):
    """The mutable progress of a reader through one split.

    A :class:`RecordEmitter` advances it as records are emitted; :meth:`to_split` turns it back
    into an immutable split that reflects that progress (what a reader checkpoints).
    """

    @property
    @abstractmethod
    def split_id(self) -> str:
        """The id of the split this state tracks."""

    @abstractmethod
    def to_split(self) -> SplitT:
        """The split, with the progress made so far: reading it resumes right after the last
        record emitted."""


@dataclass(frozen=True, slots=True)
class RecordsBySplits(Generic[E]):
    """What one :meth:`SplitReader.fetch` returns.

    Attributes:
        records: split id -> the elements read from that split by this fetch, in read order.
        finished_splits: ids of the splits read to their end (possibly by an earlier fetch with
            nothing left to return, or empty splits); their records, if any, are in ``records``.
    """

    records: Mapping[str, Sequence[E]] = field(default_factory=dict)
    finished_splits: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return sum(len(elements) for elements in self.records.values())


class SourceOutput(Protocol[T_contra]):
    """Where a reader puts the records it produces."""

    def collect(self, record: T_contra) -> None:
        """Accept one record. May raise; the record then counts as not emitted."""
        ...


class SplitEnumeratorContext(Protocol[SplitT_contra]):
    """What the engine offers an enumerator (on the coordinator)."""

    @property
    def current_parallelism(self) -> int:
        """Number of parallel readers."""
        ...

    def assign_split(self, split: SplitT_contra, subtask_id: int) -> None:
        """Hand ``split`` to the reader of ``subtask_id``."""
        ...

    def signal_no_more_splits(self, subtask_id: int) -> None:
        """Tell the reader of ``subtask_id`` that no further split will come."""
        ...


class SourceReaderContext(Protocol):
    """What the engine offers a reader (in a task)."""

    @property
    def subtask_id(self) -> int:
        """Index of this reader among the parallel readers."""
        ...

    def send_split_request(self) -> None:
        """Ask the enumerator for a split; the answer arrives through
        :meth:`SourceReader.add_splits` or :meth:`SourceReader.notify_no_more_splits`."""
        ...


class SplitEnumerator(ABC, Generic[SplitT, EnumStateT]):
    """Creates splits and hands them to readers. Runs once per source run, on the coordinator.

    Splits should be generated lazily, when a reader asks, not all up front: a huge input or a
    straggling reader must not make the coordinator hold every split in memory.
    """

    def start(self) -> None:
        """Called once before the first request. Must not block for long."""

    @abstractmethod
    def handle_split_request(self, subtask_id: int, requester_host: str | None = None) -> None:
        """A reader asks for a split: assign one through the context, or signal that there are
        no more."""

    @abstractmethod
    def add_splits_back(self, splits: Sequence[SplitT], subtask_id: int) -> None:
        """Take back the splits a failed reader held since the last checkpoint (with the
        progress recorded there, if any). They are handed out again, before new ones."""

    def add_reader(self, subtask_id: int) -> None:
        """A reader registered. Nothing to do for lazy enumerators."""

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> EnumStateT:
        """Everything needed to continue after a failure: how to generate the next splits and
        the splits waiting to be handed out again. Splits already assigned are not part of it:
        they are in the readers' state."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint ``checkpoint_id`` is durable."""

    def close(self) -> None:
        """Release resources."""


class SplitReader(ABC, Generic[E, SplitT]):
    """Reads the records of the splits it is given, a portion per :meth:`fetch`.

    Used from one thread, except :meth:`wake_up`, which any thread may call.
    """

    @abstractmethod
    def handle_splits_changes(self, splits: Sequence[SplitT]) -> None:
        """Add splits to read, each from the progress it carries."""

    @abstractmethod
    def fetch(self) -> RecordsBySplits[E]:
        """Read some records.

        Re-entrant: each call continues where the previous one stopped; a split read to its end
        is reported finished once and never read again. A call may return early (after
        :meth:`wake_up`, or with fewer records than possible); when it raises, the records it
        read are not lost: the next call reads them again.
        """

    @abstractmethod
    def wake_up(self) -> None:
        """Make a running (possibly blocked) :meth:`fetch` return soon with what it has, or the
        next one return at once if none is running. Thread-safe."""

    def close(self) -> None:
        """Release resources."""


class RecordEmitter(ABC, Generic[E, T, StateT]):
    """Turns one fetched element into output records and advances the split's state."""

    @abstractmethod
    def emit_record(self, element: E, output: SourceOutput[T], split_state: StateT) -> None:
        """Emit ``element`` and record the progress in ``split_state``.

        Must be idempotent: an element passed again after an interruption (one the state says
        was already emitted) emits nothing and leaves the state as it is. When ``output``
        raises, the state must not advance.
        """


class SourceReader(ABC, Generic[T, SplitT]):
    """Reads the splits assigned to one parallel task and emits their records."""

    def start(self) -> None:
        """Called once, after the restored splits (if any) were added."""

    @abstractmethod
    def poll_next(self, output: SourceOutput[T]) -> InputStatus:
        """Emit available records into ``output`` and say whether more may come."""

    @abstractmethod
    def add_splits(self, splits: Sequence[SplitT]) -> None:
        """Splits assigned by the enumerator, or restored from a checkpoint."""

    @abstractmethod
    def notify_no_more_splits(self) -> None:
        """The enumerator will assign no further split to this reader."""

    @abstractmethod
    def snapshot_state(self, checkpoint_id: int) -> list[SplitT]:
        """The splits this reader owns, each with the progress of the records emitted so far.

        A reader given these splits emits exactly the records this one has not emitted yet.
        """

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """The checkpoint ``checkpoint_id`` is durable."""

    def wake_up(self) -> None:
        """Make a running :meth:`poll_next` return soon. Thread-safe. No-op by default."""

    def close(self) -> None:
        """Release resources."""


class Source(ABC, Generic[T, SplitT, EnumStateT]):
    """Factory for the parts of a source. Must pickle: it is shipped to every task.

    Implementations validate their configuration at construction and raise
    :class:`~framework.errors.ConfigurationError` before anything is listed or read.
    """

    @property
    @abstractmethod
    def boundedness(self) -> Boundedness:
        """Whether the input ends."""

    @abstractmethod
    def create_enumerator(
        self, context: SplitEnumeratorContext[SplitT]
    ) -> SplitEnumerator[SplitT, EnumStateT]:
        """A fresh enumerator, for a run without a checkpoint."""

    @abstractmethod
    def restore_enumerator(
        self, context: SplitEnumeratorContext[SplitT], state: EnumStateT
    ) -> SplitEnumerator[SplitT, EnumStateT]:
        """An enumerator continuing from ``state`` (from :meth:`SplitEnumerator.snapshot_state`)."""

    @abstractmethod
    def create_reader(self, context: SourceReaderContext) -> SourceReader[T, SplitT]:
        """The reader of one parallel task."""

    @abstractmethod
    def split_serializer(self) -> VersionedSerializer[SplitT]:
        """How splits travel to readers and into reader checkpoints."""

    @abstractmethod
    def enumerator_state_serializer(self) -> VersionedSerializer[EnumStateT]:
        """How the enumerator's state goes into checkpoints."""
