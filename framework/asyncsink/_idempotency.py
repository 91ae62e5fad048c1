"""Idempotency keys: a key on every record an at-least-once async sink delivers, the same each
time the record is delivered again, so that a destination that deduplicates by key sees each
record once.

At-least-once delivery sends a record again after a request retry (a timeout whose request did
land, a partial failure), a task retry (Spark runs the task again from its first row) and a
batch replay (a restarted stream runs the micro-batch again; ``write(df, epoch_id=...)`` run
again). A key derived from the request would change; these keys are derived from where the
record sits in its epoch, which all three keep:

* ``derived`` (the default): a UUID (version 5) of the app id, the epoch id, the Spark
  partition and the record's position in that partition's input. Stable as long as a replayed
  epoch reads the same rows in the same partitions in the same order, which Spark does for a
  deterministic source (files, Kafka offsets, a table version) and plan. A one-off
  ``write(df)`` without ``epoch_id`` gets a made-up app id: its keys are stable across its
  retries, not across runs.
* ``from_column``: the value of a column of the row (a business key, a change's id), for input
  whose partitioning or order is not deterministic.

The key is stamped into each row as the field :attr:`IdempotencyKeys.field` before the row is
converted, so every destination's converter carries it (the HTTP sink can also send it as an
``Idempotency-Key`` header on one-record requests).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from framework.errors import ConfigurationError, InputError
from framework.sink import WriterContext

__all__ = ["DEFAULT_KEY_FIELD", "IdempotencyKeys"]

DEFAULT_KEY_FIELD = "idempotency_key"
#: Namespace of the derived keys (a fixed, random UUID: keys of other tools never collide).
_NAMESPACE = uuid.UUID("6f0c4e0a-35a4-4f53-a2d9-1b5b8c7e3d11")


@dataclass(frozen=True)
class IdempotencyKeys:
    """How the async writer keys each record (see the module docstring).

    Args:
        field: the row field the key is written to (and that the destination deduplicates by).
        from_column: take the key from this column of each row (its value as text) instead of
            deriving it from the record's place in its epoch.

    Raises:
        ConfigurationError: ``field`` or ``from_column`` is not a non-empty string.
    """

    field: str = DEFAULT_KEY_FIELD
    from_column: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.field, str) or not self.field:
            raise ConfigurationError(f"IdempotencyKeys.field must be a name, got {self.field!r}")
        if self.from_column is not None and (
            not isinstance(self.from_column, str) or not self.from_column
        ):
            raise ConfigurationError(
                f"IdempotencyKeys.from_column must be a column name or None, got "
                f"{self.from_column!r}"
            )

    def key(self, context: WriterContext | None, position: int, row: Mapping[str, Any]) -> str:
        """The key of ``row``, the ``position``-th record (from 0) of the task ``context``.

        Raises:
            InputError: ``from_column`` is missing from the row or null; or a derived key is
                asked for outside a task (``context`` is None).
        """
        if self.from_column is not None:
            value = row.get(self.from_column)
            if value is None:
                raise InputError(
                    f"the idempotency key column {self.from_column!r} is "
                    f"{'missing from' if self.from_column not in row else 'null in'} a row; every "
                    "row needs a key. Fill the column, or derive keys (from_column=None)."
                )
            return str(value)
        if context is None:
            raise InputError(
                "derived idempotency keys need the task the record is written in (run the sink "
                "through TwoPhaseSink), or take keys from a column (from_column=...)"
            )
        epoch = context.epoch
        name = f"{epoch.app_id}\x1f{epoch.epoch_id}\x1f{context.partition_id}\x1f{position}"
        return str(uuid.uuid5(_NAMESPACE, name))

    def stamped(
        self, context: WriterContext | None, position: int, row: Mapping[str, Any]
    ) -> dict[str, Any]:
        """``row`` with its key in :attr:`field`.

        Raises:
            InputError: see :meth:`key`; or the row already has a field of that name, which
                the key would overwrite (unless it is the ``from_column`` itself: the row is
                then returned as it is).
        """
        key = self.key(context, position, row)
        if self.field == self.from_column:  # the row holds its key already
            return dict(row)
        if self.field in row:
            raise InputError(
                f"rows already have a field {self.field!r}, where the idempotency key goes; "
                f"name another field (IdempotencyKeys(field=...)), or use it as the key "
                f"(IdempotencyKeys(field={self.field!r}, from_column={self.field!r}))"
            )
        return {**row, self.field: key}
