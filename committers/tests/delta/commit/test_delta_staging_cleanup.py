"""The background clean-up of committed micro-batches (``commit/_staging_cleanup``), driven
directly on a local table: what it deletes and keeps, retries, the sweep after a lost
clean-up, and the wait once too many batches are handed over. (On S3, where the committer uses
it, ``integration_tests/test_exactly_once_s3.py`` kills a driver before its worker is done.)"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from committers.delta import DeltaSink, StagedFile
from committers.delta.commit import _staging_cleanup
from committers.delta.commit._staging_cleanup import MAX_PENDING, StagingCleaner
from committers.tests._delta_helpers import assert_no_orphans, staging_leftovers
from framework.sink import Epoch, WriterContext

SCHEMA = pa.schema([("id", pa.int64())])
# The cleaner's retries (three attempts) without its pauses.
FAST_RETRIES = replace(_staging_cleanup.RETRY_BACKOFF, initial_delay=0.01, max_delay=0.02)
APP_ID = "cleaner"


def _epoch(epoch_id: int) -> Epoch:
    return Epoch(app_id=APP_ID, epoch_id=epoch_id, writer_identity="w", run_id=uuid.uuid4().hex)


def _stage(sink: DeltaSink, epoch: Epoch, task: int, attempt_id: int) -> list[StagedFile]:
    context = WriterContext(
        epoch=epoch, partition_id=task, attempt_number=0, task_attempt_id=attempt_id
    )
    writer = sink.create_writer(context)
    writer.write(pa.RecordBatch.from_pydict({"id": [epoch.epoch_id * 10 + task]}, schema=SCHEMA))
    return writer.prepare_commit(True)


class _Table:
    """A local table whose epochs are committed with a failed attempt's file left staged."""

    def __init__(self, tmp_path: Path) -> None:
        self.uri = str(tmp_path / "table")
        self.sink = DeltaSink(self.uri, app_id=APP_ID)
        self.sink.prepare(SCHEMA)
        self.committer = self.sink.create_global_committer()
        self.orphans: dict[int, list[str]] = {}

    def commit(self, epoch_id: int) -> tuple[Epoch, set[str], set[int]]:
        """Commit ``epoch_id`` (two tasks) without cleaning up; a third, failed attempt of
        task 1 leaves its file staged. Returns what the committer hands over."""
        epoch = _epoch(epoch_id)
        committed = _stage(self.sink, epoch, 0, 100 + epoch_id) + _stage(
            self.sink, epoch, 1, 200 + epoch_id
        )
        failed = _stage(self.sink, epoch, 1, 300 + epoch_id)
        self.orphans[epoch_id] = [f.path for f in failed]
        self.committer.commit([self.committer.combine(epoch, committed)])
        return epoch, {f.path for f in committed}, {f.task_attempt_id for f in committed}

    def ids(self) -> list[int]:
        return sorted(DeltaTable(self.uri).to_pyarrow_table().column("id").to_pylist())

    def orphan_exists(self, epoch_id: int) -> bool:
        return any((Path(self.uri) / path).exists() for path in self.orphans[epoch_id])


def test_a_handed_over_epoch_loses_its_uncommitted_files_and_keeps_its_commit(tmp_path):
    table = _Table(tmp_path)
    epoch, files, attempts = table.commit(0)
    assert table.orphan_exists(0) and staging_leftovers(table.uri)

    cleaner = StagingCleaner(table.sink.location)
    cleaner.hand_over(epoch, files, attempts)
    assert cleaner.wait_idle(30)

    assert not table.orphan_exists(0)
    assert table.ids() == [0, 1]
    assert_no_orphans(table.uri)
    assert cleaner.failures == 0


def test_a_failed_clean_up_is_retried(tmp_path, monkeypatch):
    table = _Table(tmp_path)
    epoch, files, attempts = table.commit(0)
    real = _staging_cleanup.remove_leftovers
    calls = []

    def fail_first(*args, **kwargs):
        calls.append(args[1].epoch_id)
        if len(calls) == 1:
            raise OSError("the store answered 503")
        return real(*args, **kwargs)

    monkeypatch.setattr(_staging_cleanup, "remove_leftovers", fail_first)
    monkeypatch.setattr(_staging_cleanup, "RETRY_BACKOFF", FAST_RETRIES)
    cleaner = StagingCleaner(table.sink.location)
    cleaner.hand_over(epoch, files, attempts)
    assert cleaner.wait_idle(30)

    assert calls == [0, 0]
    assert cleaner.failures == 1
    assert_no_orphans(table.uri)


