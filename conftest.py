"""Shared pytest fixtures: one local SparkSession and one S3 server for the whole test session."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import pytest

from committers.delta import DeltaSink
from committers.tests._jars import DELTA_SPARK_CONFIGS, fetched_jars, local_jar_configs
from committers.tests._spark_helpers import DRIVER_JVM_OPTIONS
from committers.tests._streaming_driver import STAGING_VARIABLE
from integration_tests._containers import remove_orphaned_containers, servers_report
from integration_tests._s3server import S3Server, s3_server

_S3_SERVERS_USED: list[str] = []


_JARS, _JARS_MISSING = fetched_jars()


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession that allows 2 attempts per task, so task retries really happen.

    delta-spark (and hadoop-aws) run in it when `make jars` has fetched their jars: its SQL
    extensions and catalog are on for the whole session, beside the sink. Without the jars the
    session starts without them, and the tests that need delta-spark (fixture ``delta_spark``)
    fail saying how to fetch them."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2,2]")
        .appName("sink-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
        .config("spark.driver.extraJavaOptions", DRIVER_JVM_OPTIONS)
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        # A Spark Connect server in the same driver, for the `connect` fixture (idle otherwise).
        .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
        .config("spark.connect.grpc.binding.address", "127.0.0.1")
        .config("spark.connect.grpc.binding.port", "0")
        # Its client session may sit idle for most of the suite (default: closed after 60 min).
        .config("spark.connect.session.manager.defaultSessionTimeout", "24h")
    )
    if _JARS:
        for key, value in {**local_jar_configs(_JARS), **DELTA_SPARK_CONFIGS}.items():
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def delta_spark(request: pytest.FixtureRequest):
    """The session's ``spark``, for tests that run delta-spark in it: they fail (never skip)
    when its jars were not fetched."""
    if _JARS_MISSING:
        pytest.fail(f"delta-spark is not available: {_JARS_MISSING}", pytrace=False)
    return request.getfixturevalue("spark")


@pytest.fixture(scope="session")
def connect(spark):
    """A Spark Connect client session of the Connect server running in the `spark` fixture's
    driver. Its streaming queries run their foreachBatch functions in a Python process of that
    server, as on a real Connect cluster.

    Not ``SparkSession.builder.remote(...)``: that sets process-wide environment variables that
    would switch the classic session's API to Connect too.
    """
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    service = getattr(spark._jvm.org.apache.spark.sql.connect.service, "SparkConnectService$")
    port = getattr(service, "MODULE$").localPort()
    session = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").create()
    yield session
    session.stop()


@pytest.fixture(params=["spark", "arrow"])
def each_staging(request, monkeypatch):
    """Run the test once per staging strategy: every DeltaSink built in this process without
    an explicit ``staging`` uses ``request.param``, and so does the streaming driver run as a
    subprocess."""
    monkeypatch.setitem(DeltaSink.__init__.__kwdefaults__, "staging", request.param)
    monkeypatch.setenv(STAGING_VARIABLE, request.param)
    return request.param


@pytest.fixture(scope="session")
def s3(pytestconfig: pytest.Config) -> Iterator[S3Server]:
    """The session's one real S3 server, started on first use (see
    ``integration_tests/_s3server.py`` for which: an external endpoint, MinIO, or SeaweedFS).
    The choice is printed when it starts and again in the summary."""
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def announce(line: str) -> None:
        _S3_SERVERS_USED.append(line)
        if reporter is None:
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line("")
            reporter.write_line(line)

    with s3_server(log=announce, in_container=True) as server:
        yield server


@pytest.fixture(scope="module")
def bucket(s3: S3Server) -> Iterator[str]:
    """A bucket of its own for each test module, deleted with its contents afterwards."""
    name = s3.create_bucket()
    yield name
    s3.delete_bucket(name)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that needs the S3 server (directly or through another fixture) is an
    integration test, marked or not: ``-m "not integration"`` never starts a server."""
    for item in items:
        if "s3" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)


def pytest_report_header(config: pytest.Config) -> str:
    """Which servers run in containers and which as local processes (``make images``); the
    containers an earlier, killed run left are removed first."""
    removed = remove_orphaned_containers()
    left = f" ({removed} containers of a killed earlier run removed)" if removed else ""
    return servers_report() + left


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _S3_SERVERS_USED:
        terminalreporter.write_line(line)
