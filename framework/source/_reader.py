"""A source reader that multiplexes the splits of one task over one split reader."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from framework.errors import SinkError
from framework.source._api import (
    InputStatus,
    RecordEmitter,
    SourceOutput,
    SourceReader,
    SourceReaderContext,
    Split,
    SplitReader,
    SplitState,
)

__all__ = ["MultiplexSourceReader"]

E = TypeVar("E")
T = TypeVar("T")
SplitT = TypeVar("SplitT", bound=Split)
StateT = TypeVar("StateT", bound=SplitState[Any])


class MultiplexSourceReader(SourceReader[T, SplitT], Generic[E, T, SplitT, StateT]):
    """Reads the splits of one task through one :class:`SplitReader`, on the caller's thread.

    :meth:`poll_next` fetches a portion of records, passes each to the :class:`RecordEmitter`
    (which advances the split's state) and drops the splits read to their end. It asks the
    enumerator for a split at :meth:`start` when none was restored, and for one more each time a
    split finishes, so splits are generated as they are needed.

    Guarantee: :meth:`snapshot_state` reflects exactly the records emitted into the output;
    records fetched but not emitted yet are read again by a reader restored from it. When the
    emitter or the output raises, the element stays queued and the next :meth:`poll_next` passes
    it again (the emitter's idempotence makes that harmless).

    Args:
        split_reader: reads the records; owned (closed) by this reader.
        record_emitter: turns fetched elements into output and advances split states.
        context: where split requests go.
        initial_state: the mutable state of a newly added split.
    """

    def __init__(
        self,
        split_reader: SplitReader[E, SplitT],
        record_emitter: RecordEmitter[E, T, StateT],
        context: SourceReaderContext,
        *,
        initial_state: Callable[[SplitT], StateT],
    ) -> None:
        self._split_reader = split_reader
        self._emitter = record_emitter
        self._context = context
        self._initial_state = initial_state
        self._states: dict[str, StateT] = {}
        self._queued: deque[tuple[str, E]] = deque()
        self._finishing: frozenset[str] = frozenset()
        self._no_more_splits = False

    def start(self) -> None:
        """Ask for a first split unless splits were restored."""
        if not self._states:
            self._context.send_split_request()

    def add_splits(self, splits: Sequence[SplitT]) -> None:
        """Start tracking ``splits`` and hand them to the split reader.

        Raises:
            SinkError: a split with the same id is already held (the engine delivered it twice).
        """
        ids = [split.split_id for split in splits]
        for split_id in ids:
            if split_id in self._states or ids.count(split_id) > 1:
                raise SinkError(f"split {split_id!r} was assigned twice to one reader")
        for split in splits:
            self._states[split.split_id] = self._initial_state(split)
        self._split_reader.handle_splits_changes(splits)

    def notify_no_more_splits(self) -> None:
        """Once the held splits are finished, :meth:`poll_next` reports the end of input."""
        self._no_more_splits = True

    def poll_next(self, output: SourceOutput[T]) -> InputStatus:
        """Emit the records of one fetch (or the rest of an interrupted one).

        Raises:
            SinkError: the split reader returned records of a split this reader does not hold.
        """
        if not self._queued and not self._finishing:
            if not self._states:
                return self._status()
            fetched = self._split_reader.fetch()
            for split_id, elements in fetched.records.items():
                self._queued.extend((split_id, element) for element in elements)
            self._finishing = fetched.finished_splits
        while self._queued:
            split_id, element = self._queued[0]
            state = self._states.get(split_id)
            if state is None:
                raise SinkError(f"the split reader returned records of unknown split {split_id!r}")
            self._emitter.emit_record(element, output, state)
            self._queued.popleft()
        finished, self._finishing = self._finishing, frozenset()
        for split_id in sorted(finished):
            if self._states.pop(split_id, None) is not None:
                self._context.send_split_request()
        return self._status()

    def snapshot_state(self, checkpoint_id: int) -> list[SplitT]:
        """The held splits, each with the progress of the records emitted so far."""
        return [state.to_split() for state in self._states.values()]

    def wake_up(self) -> None:
        """Make a running fetch return soon. Thread-safe."""
        self._split_reader.wake_up()

    def close(self) -> None:
        """Close the split reader."""
        self._split_reader.close()

    def _status(self) -> InputStatus:
        if self._states:
            return InputStatus.MORE_AVAILABLE
        return InputStatus.END_OF_INPUT if self._no_more_splits else InputStatus.NOTHING_AVAILABLE