def test_an_epoch_whose_clean_up_was_lost_is_swept_by_the_next_hand_over(
    tmp_path, monkeypatch, caplog
):
    """Epoch 1's clean-up fails every time (or its process died): epoch 2's hand-over sweeps
    it, keeping what epoch 1's commit references, found in the table's history."""
    table = _Table(tmp_path)
    handed = [table.commit(epoch_id) for epoch_id in range(3)]
    real = _staging_cleanup.remove_leftovers

    def epoch_1_fails(location, epoch, **kwargs):
        if epoch.epoch_id == 1 and kwargs.get("committed_attempts"):  # not in a sweep
            raise OSError("connection reset")
        return real(location, epoch, **kwargs)

    monkeypatch.setattr(_staging_cleanup, "remove_leftovers", epoch_1_fails)
    monkeypatch.setattr(_staging_cleanup, "RETRY_BACKOFF", FAST_RETRIES)
    cleaner = StagingCleaner(table.sink.location)
    cleaner.hand_over(*handed[0])
    cleaner.hand_over(*handed[1])
    assert cleaner.wait_idle(30)
    assert cleaner.failures == FAST_RETRIES.max_attempts
    assert table.orphan_exists(1) and not table.orphan_exists(0)

    with caplog.at_level(logging.INFO, logger="committers.delta"):
        cleaner.hand_over(*handed[2])
        assert cleaner.wait_idle(30)

    assert "sweeping the staging left by batch 1" in caplog.text
    assert not table.orphan_exists(1) and not table.orphan_exists(2)
    assert table.ids() == [0, 1, 10, 11, 20, 21]
    assert_no_orphans(table.uri)


def test_a_new_process_sweeps_epochs_whose_clean_up_never_ran(tmp_path):
    """A driver lost before its worker started leaves epochs 0 and 1 staged; the first
    hand-over of the writer's next process (a new cleaner) sweeps them."""
    table = _Table(tmp_path)
    lost = [table.commit(epoch_id) for epoch_id in range(2)]
    assert lost and table.orphan_exists(0) and table.orphan_exists(1)

    cleaner = StagingCleaner(table.sink.location)
    cleaner.hand_over(*table.commit(2))
    assert cleaner.wait_idle(30)

    assert table.ids() == [0, 1, 10, 11, 20, 21]
    assert_no_orphans(table.uri)


def test_hand_overs_beyond_the_pending_bound_wait_for_the_worker(tmp_path, monkeypatch):
    table = _Table(tmp_path)
    epoch, files, attempts = table.commit(0)
    release = threading.Event()
    monkeypatch.setattr(StagingCleaner, "_clean", lambda self, job: release.wait(30))
    cleaner = StagingCleaner(table.sink.location)
    cleaner.hand_over(epoch, files, attempts)  # taken by the worker, which blocks
    assert not cleaner.wait_idle(0.2)
    for _ in range(MAX_PENDING):
        cleaner.hand_over(epoch, files, attempts)  # queued
    one_more = threading.Thread(target=cleaner.hand_over, args=(epoch, files, attempts))
    one_more.start()
    one_more.join(0.5)
    assert one_more.is_alive()  # waits for room in the queue

    release.set()
    one_more.join(30)
    assert not one_more.is_alive()
    assert cleaner.wait_idle(30)


def test_a_local_table_is_cleaned_up_before_clean_up_returns(tmp_path):
    """Only micro-batches on object stores are handed over: on a local table ``clean_up`` has
    removed the batch's staging when it returns."""
    table = _Table(tmp_path)
    epoch, _, _ = table.commit(0)
    table.committer.clean_up(epoch)
    assert not table.orphan_exists(0)
    assert_no_orphans(table.uri)
