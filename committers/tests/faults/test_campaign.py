"""A few cycles of the crash-point campaign (``make campaign`` runs every step many times): the
driver's whole process tree is SIGKILLed at steps of the protocol, and restarted from its
checkpoint; the table must then hold every source row exactly once, read by deltalake and
DuckDB, with nothing staged left behind."""

from __future__ import annotations

import pytest

from committers.tests._campaign import run_campaign

# Kills processes: runs in its own pytest-xdist worker, beside the rest (`make test`).
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.xdist_group("kills_processes")]

#: Inside a Python task, while the commit file is written, between the commit and Spark's
#: record of the batch, and between a schema-merge commit and the data commit.
KINDS = ("staging", "commit_write", "after_commit", "schema_merge")


def test_kills_at_four_steps_leave_the_table_exact(tmp_path):
    """Runs alternate between Spark's Parquet writer and the Python writers; with this seed
    the ``staging`` kill lands on a Python-writer run (inside its task)."""
    report = run_campaign(seed=2026, cycles=4, workdir=tmp_path, staging="mixed", kinds=KINDS)
    assert report.kills == dict.fromkeys(KINDS, 1), (report.kills, report.not_reached)
    assert (report.duplicates, report.lost, report.unexpected, report.orphans_left) == (0,) * 4
    assert report.rows_deltalake == report.rows_duckdb == report.rows_expected > 0
    assert report.exact


def test_a_delta_source_killed_right_after_offsets_0_leaves_the_table_exact(tmp_path):
    """The source is a Delta table read through the "deltalake" format: the first run dies
    right after Spark wrote ``offsets/0``; the source gets a commit and a compaction while the
    job is down, so the next run replays batch 0 from an initial offset that now names a
    later snapshot (``make campaign SOURCE=delta`` adds the killed cycles)."""
    report = run_campaign(seed=23, cycles=0, workdir=tmp_path, source="delta")
    assert report.kills == {"offsets_written": 1}
    assert report.source_compactions == 1
    assert (report.duplicates, report.lost, report.unexpected, report.orphans_left) == (0,) * 4
    assert report.rows_deltalake == report.rows_duckdb == report.rows_expected > 0
    assert report.exact


#: A blind append's commit file is in the log and the committer has not learned it yet; a
#: background checkpoint (every two versions in the campaign's table) has begun.
LOG_APPEND_KINDS = ("commit_written", "checkpoint_started")


def test_kills_after_a_log_append_and_in_a_background_checkpoint_leave_the_table_exact(tmp_path):
    """The restart after ``commit_written`` finds the batch's txn through its log view (the
    batch is not written twice); the one after ``checkpoint_started`` reads a log whose
    newest checkpoint may be missing or lack its ``_last_checkpoint``."""
    report = run_campaign(seed=26, cycles=2, workdir=tmp_path, kinds=LOG_APPEND_KINDS)
    assert report.kills == dict.fromkeys(LOG_APPEND_KINDS, 1), (report.kills, report.not_reached)
    assert (report.duplicates, report.lost, report.unexpected, report.orphans_left) == (0,) * 4
    assert report.rows_deltalake == report.rows_duckdb == report.rows_expected > 0
    assert report.exact


#: Where a merge-on-read upsert's vectors are written and not yet committed, while its
#: commit is written, and while the committed batch's staging is cleaned up.
UPSERT_KINDS = ("before_commit", "commit_write", "clean_up")


def test_an_upsert_stream_with_vectors_and_change_feed_killed_ends_exact(tmp_path):
    """Changes upserted by key into a table with deletion vectors and the change data feed on
    (each batch marks the rows it replaces in vectors and writes change files), killed at three
    steps (``make campaign SOURCE=changes`` runs every step): the table holds each key's
    latest change, and its feed reports every change exactly once."""
    report = run_campaign(seed=5, cycles=3, workdir=tmp_path, source="changes", kinds=UPSERT_KINDS)
    assert report.kills == dict.fromkeys(UPSERT_KINDS, 1), (report.kills, report.not_reached)
    assert (report.duplicates, report.lost, report.unexpected, report.orphans_left) == (0,) * 4
    assert (report.wrong_values, report.feed_wrong) == (0, 0) and report.feed_changes > 0
    assert report.rows_deltalake == report.rows_duckdb == report.rows_expected > 0
    assert report.exact


#: Where the restart re-reads the batch from Kafka: inside a Python task (nothing committed),
#: and between the commit and Spark's record of the batch (committed: the replay is skipped).
#: The steps in between are the same for every source (``test_kills_at_four_steps_...``).
KAFKA_KINDS = ("staging", "after_commit")


def test_a_kafka_stream_killed_before_and_after_a_commit_lands_every_record_once(tmp_path):
    """A topic of three partitions on a real local broker, read by Spark's Kafka source
    (``make campaign SOURCE=kafka`` runs every step): each record produced is in the table
    exactly once by (partition, offset), and every id once."""
    report = run_campaign(
        seed=11, cycles=2, workdir=tmp_path, staging="mixed", kinds=KAFKA_KINDS, source="kafka"
    )
    assert report.kills == dict.fromkeys(KAFKA_KINDS, 1), (report.kills, report.not_reached)
    assert (report.duplicates, report.lost, report.unexpected, report.orphans_left) == (0,) * 4
    assert report.rows_deltalake == report.rows_duckdb == report.rows_expected > 0
    assert report.exact


#: An upsert's batch re-read from Kafka before its commit, and after it (its clean-up).
KAFKA_UPSERT_KINDS = ("before_commit", "clean_up")


def test_a_debezium_change_topic_upserted_with_kills_ends_exact(tmp_path):
    """Debezium-style change events (before/after/op) in a Kafka topic, upserted by key into a
    table with deletion vectors and the change data feed on, killed before and after a commit
    (``make campaign SOURCE=kafka-changes`` runs every step): each key's latest change in the
    table, every change once in its feed."""
    report = run_campaign(
        seed=5, cycles=2, workdir=tmp_path, source="kafka-changes", kinds=KAFKA_UPSERT_KINDS
    )
    assert report.kills == dict.fromkeys(KAFKA_UPSERT_KINDS, 1), (
        report.kills,
        report.not_reached,
    )
    assert (report.duplicates, report.lost, report.unexpected, report.orphans_left) == (0,) * 4
    assert (report.wrong_values, report.feed_wrong) == (0, 0) and report.feed_changes > 0
    assert report.rows_deltalake == report.rows_duckdb == report.rows_expected > 0
    assert report.exact
