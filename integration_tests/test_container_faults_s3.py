"""The S3 server frozen (``docker pause``) or cut off from its network (``docker network
disconnect``) in the middle of a commit, for longer than the sink's request timeouts, then
brought back: every row is in the table exactly once, one commit carries the batch's ``txn``,
and nothing staged is left.

The server is SeaweedFS in a container of the locally built image on a network of its own,
reached through its S3 port published on 127.0.0.1 (``make images``; where no Docker engine
or image is to be had, these tests are skipped and say so). The fault starts at the sink's
``commit_write`` step, right before the log entry's conditional PUT, and lasts 8 s against
timeouts of 2 s: the PUT's outcome is unknown to the writer (it may land once the server
thaws), which is what the committer must resolve without committing twice.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from committers.delta import DeltaSink
from committers.delta.commit import _log_commits
from framework import TwoPhaseSink
from integration_tests._containers import freeze, image
from integration_tests._s3helpers import S3Table, assert_no_duplicates
from integration_tests._s3server import S3Server, seaweedfs_on_network

pytestmark = [
    pytest.mark.integration,
    pytest.mark.spark,
    pytest.mark.skipif(
        image("seaweedfs") is None,
        reason="no Docker engine or no seaweedfs image (`make images`): nothing to pause",
    ),
]

FAULT_SECONDS = 8.0
# Each request gives up after 2 s and is retried once: the fault outlasts them all.
SHORT_TIMEOUTS = {"timeout": "2s", "connect_timeout": "2s", "max_retries": "1"}


@pytest.fixture(scope="module")
def isolated_server() -> Iterator[tuple[S3Server, Any, Any]]:
    from testcontainers.core.network import Network

    with Network() as network, seaweedfs_on_network(network) as (server, container):
        yield server, container, network


def _freeze(container: Any, network: Any) -> Callable[[], None]:
    freeze(container.get_wrapped_container())
    return container.get_wrapped_container().unpause


def _cut_off(container: Any, network: Any) -> Callable[[], None]:
    network._unwrap_network.disconnect(container.get_container_id())
    return lambda: network.connect(container.get_container_id())


FAULTS = {"frozen": _freeze, "cut_off": _cut_off}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_commit_meeting_a_dead_s3_server_lands_each_row_once(
    spark, isolated_server: tuple[S3Server, Any, Any], fault: str, monkeypatch
) -> None:
    server, container, network = isolated_server
    bucket = server.create_bucket()
    table = S3Table(server, f"s3://{bucket}/t-{uuid.uuid4().hex[:8]}", server.storage_options())
    options = server.storage_options(**SHORT_TIMEOUTS)
    sink = TwoPhaseSink(DeltaSink(table.uri, app_id="dead-server", storage_options=options))
    first = spark.range(0, 300, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as k")
    second = spark.range(300, 600, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as k")
    sink.write(first, epoch_id=0)  # creates the table; epoch 1 appends through the log

    lifted = threading.Event()
    injected: list[float] = []
    real_crash_point = _log_commits.crash_point

    def fault_at_commit(step: str, epoch_id: int | None = None, **kwargs: Any) -> None:
        real_crash_point(step, epoch_id, **kwargs)
        if step == "commit_write" and not injected:
            restore = FAULTS[fault](container, network)
            injected.append(time.monotonic())

            def lift() -> None:
                restore()
                lifted.set()

            threading.Timer(FAULT_SECONDS, lift).start()

    monkeypatch.setattr(_log_commits, "crash_point", fault_at_commit)
    try:
        outcome = sink.write(second, epoch_id=1).status
    except Exception as error:  # the commit's outcome was unknown: the replay decides
        outcome = f"failed: {type(error).__name__}: {error}"
    assert injected, "the commit never reached its log write"
    assert lifted.wait(FAULT_SECONDS + 30), "the fault was not lifted"
    replay = sink.write(second, epoch_id=1).status  # the restarted job runs the epoch again
    print(f"{fault}: first attempt {outcome!r}, replay {replay!r}")

    ids = table.ids()
    assert_no_duplicates(ids)
    assert ids == list(range(600))
    txns = [
        action["txn"]["version"]
        for text in table.log_texts()
        for action in map(json.loads, text.splitlines())
        if "txn" in action
    ]
    assert sorted(txns) == [0, 1]  # each epoch committed once
    assert table.delta().transaction_version("dead-server:write") == 1  # bounded writes
    table.assert_no_orphans()
    server.delete_bucket(bucket)
