"""A few cycles of the crash-point campaign (``make campaign`` runs many): the driver's whole
process tree is SIGKILLed at each named step of the protocol and at a random moment, and
restarted from its checkpoint; the table must then hold every source row exactly once, read
by deltalake and DuckDB, with nothing staged left behind."""

from __future__ import annotations

import pytest

from committers.tests._campaign import KINDS, run_campaign

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_every_step_killed_once_leaves_the_table_exact(tmp_path):
    report = run_campaign(seed=2026, cycles=len(KINDS), workdir=tmp_path, staging="auto")
    assert report.kills == dict.fromkeys(KINDS, 1), (report.kills, report.not_reached)
    assert (report.duplicates, report.lost, report.unexpected, report.orphans_left) == (0,) * 4
    assert report.rows_deltalake == report.rows_duckdb == report.rows_expected > 0
    assert report.exact


def test_python_writers_killed_while_staging_and_around_the_commit(tmp_path):
    kinds = ("staging", "commit_write", "clean_up")
    report = run_campaign(seed=11, cycles=3, workdir=tmp_path, staging="arrow", kinds=kinds)
    assert report.kills == dict.fromkeys(kinds, 1), (report.kills, report.not_reached)
    assert report.exact, report
