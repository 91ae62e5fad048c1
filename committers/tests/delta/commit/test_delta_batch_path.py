"""How one micro-batch of ``write_stream`` passes through the Delta committer: the engine
(``framework/spark``) drives the global committer step by step (replay check, row count,
combine, commit, clean-up, version), and each step enters ``commit/_committer.py`` once, but
for the callbacks of the commit step named below. Traced with :func:`sys.setprofile` around
each epoch the engine runs."""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

import committers.delta.commit._committer as committer_module
from committers.delta import DeltaSink
from committers.tests._delta_helpers import ids
from committers.tests._spark_helpers import file_stream, make_source, run_available_now
from framework import TwoPhaseSink

pytestmark = [pytest.mark.spark]

#: The committer's class and the parts mixed into it (one module each).
COMMITTER_FILES = frozenset(
    inspect.getfile(part)
    for part in committer_module.DeltaGlobalCommitter.__mro__
    if part.__module__.startswith("committers.delta.commit.")
)


def _entries_per_epoch(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Per epoch the engine runs: the functions of the committer (``commit/_committer.py`` and
    the modules mixed into its class) entered from outside it (a call whose caller is in another
    module), in order."""
    epochs: list[list[str]] = []
    original = TwoPhaseSink._run_epoch

    def traced(self: TwoPhaseSink, *args: Any, **kwargs: Any) -> Any:
        entered: list[str] = []
        epochs.append(entered)

        def profile(frame: FrameType, event: str, _: object) -> None:
            if event != "call" or frame.f_code.co_filename not in COMMITTER_FILES:
                return
            caller = frame.f_back
            if caller is None or caller.f_code.co_filename not in COMMITTER_FILES:
                entered.append(frame.f_code.co_name)

        previous: Callable[..., Any] | None = sys.getprofile()
        sys.setprofile(profile)  # this thread only: the one running the batch
        try:
            return original(self, *args, **kwargs)
        finally:
            sys.setprofile(previous)

    monkeypatch.setattr(TwoPhaseSink, "_run_epoch", traced)
    return epochs


def test_one_micro_batch_enters_the_committer_once_per_step(spark, tmp_path, monkeypatch):
    epochs = _entries_per_epoch(monkeypatch)
    src, table = make_source(tmp_path, 2, per_file=5), str(tmp_path / "table")
    sink = TwoPhaseSink(DeltaSink(table, app_id="path"))
    run_available_now(sink, file_stream(spark, src), tmp_path / "chk")

    assert sorted(ids(table)) == list(range(10))
    assert [b.status for b in sink.batches] == ["committed", "committed"]
    # The engine's steps, each entering the committer once; inside the commit step the one
    # commit sequence's retry loop (framework.retry) calls the committer's attempt back, and a
    # blind append's log writer asks it for the commit file's bytes (a callback each). After
    # the batch, auto-compaction (on for streams) reads the table once per process, through
    # the committer's handle, to count the small files it starts from; the batch's metrics,
    # recorded last, ask for the version that holds it.
    first = ["is_committed", "committed_rows", "combine", "commit", "attempt"]
    assert epochs == [
        # batch 0 creates the table through delta-rs
        [*first, "clean_up", "after_epoch", "table", "committed_version"],
        # batch 1 appends straight into the log
        [*first, "<lambda>", "clean_up", "after_epoch", "committed_version"],
    ]
