"""The options of ``mode="upsert"`` as a value (keys, ``sequence_by``, ``delete_when``,
``partial_updates``), validated, and the error an upsert fails with when another writer keeps
rewriting the files it must rewrite. See :mod:`committers.delta.spark._upsert` for how an
upsert runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from framework.errors import (
    CommitConflictError,
    ConfigurationError,
)

if TYPE_CHECKING:
    pass

__all__ = ["UpsertConflictError", "UpsertSpec"]


class UpsertConflictError(CommitConflictError):
    """Another writer removed a file this upsert rewrites (it rewrote, deleted from or
    overwrote it) while the batch was being computed, again after the batch was computed once
    more on the newer snapshot. Nothing of the batch was committed and its staged files were
    deleted; restarting the query (or re-running the write) computes it on the table as it is
    then."""


@dataclass(frozen=True)
class UpsertSpec:
    """The options of ``mode="upsert"``, validated (see :meth:`of`)."""

    keys: tuple[str, ...]
    sequence_by: tuple[str, ...] = ()
    delete_when: str | None = None
    partial_updates: bool = False

    @classmethod
    def of(
        cls,
        mode: str,
        keys: Sequence[str] | None,
        sequence_by: str | Sequence[str] | None,
        delete_when: str | None,
        partial_updates: bool = False,
    ) -> UpsertSpec | None:
        """The spec for ``mode`` (``None`` unless ``mode="upsert"``).

        Raises:
            ConfigurationError: an upsert option without ``mode="upsert"``, an upsert without
                keys, or an option of the wrong shape.
        """
        given = [
            name
            for name, value in (
                ("keys", keys),
                ("sequence_by", sequence_by),
                ("delete_when", delete_when),
                ("partial_updates", partial_updates or None),
            )
            if value is not None
        ]
        if mode != "upsert":
            if given:
                raise ConfigurationError(
                    f"{', '.join(given)} {'is an option' if len(given) == 1 else 'are options'} "
                    f"of mode='upsert' (got mode={mode!r}). Pass mode='upsert' to update and "
                    "delete rows by key."
                )
            return None
        if not keys:
            raise ConfigurationError(
                "mode='upsert' needs keys=[...]: the columns that identify a row, e.g. keys=['id']"
            )
        key_names = _names("keys", keys)
        sequence = () if sequence_by is None else _names("sequence_by", sequence_by)
        overlap = {k.lower() for k in key_names} & {s.lower() for s in sequence}
        if overlap:
            raise ConfigurationError(
                f"sequence_by names key column(s) {sorted(overlap)}: the sequence orders the "
                "changes of one key, so it must be another column (e.g. a change timestamp)"
            )
        if delete_when is not None and (not isinstance(delete_when, str) or not delete_when):
            raise ConfigurationError(
                f"delete_when must be a Spark SQL predicate (a non-empty string), e.g. "
                f"\"op = 'D'\", got {delete_when!r}"
            )
        if not isinstance(partial_updates, bool):
            raise ConfigurationError(
                f"partial_updates must be True or False, got {partial_updates!r}"
            )
        return cls(key_names, sequence, delete_when, partial_updates)


def _names(option: str, value: str | Sequence[str]) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigurationError(
            f"{option} must be a column name or a non-empty list of column names, got {value!r}"
        )
    if len({n.lower() for n in names}) != len(names):
        raise ConfigurationError(f"{option} lists a column twice: {list(names)}")
    return names
