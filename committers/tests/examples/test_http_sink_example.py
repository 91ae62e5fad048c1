"""examples/http_sink.py run on the test session's Spark: the outcome it prints and checks.

The example's figures (how many requests were throttled, how long it took) vary from run to
run; what it promises does not: every good row delivered, only the poison row dead-lettered,
every request answered exactly one way, and the printed figures are the server's own counts.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = [pytest.mark.spark]

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "http_sink.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("http_sink_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_the_http_sink_example_delivers_every_good_row_and_dead_letters_the_poison_row(
    spark, tmp_path
):
    example = load_example()
    outcome = example.run(spark, tmp_path)
    stats = outcome.stats

    assert example.problems(outcome) == []
    assert outcome.status == "delivered"
    assert set(outcome.received_ids) == set(range(example.ROWS)) - {example.POISON_ID}
    assert outcome.dead_lettered_ids == [example.POISON_ID]
    assert stats.accepted_records == len(outcome.received_ids)
    # Each request is answered one way; a partial failure is an accepted request.
    assert stats.requests == (
        stats.accepted_requests
        + stats.rejected_requests
        + stats.failed_requests
        + stats.poison_requests
    )
    assert stats.partially_failed_requests <= stats.accepted_requests
    # 19,999 rows in requests of at most 200 rows: at least 100 accepted requests.
    assert stats.accepted_requests >= 100
    assert stats.poison_requests >= 1

    lines = example.explain(outcome)
    text = "\n".join(lines)
    prose = " ".join(text.split())  # wrapping may break a sentence anywhere between words
    assert all(len(line) <= example.WIDTH for line in lines)
    assert f"the server counted {stats.requests} requests, each answered one way:" in lines
    for count, label in [
        (stats.accepted_requests, "accepted (200)"),
        (stats.partially_failed_requests, " of them partial"),
        (stats.rejected_requests, "throttled (429)"),
        (stats.failed_requests, "failed (500)"),
        (stats.poison_requests, "refused (400)"),
    ]:
        assert f"{count:7} {label}" in text
    duplicates = len(outcome.received_ids) - len(set(outcome.received_ids))
    assert f"delivered {example.ROWS - 1:,} distinct rows, {duplicates} duplicates" in prose
    assert f"dead-lettered: [{example.POISON_ID}]" in prose
