"""A concurrent writer placed exactly between a blind append's probe and its write."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from committers.delta.commit._log_store import LogStore


def race_before_write(monkeypatch: pytest.MonkeyPatch, other_writer: Callable[[], object]) -> None:
    """Run ``other_writer`` once, right before the next put-if-absent of a commit file."""
    original = LogStore.put_if_absent
    pending = [other_writer]

    def put(self: LogStore, name: str, data: bytes) -> bool:
        while pending:
            pending.pop()()
        return original(self, name, data)

    monkeypatch.setattr(LogStore, "put_if_absent", put)
