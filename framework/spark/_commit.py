"""Driver side: commit one epoch's committables with a sink's committers."""

from __future__ import annotations

from typing import Any

from framework._row_count import check_row_count
from framework.errors import CommitError
from framework.sink import Epoch, GlobalCommitter, Sink

__all__ = ["commit_epoch"]


def commit_epoch(
    sink: Sink[Any, Any, Any],
    committer: GlobalCommitter[Any, Any],
    epoch: Epoch,
    committables: list[Any],
    *,
    attempts: int,
    written_rows: int,
) -> None:
    """Check that the committables hold the ``written_rows`` the epoch's writers wrote (when
    the global committer counts rows), then run the sink's per-committable committer (if
    any), then the global committer on the epoch's combined committable, each retried while
    it hands committables back, at most ``attempts`` times.

    Raises:
        RowCountMismatchError: the committables hold other than ``written_rows`` rows;
            nothing was committed.
        CommitError: a committer still asked for a retry after ``attempts`` tries; whatever
            the committers raised.
    """
    committed = committer.committed_rows(committables)
    if committed is not None:
        check_row_count(
            f"batch {epoch.epoch_id} of app id {epoch.app_id!r} into {sink.destination}",
            written=written_rows,
            committed=committed,
        )
    per_committable = sink.create_committer()
    if per_committable is not None:
        pending = committables
        for _ in range(attempts):
            pending = per_committable.commit(pending)
            if not pending:
                break
        else:
            raise CommitError(f"committer left {len(pending)} committables uncommitted")
    pending_global = committer.filter_recovered_committables(
        [committer.combine(epoch, committables)]
    )
    for _ in range(attempts):
        pending_global = committer.commit(pending_global)
        if not pending_global:
            return
    raise CommitError(f"global committer asked to retry batch {epoch.epoch_id} {attempts} times")
