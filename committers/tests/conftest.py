"""Fixtures shared by the Delta sink's Spark tests."""

from __future__ import annotations

import pytest

from committers.delta import DeltaSink
from committers.tests._streaming_driver import STAGING_VARIABLE


@pytest.fixture(params=["spark", "arrow"])
def each_staging(request, monkeypatch):
    """Run the test once per staging strategy: every DeltaSink built in this process without
    an explicit ``staging`` uses ``request.param``, and so does the streaming driver run as a
    subprocess."""
    monkeypatch.setitem(DeltaSink.__init__.__kwdefaults__, "staging", request.param)
    monkeypatch.setenv(STAGING_VARIABLE, request.param)
    return request.param
