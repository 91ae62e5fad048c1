"""The one commit sequence of the Delta connector.

Every commit the connector makes to an existing table through delta-rs, an epoch's append,
overwrite or upsert (:mod:`._committer`) and a compaction (:mod:`._compact`), runs through
:func:`commit_once`:

1. each attempt works on the newest snapshot (:func:`advance` brings a handle there);
2. it checks what it relies on in that snapshot: the files it removes are still live
   (:func:`files_gone`), the table's rules and layout unchanged (the caller's checks);
3. it writes ONE transaction (:func:`write_transaction`), which lands right on top of the
   snapshot when it removes files (``max_commit_retries=0``: the next version, or
   ``CommitFailedError``);
4. a failure whose outcome is unknown (:func:`classify_delta_commit_error`) is settled by the
   caller's ``landed`` read of the log (the epoch's ``txn``, a run id in the commitInfo) before
   anything is repeated (:func:`framework.retry.commit_with_reconciliation`), so a commit lands
   at most once;
5. losing every race (each attempt refused with ``CommitFailedError``, nothing of it in the
   log) is a :class:`~framework.errors.CommitConflictError`: a definite failure, nothing
   committed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties
from deltalake.exceptions import (
    CommitFailedError,
    DeltaError,
    DeltaProtocolError,
    SchemaMismatchError,
)
from deltalake.transaction import AddAction, RemoveAction

from committers.delta.commit._change_data_commit import every_live_remove
from committers.delta.commit._log_rewrite import needs_log_rewrite, write_log_rewrite
from committers.delta.storage._s3errors import STAGING_ERRORS
from committers.delta.storage._storage import TableLocation
from committers.delta.table._deletion_vectors import DeletionVectorDescriptor
from committers.delta.table._protocol import DELTA_RS_REFUSES
from committers.delta.write._committable import StagedFile
from framework.errors import CommitConflictError, CommitStateUnknownError
from framework.retry import Backoff, CommitResult, Verdict, commit_with_reconciliation

__all__ = [
    "POST_COMMIT",
    "add_action",
    "advance",
    "classify_delta_commit_error",
    "commit_once",
    "files_gone",
    "write_transaction",
]

log = logging.getLogger("committers.delta")

#: Checkpoints and log clean-up run on the committer's LogMaintenance worker, off the commit.
POST_COMMIT = PostCommitHookProperties(create_checkpoint=False, cleanup_expired_logs=False)

T = TypeVar("T")


def classify_delta_commit_error(err: BaseException) -> Verdict:
    """Verdict for an exception raised by a delta-rs commit (``create_write_transaction``).

    delta-rs retries transient object-store errors itself before raising, and writes the log
    entry with a conditional PUT. So:

    * ``OSError`` (an object-store error that survived delta-rs's own retries, e.g. the
      connection dropped after the log entry was sent) -> ``UNKNOWN``;
    * ``CommitFailedError`` (a conflict delta-rs did not resolve; also what an internal retry
      of our own, already landed, conditional PUT turns into) and other ``DeltaError``s
      (e.g. a handle older than cleaned-up log files) -> ``UNKNOWN``;
    * protocol and schema errors, and anything else (bad arguments, our own errors) -> ``FAIL``.
    """
    if isinstance(err, (DeltaProtocolError, SchemaMismatchError)):
        return Verdict.FAIL  # the table refuses this commit: no retry can change that
    if isinstance(err, (DeltaError, OSError)):
        return Verdict.UNKNOWN  # includes CommitFailedError; reading the txn settles it
    return Verdict.FAIL


def commit_once(
    attempt: Callable[[int], T],
    *,
    landed: Callable[[], bool],
    backoff: Backoff,
    description: str,
    lost_every_race: Callable[[int], str],
) -> CommitResult[T]:
    """Run ``attempt(1)``, ``attempt(2)``, ... until one commits, or the commit is found in
    the log, or the attempts run out (see the module docstring).

    Args:
        attempt: one attempt, given its number: steps 1-3 of the sequence; returns what the
            result's ``value`` carries.
        landed: whether the log holds this commit (reads that fail with a transient S3 error
            are retried); may raise a ``SinkError`` with a definite answer.
        backoff: the attempts and the sleeps between them.
        description: what is committed, for log lines and errors.
        lost_every_race: the message of the ``CommitConflictError`` raised when every attempt
            lost its race, given the attempts made.

    Raises:
        CommitConflictError: every attempt lost a race to another writer; nothing landed.
        CommitStateUnknownError: the outcome could not be established.
        BaseException: what an attempt raised that no retry can change (a ``FAIL`` verdict),
            or what ``landed`` raised as a ``SinkError``.
    """
    attempts = 0

    def numbered() -> T:
        nonlocal attempts
        attempts += 1
        return attempt(attempts)

    try:
        return commit_with_reconciliation(
            numbered,
            is_committed=landed,
            classify=classify_delta_commit_error,
            read_classify=STAGING_ERRORS,
            backoff=backoff,
            description=description,
        )
    except CommitStateUnknownError as err:
        if isinstance(err.__cause__, CommitFailedError):
            # delta-rs refused the last attempt (its conditional PUT lost) and the log
            # confirmed nothing landed: a definite failure under contention.
            raise CommitConflictError(lost_every_race(attempts)) from err.__cause__
        raise


def advance(table: DeltaTable, location: TableLocation) -> bool:
    """Bring ``table`` to the newest version; ``False`` when its log can no longer be followed
    (e.g. the handle is older than log files cleaned up since): load the table afresh."""
    try:
        table.update_incremental()
    except DeltaError as err:
        log.info("reloading %s after failed incremental update: %s", location, err)
        return False
    return True


def files_gone(table: DeltaTable, logged_paths: Iterable[str]) -> list[str]:
    """Those of ``logged_paths`` (as the log spells them) that are no live file of
    ``table``'s snapshot: another commit removed them since they were read."""
    wanted = list(logged_paths)
    if not wanted:
        return []
    live = set(pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist())
    return [path for path in wanted if path not in live]


