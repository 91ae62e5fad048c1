"""The exactly-once contract as executable checks.

A destination implements :class:`ConformanceHarness` (how to build its sink, make input, and
read back what is committed) and runs every function in :data:`CONFORMANCE_CHECKS` from its own
test suite, e.g. with ``pytest.mark.parametrize``. Each check raises ``AssertionError`` with a
message naming the broken promise.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from framework.errors import ConcurrentWriterError
from framework.sink import Epoch, GlobalCommitter, Sink, WriterContext

__all__ = ["CONFORMANCE_CHECKS", "ConformanceHarness"]


class ConformanceHarness(ABC):
    """What a destination provides to the shared checks. One fresh destination per instance."""

    @abstractmethod
    def create_sink(self) -> Sink[Any, Any, Any]:
        """A sink writing to this harness's destination, ready to create writers."""

    @abstractmethod
    def make_batch(self, keys: Sequence[int]) -> Any:
        """One input batch holding one record per key."""

    @abstractmethod
    def committed_keys(self) -> list[int]:
        """Keys of every committed record, with repetitions, in any order."""

    @abstractmethod
    def uncommitted_leftovers(self) -> list[str]:
        """Staged items (files, manifests) that no commit references."""

    # -- shared plumbing ------------------------------------------------------------------

    def epoch(self, epoch_id: int, writer: str = "writer-a", app_id: str = "conformance") -> Epoch:
        return Epoch(
            app_id=app_id, epoch_id=epoch_id, writer_identity=writer, run_id=str(uuid.uuid4())
        )

    def one_off_epoch(self) -> Epoch:
        """The epoch of a bounded write without an app id (see :attr:`Epoch.one_off`)."""
        return Epoch(
            app_id=f"one-off-{uuid.uuid4()}",
            epoch_id=0,
            writer_identity="one-off",
            run_id=str(uuid.uuid4()),
            bounded=True,
            one_off=True,
        )

    def stage(
        self, sink: Sink[Any, Any, Any], epoch: Epoch, keys: Sequence[int], attempt: int = 0
    ) -> list[Any]:
        context = WriterContext(
            epoch=epoch, partition_id=0, attempt_number=attempt, task_attempt_id=attempt
        )
        writer = sink.create_writer(context)
        try:
            writer.write(self.make_batch(keys))
            return writer.prepare_commit(True)
        finally:
            writer.close()

    def committer(self, sink: Sink[Any, Any, Any]) -> GlobalCommitter[Any, Any]:
        committer = sink.create_global_committer()
        assert committer is not None, "an exactly-once sink needs a global committer"
        return committer

    def commit(
        self, sink: Sink[Any, Any, Any], epoch: Epoch, keys: Sequence[int]
    ) -> GlobalCommitter[Any, Any]:
        committer = self.committer(sink)
        committables = self.stage(sink, epoch, keys)
        assert committer.commit([committer.combine(epoch, committables)]) == []
        committer.clean_up(epoch)
        return committer


def committing_the_same_epoch_twice_yields_one_commit(h: ConformanceHarness) -> None:
    sink = h.create_sink()
    epoch = h.epoch(0)
    committer = h.commit(sink, epoch, range(10))
    again = h.stage(sink, epoch, range(10))
    committer.commit([committer.combine(epoch, again)])
    committer.clean_up(epoch)
    assert sorted(h.committed_keys()) == list(range(10)), "an epoch was committed twice"
    assert h.uncommitted_leftovers() == [], "the second copy of a committed epoch was left behind"


def a_new_committer_recognises_committed_epochs(h: ConformanceHarness) -> None:
    sink = h.create_sink()
    h.commit(sink, h.epoch(4), range(5))
    fresh = h.committer(sink)  # as after a coordinator restart: state comes from the destination
    assert fresh.is_committed(h.epoch(4)), "a committed epoch was not recognised after restart"
    assert fresh.is_committed(h.epoch(3)), "an older epoch was not recognised as committed"
    assert not fresh.is_committed(h.epoch(5)), "a new epoch was taken for committed"


def only_combined_committables_are_committed(h: ConformanceHarness) -> None:
    sink = h.create_sink()
    epoch = h.epoch(0)
    h.stage(sink, epoch, range(100, 110), attempt=0)  # a failed attempt: its result is dropped
    kept = h.stage(sink, epoch, range(10), attempt=1)
    committer = h.committer(sink)
    committer.commit([committer.combine(epoch, kept)])
    committer.clean_up(epoch)
    assert sorted(h.committed_keys()) == list(range(10)), "a failed attempt's data was committed"
    assert h.uncommitted_leftovers() == [], "a failed attempt's staged data was left behind"


def abort_discards_everything_staged(h: ConformanceHarness) -> None:
    sink = h.create_sink()
    epoch = h.epoch(0)
    h.stage(sink, epoch, range(10))
    h.committer(sink).abort(epoch)
    assert h.committed_keys() == [], "an aborted epoch was committed"
    assert h.uncommitted_leftovers() == [], "an aborted epoch left staged data behind"


def another_writer_with_the_same_app_id_is_an_error(h: ConformanceHarness) -> None:
    sink = h.create_sink()
    h.commit(sink, h.epoch(0, writer="query-a"), range(3))
    try:
        h.committer(sink).is_committed(h.epoch(0, writer="query-b"))
    except ConcurrentWriterError:
        return
    raise AssertionError("a second writer sharing an app id would silently skip its batch")


def epochs_accumulate_exactly(h: ConformanceHarness) -> None:
    sink = h.create_sink()
    committer = h.committer(sink)
    for epoch_id in range(5):
        epoch = h.epoch(epoch_id)
        committables = h.stage(sink, epoch, range(epoch_id * 10, epoch_id * 10 + 10))
        committer.commit([committer.combine(epoch, committables)])
        committer.clean_up(epoch)
    assert sorted(h.committed_keys()) == list(range(50)), "epochs were lost or duplicated"
    assert committer.last_committed_epoch("conformance") in (4, None)


def one_off_epochs_each_commit_once(h: ConformanceHarness) -> None:
    """Writes without an app id: the same run committed again (a retried commit) lands once,
    two runs both land, an aborted one leaves nothing."""
    sink = h.create_sink()
    first = h.one_off_epoch()
    committer = h.committer(sink)
    assert not committer.is_committed(first), "a new one-off write was taken for committed"
    committer.commit([committer.combine(first, h.stage(sink, first, range(10)))])
    committer.clean_up(first)
    committer.commit([committer.combine(first, h.stage(sink, first, range(10)))])
    committer.clean_up(first)
    h.commit(sink, h.one_off_epoch(), range(10, 20))
    aborted = h.one_off_epoch()
    h.stage(sink, aborted, range(100, 110))
    h.committer(sink).abort(aborted)
    assert sorted(h.committed_keys()) == list(range(20)), "one-off writes were lost or repeated"
    assert h.uncommitted_leftovers() == [], "a one-off write left staged data behind"


CONFORMANCE_CHECKS: tuple[Callable[[ConformanceHarness], None], ...] = (
    committing_the_same_epoch_twice_yields_one_commit,
    a_new_committer_recognises_committed_epochs,
    only_combined_committables_are_committed,
    abort_discards_everything_staged,
    another_writer_with_the_same_app_id_is_an_error,
    epochs_accumulate_exactly,
    one_off_epochs_each_commit_once,
)
