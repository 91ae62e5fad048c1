"""A few cycles of the crash-point campaign (``make campaign`` runs many): the driver's whole
process tree is SIGKILLed at each named step of the protocol and at a random moment, and
restarted from its checkpoint; the table must then hold every source row exactly once, read
by deltalake and DuckDB, with nothing staged left behind."""

from __future__ import annotations

import pytest

from committers.tests._campaign import KINDS, run_campaign

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_every_step_killed_once_leaves_the_table_exact(tmp_path):
    """Runs alternate between Spark's Parquet writer and the Python writers."""
    report = run_campaign(seed=2026, cycles=len(KINDS), workdir=tmp_path, staging="mixed")
    assert report.kills == dict.fromkeys(KINDS, 1), (report.kills, report.not_reached)
    assert (report.duplicates, report.lost, report.unexpected, report.orphans_left) == (0,) * 4
    assert report.rows_deltalake == report.rows_duckdb == report.rows_expected > 0
    assert report.exact
