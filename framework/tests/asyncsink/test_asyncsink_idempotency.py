"""Idempotency keys (framework/asyncsink/_idempotency.py): what a key depends on, what it does
not, and the clear errors of rows that cannot be keyed. The end-to-end proof, with Spark's
task retries, replayed batches and an endpoint that deduplicates, is in
committers/tests/http_sink/test_http_sink_spark.py."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from framework.asyncsink import AsyncSinkWriter, IdempotencyKeys
from framework.errors import ConfigurationError, InputError
from framework.sink import Epoch, WriterContext

CONTEXT = WriterContext(
    epoch=Epoch(app_id="app", epoch_id=3, writer_identity="w", run_id="r"),
    partition_id=2,
    attempt_number=0,
    task_attempt_id=10,
)


def _context(**changes: Any) -> WriterContext:
    epoch = dataclasses.replace(CONTEXT.epoch, **changes.pop("epoch", {}))
    return dataclasses.replace(CONTEXT, epoch=epoch, **changes)


def test_a_derived_key_is_its_records_place_in_the_epoch_and_nothing_else():
    keys = IdempotencyKeys()
    row = {"id": 1}
    key = keys.key(CONTEXT, 5, row)
    # Another attempt of the task, another run of the epoch, other values: the same key.
    again = _context(attempt_number=3, task_attempt_id=99, epoch={"run_id": "r2"})
    assert keys.key(again, 5, {"id": 2}) == key
    others = {
        keys.key(CONTEXT, 6, row),
        keys.key(_context(partition_id=3), 5, row),
        keys.key(_context(epoch={"epoch_id": 4}), 5, row),
        keys.key(_context(epoch={"app_id": "other"}), 5, row),
    }
    assert len(others | {key}) == 5
    assert len(key) == 36  # a UUID: fits any Idempotency-Key header


def test_keys_from_a_column_and_the_field_they_go_to():
    keys = IdempotencyKeys(field="k", from_column="order")
    assert keys.stamped(None, 0, {"order": 42, "v": 1}) == {"order": 42, "v": 1, "k": "42"}
    own = IdempotencyKeys(field="order", from_column="order")
    assert own.stamped(None, 0, {"order": 42}) == {"order": 42}  # kept as it is


def test_rows_that_cannot_be_keyed_are_refused_clearly():
    with pytest.raises(InputError, match="'order' is null in a row"):
        IdempotencyKeys(from_column="order").key(CONTEXT, 0, {"order": None})
    with pytest.raises(InputError, match="'order' is missing from a row"):
        IdempotencyKeys(from_column="order").key(CONTEXT, 0, {})
    with pytest.raises(InputError, match="need the task"):
        IdempotencyKeys().key(None, 0, {})
    with pytest.raises(InputError, match="already have a field 'idempotency_key'"):
        IdempotencyKeys().stamped(CONTEXT, 0, {"idempotency_key": "x"})
    for bad in ({"field": ""}, {"from_column": ""}, {"field": 3}):
        with pytest.raises(ConfigurationError):
            IdempotencyKeys(**bad)


class _JsonConverter:
    def apply(self, element: dict[str, Any], context: WriterContext | None) -> bytes:
        return json.dumps(element).encode()


class _Writer(AsyncSinkWriter[dict[str, Any], bytes]):
    async def submit_request_entries(self, entries: list[bytes]) -> list[bytes]:
        return []

    def size_in_bytes(self, entry: bytes) -> int:
        return len(entry)


def test_the_writer_numbers_its_records_across_calls():
    keys = IdempotencyKeys()
    writer = _Writer(element_converter=_JsonConverter(), context=CONTEXT, idempotency_keys=keys)
    first = writer.convert([{"id": 0}, {"id": 1}])
    second = writer.convert([{"id": 2}])
    stamped = [json.loads(entry)["idempotency_key"] for entry in [*first, *second]]
    assert stamped == [keys.key(CONTEXT, position, {}) for position in range(3)]
