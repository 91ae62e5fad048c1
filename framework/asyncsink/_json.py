"""JSON encoding of values that the standard encoder refuses (dates, decimals, bytes)."""

from __future__ import annotations

import base64
import datetime
import decimal
import uuid
from typing import Any

__all__ = ["json_default", "lenient_json_default"]


def json_default(value: Any) -> Any:
    """``default=`` hook for :func:`json.dumps` covering the types Arrow rows contain.

    Dates and times become ISO 8601 strings, decimals exact decimal strings, bytes base64 and
    UUIDs their canonical form.

    Raises:
        TypeError: for any other type (as :func:`json.dumps` expects).
    """
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, set | frozenset):
        return sorted(value, key=repr)
    raise TypeError(f"cannot encode a value of type {type(value).__name__} as JSON")


def lenient_json_default(value: Any) -> Any:
    """Like :func:`json_default`, but falls back to ``repr``: a dead letter must never be lost
    because its entry cannot be encoded."""
    try:
        return json_default(value)
    except TypeError:
        return repr(value)
