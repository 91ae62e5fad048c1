"""Fixtures of the integration suite: one real S3 server per run, one bucket per test module.

Which server is used (see ``_s3server.py``): an external endpoint from ``SINK_TEST_S3_ENDPOINT``
(+ ``SINK_TEST_S3_ACCESS_KEY`` / ``SINK_TEST_S3_SECRET_KEY`` / ``SINK_TEST_S3_REGION``), else
MinIO through testcontainers when a Docker engine answers, else a local SeaweedFS. The choice is
printed when the server starts and again in the summary.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration_tests._s3helpers import S3Table
from integration_tests._s3server import S3Server, s3_server

_USED: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything in this directory is an integration test."""
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in _USED:
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def s3(pytestconfig: pytest.Config) -> Iterator[S3Server]:
    """The session's S3 server."""
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")

    def announce(line: str) -> None:
        _USED.append(line)
        if reporter is None:
            return
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            reporter.write_line("")
            reporter.write_line(line)

    with s3_server(log=announce) as server:
        yield server


@pytest.fixture(scope="module")
def bucket(s3: S3Server) -> Iterator[str]:
    """A bucket of its own for each test module, deleted with its contents afterwards."""
    name = s3.create_bucket()
    yield name
    s3.delete_bucket(name)


@pytest.fixture
def table(s3: S3Server, bucket: str) -> S3Table:
    """A fresh table location (not created yet) in the module's bucket."""
    return S3Table(s3, f"s3://{bucket}/t-{uuid.uuid4().hex[:10]}", s3.storage_options())
