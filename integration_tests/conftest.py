"""Fixtures of the integration suite: a fresh table location per test, in a bucket of the test
module on the session's S3 server (the ``s3`` and ``bucket`` fixtures of the root conftest.py).

Which server is used (see ``_s3server.py``): an external endpoint from ``SINK_TEST_S3_ENDPOINT``
(+ ``SINK_TEST_S3_ACCESS_KEY`` / ``SINK_TEST_S3_SECRET_KEY`` / ``SINK_TEST_S3_REGION``), else
MinIO through testcontainers when a Docker engine answers, else a local SeaweedFS. The choice is
printed when the server starts and again in the summary.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from integration_tests._s3helpers import S3Table
from integration_tests._s3server import S3Server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything in this directory is an integration test."""
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def table(s3: S3Server, bucket: str) -> S3Table:
    """A fresh table location (not created yet) in the module's bucket."""
    return S3Table(s3, f"s3://{bucket}/t-{uuid.uuid4().hex[:10]}", s3.storage_options())
