"""A lazy split enumerator for bounded sources, and an in-process enumerator context.

:class:`LazySplitEnumerator` generates a split only when a reader asks for one, through a
:class:`SplitAssigner` that knows how to produce the next split and how to describe where it
is. Splits added back (from a failed reader) are handed out first, in the order they came back.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from framework.errors import ConfigurationError
from framework.source._api import Split, SplitEnumerator, SplitEnumeratorContext

__all__ = [
    "LazyEnumeratorState",
    "LazySplitEnumerator",
    "LocalEnumeratorContext",
    "SplitAssigner",
]

SplitT = TypeVar("SplitT", bound=Split)
SplitT_co = TypeVar("SplitT_co", bound=Split, covariant=True)
AssignerStateT = TypeVar("AssignerStateT")
AssignerStateT_co = TypeVar("AssignerStateT_co", covariant=True)


class SplitAssigner(Protocol[SplitT_co, AssignerStateT_co]):
    """Produces new splits one at a time, and describes how far it got."""

    def next_split(self) -> SplitT_co | None:
        """Generate the next split, or ``None`` once the input is exhausted."""
        ...

    def snapshot_state(self) -> AssignerStateT_co:
        """Enough to build an assigner that continues with the split :meth:`next_split` would
        return next (a split generated but not returned is generated again)."""
        ...


@dataclass(frozen=True, kw_only=True)
class LazyEnumeratorState(Generic[SplitT, AssignerStateT]):
    """The checkpointed state of a :class:`LazySplitEnumerator`.

    Attributes:
        pending: splits added back and not handed out again yet, in hand-out order.
        assigner: where the assigner continues generating.
    """

    pending: tuple[SplitT, ...]
    assigner: AssignerStateT


class LazySplitEnumerator(SplitEnumerator[SplitT, LazyEnumeratorState[SplitT, AssignerStateT]]):
    """Serves each split request with a split added back, else a newly generated one.

    For bounded sources: a request that finds neither is answered with "no more splits".
    Guarantee: over a run (including restores from a snapshot of this enumerator together with
    the readers' snapshots of the same checkpoint), every split the assigner generates is
    assigned, and a split comes back only through :meth:`add_splits_back`.

    A reader already told "no more splits" is given none of the splits added back later: the
    engine restarts the failed reader (or another one) and its request gets them.

    Args:
        context: where assignments go.
        assigner: generates the new splits.
        pending: splits to hand out before any new one (from a restored state).
    """

    def __init__(
        self,
        context: SplitEnumeratorContext[SplitT],
        assigner: SplitAssigner[SplitT, AssignerStateT],
        *,
        pending: Iterable[SplitT] = (),
    ) -> None:
        self._context = context
        self._assigner = assigner
        self._pending: deque[SplitT] = deque(pending)

    def handle_split_request(self, subtask_id: int, requester_host: str | None = None) -> None:
        """Assign one split to ``subtask_id``, or signal it that there are no more."""
        split = self._pending.popleft() if self._pending else self._assigner.next_split()
        if split is None:
            self._context.signal_no_more_splits(subtask_id)
        else:
            self._context.assign_split(split, subtask_id)

    def add_splits_back(self, splits: Sequence[SplitT], subtask_id: int) -> None:
        """Queue ``splits`` to be handed out again before any new split."""
        self._pending.extend(splits)

    def snapshot_state(self, checkpoint_id: int) -> LazyEnumeratorState[SplitT, AssignerStateT]:
        """The splits waiting to be handed out again and the assigner's position."""
        return LazyEnumeratorState(
            pending=tuple(self._pending), assigner=self._assigner.snapshot_state()
        )


class LocalEnumeratorContext(Generic[SplitT]):
    """A :class:`SplitEnumeratorContext` that records assignments for the caller to deliver.

    For engines (and tests) that drive the enumerator in-process: call
    ``handle_split_request``, then :meth:`take_assignments` and :meth:`has_no_more_splits`.

    Args:
        parallelism: number of parallel readers.

    Raises:
        ConfigurationError: ``parallelism`` is not a positive integer.
    """

    def __init__(self, parallelism: int) -> None:
        if isinstance(parallelism, bool) or not isinstance(parallelism, int) or parallelism < 1:
            raise ConfigurationError(f"parallelism must be a positive integer, got {parallelism!r}")
        self._parallelism = parallelism
        self._assigned: defaultdict[int, list[SplitT]] = defaultdict(list)
        self._no_more: set[int] = set()

    @property
    def current_parallelism(self) -> int:
        """Number of parallel readers."""
        return self._parallelism

    def assign_split(self, split: SplitT, subtask_id: int) -> None:
        """Record ``split`` for ``subtask_id``."""
        self._check(subtask_id)
        self._assigned[subtask_id].append(split)

    def signal_no_more_splits(self, subtask_id: int) -> None:
        """Record that ``subtask_id`` gets no further split."""
        self._check(subtask_id)
        self._no_more.add(subtask_id)

    def take_assignments(self, subtask_id: int) -> list[SplitT]:
        """The splits assigned to ``subtask_id`` since the last call, oldest first."""
        return self._assigned.pop(subtask_id, [])

    def has_no_more_splits(self, subtask_id: int) -> bool:
        """Whether ``subtask_id`` was told that no further split will come."""
        return subtask_id in self._no_more

    def reset_reader(self, subtask_id: int) -> list[SplitT]:
        """Forget ``subtask_id``'s reader (it failed and will be replaced).

        Returns:
            The splits assigned to it and not taken yet: add them back to the enumerator along
            with the splits the failed reader held.
        """
        self._no_more.discard(subtask_id)
        return self.take_assignments(subtask_id)

    def _check(self, subtask_id: int) -> None:
        if not 0 <= subtask_id < self._parallelism:
            raise ValueError(f"subtask {subtask_id} out of range 0..{self._parallelism - 1}")
