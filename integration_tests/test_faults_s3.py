"""A streaming job through a proxy injecting 503 SlowDown, 500 and dropped connections (before
and after the request reaches the server) on 10% of PUTs and GETs: it still ends with exactly
the source rows, once each, and nothing staged is left behind.

Which fault the n-th PUT or GET gets is fixed by the seed, whatever order Spark's tasks send
their requests in, and the proxy injects the kinds in turn: so once the job has made
:data:`EVERY_KIND_WITHIN` such requests (it makes over a hundred), it has met every kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from committers.delta import DeltaSink
from committers.delta.commit._staging_cleanup import wait_all_idle
from committers.tests._spark_helpers import file_stream, make_source, run_available_now
from framework import TwoPhaseSink
from integration_tests._fault_proxy import FAULT_KINDS, FaultProxy, _ProxyCore
from integration_tests._s3helpers import S3Table, assert_no_duplicates

pytestmark = [pytest.mark.integration, pytest.mark.spark]

FAULT_RATE = 0.10
SEED = 42  # faults on the 2nd, 8th, 10th and 13th PUT or GET, then ~10% of the rest
EVERY_KIND_WITHIN = 13  # PUTs and GETs after which every kind has been injected


def _faulty_proxy(upstream: str) -> FaultProxy:
    return FaultProxy(
        upstream,
        fault_rate=FAULT_RATE,
        seed=SEED,
        methods=("PUT", "GET"),
        kinds=FAULT_KINDS,
        cycle_kinds=True,
    )


def test_the_fault_sequence_holds_every_kind_early() -> None:
    """What the job test relies on, checked without a server: the first
    ``EVERY_KIND_WITHIN`` PUTs and GETs, whatever their mix, get every kind of fault."""
    for methods in (["PUT"], ["GET"], ["PUT", "GET"]):
        core = _ProxyCore(_faulty_proxy("http://127.0.0.1:1").config)
        drawn = [core.draw(methods[i % len(methods)], "/b/k") for i in range(EVERY_KIND_WITHIN)]
        assert {kind for kind in drawn if kind} == set(FAULT_KINDS)
        assert core.draw("HEAD", "/b/k") is None  # other methods are never faulted


@pytest.mark.usefixtures("each_staging")  # Spark's writer through s3a, and the Python writers
def test_streaming_job_survives_ten_percent_faults(spark, table: S3Table, tmp_path: Path) -> None:
    src = make_source(tmp_path, files=4, per_file=50)
    expected = list(range(200))

    with _faulty_proxy(table.server.endpoint) as proxy:
        options = {**table.options, "AWS_ENDPOINT_URL": proxy.endpoint}
        sink = TwoPhaseSink(
            DeltaSink(table.uri, app_id="faulty", partition_by=["day"], storage_options=options)
        )
        run_available_now(sink, file_stream(spark, src), tmp_path / "chk")
        assert wait_all_idle(120.0)  # the last batch's staging clean-up goes through the proxy
        faults = dict(proxy.faults)
        requests = dict(proxy.requests)

    print(f"fault proxy: {sum(faults.values())} faults {faults} in {requests} requests")
    eligible = requests.get("PUT", 0) + requests.get("GET", 0)
    assert eligible >= EVERY_KIND_WITHIN, f"only {eligible} PUT/GET requests: {requests}"
    assert set(faults) == set(FAULT_KINDS), "every kind of fault should have been injected"
    assert {b.status for b in sink.batches} == {"committed"}
    values = table.ids()
    assert_no_duplicates(values)
    assert values == sorted(expected)
    assert table.delta().transaction_version("faulty") == 3
    table.assert_no_orphans()


def test_commit_whose_response_is_lost_is_reconciled_not_repeated(spark, table: S3Table) -> None:
    """The PUT of the Delta log entry lands but the connection drops before the answer: delta-rs
    retries, gets 412 and reports a conflict; the committer reads the txn and finds its commit."""
    df = spark.range(0, 500, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as day")
    with FaultProxy(
        table.server.endpoint,
        fault_rate=1.0,
        methods=("PUT",),
        kinds=("drop_after",),
        path_pattern=r"/_delta_log/0{20}\.json",  # the first commit creates the table with data
        max_faults=1,
    ) as proxy:
        options = {**table.options, "AWS_ENDPOINT_URL": proxy.endpoint}
        sink = TwoPhaseSink(
            DeltaSink(table.uri, app_id="lost", partition_by=["day"], storage_options=options)
        )
        metrics = sink.write(df)
        assert proxy.faults == {"drop_after": 1}

    assert (metrics.status, metrics.rows) == ("committed", 500)
    assert table.delta().version() == 0  # exactly one commit: the table with its data
    assert table.delta().transaction_version("lost:write") == 0
    assert table.ids() == list(range(500))
    table.assert_no_orphans()


def test_a_write_without_app_id_whose_commit_response_is_lost_is_found_by_its_run_id(
    spark, table: S3Table
) -> None:
    """An append without app id records no txn; its log entry's PUT lands but the answer is
    lost. delta-rs's retried PUT gets 412: told not to rebase, it reports a conflict instead of
    committing the same files again on the next version, and the committer finds the commit by
    its run id."""
    df = spark.range(0, 500, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as day")
    sink = TwoPhaseSink(DeltaSink(table.uri, partition_by=["day"], storage_options=table.options))
    sink.write(df.where("id < 100"))  # creates the table
    with FaultProxy(
        table.server.endpoint,
        fault_rate=1.0,
        methods=("PUT",),
        kinds=("drop_after",),
        path_pattern=r"/_delta_log/0{19}1\.json",  # the append
        max_faults=1,
    ) as proxy:
        options = {**table.options, "AWS_ENDPOINT_URL": proxy.endpoint}
        one_off = TwoPhaseSink(DeltaSink(table.uri, storage_options=options))
        metrics = one_off.write(df.where("id >= 100"))
        assert proxy.faults == {"drop_after": 1}

    assert (metrics.status, metrics.rows, metrics.version) == ("committed", 400, 1)
    assert table.delta().version() == 1  # exactly one commit of the append
    assert table.ids() == list(range(500))
    assert not [text for text in table.log_texts() if '"txn"' in text]
    table.assert_no_orphans()