def add_action(staged: StagedFile, *, data_change: bool = True) -> AddAction:
    """The add action of a staged file (``data_change=False``: its rows were in the table
    already, as after a compaction)."""
    return AddAction(
        path=staged.path,
        size=staged.size,
        partition_values=dict(staged.partition_values),
        modification_time=staged.modification_time,
        data_change=data_change,
        stats=staged.stats,
    )


def delta_rs_commits(table: DeltaTable) -> bool:
    """Whether delta-rs commits to ``table`` (its protocol enables no feature of
    :data:`DELTA_RS_REFUSES`)."""
    return not set(table.protocol().writer_features or ()) & DELTA_RS_REFUSES


def write_transaction(
    table: DeltaTable,
    actions: Sequence[AddAction | RemoveAction],
    *,
    mode: Literal["append", "overwrite"],
    partition_by: Sequence[str],
    commit_properties: CommitProperties,
    post_commit: PostCommitHookProperties,
    partition_filters: list[Any] | None = None,
    location: TableLocation | None = None,
    vectors: Mapping[str, DeletionVectorDescriptor] | None = None,
) -> None:
    """Step 3: one transaction of ``actions`` on top of ``table``'s snapshot, with its schema:
    through delta-rs, or written into the log by :mod:`._log_rewrite` (needs ``location``)
    when a remove names a file with a deletion vector (``vectors``: decoded path -> vector),
    which delta-rs cannot spell, or when delta-rs refuses to commit to the table at all
    (:func:`delta_rs_commits`); an overwrite then removes every live file by name."""
    by_delta_rs = delta_rs_commits(table)
    if needs_log_rewrite(actions, vectors) or not by_delta_rs:
        if location is None or (mode == "overwrite" and (by_delta_rs or partition_filters)):
            raise ValueError(
                "a commit through the sink's log writer needs a location; an overwrite there "
                "removes every live file (no partition filters)"
            )
        if mode == "overwrite":
            now = int(time.time() * 1000)
            live = every_live_remove(table, location)
            removes = [
                RemoveAction(unquote(r.logged_path), True, now, r.size, dict(r.partition_values))
                for r in live
            ]
            vectors = {unquote(r.logged_path): r.vector for r in live if r.vector is not None}
            actions = [*removes, *actions]
        write_log_rewrite(
            table,
            location,
            actions,
            vectors or {},
            partition_by=partition_by,
            commit_properties=commit_properties,
            post_commit=post_commit,
            mode="Overwrite" if mode == "overwrite" else "Append",
        )
        return
    table.create_write_transaction(
        list(actions),
        mode=mode,
        schema=table.schema(),
        partition_by=list(partition_by) or None,
        partition_filters=partition_filters,
        commit_properties=commit_properties,
        post_commithook_properties=post_commit,
    )
