"""The options of ``mode="upsert"`` as a value (keys, ``sequence_by``, ``delete_when``,
``partial_updates``), validated, and the error an upsert fails with when another writer keeps
rewriting the files it must rewrite. See :mod:`committers.delta.spark._upsert` for how an
upsert runs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from framework.errors import CommitConflictError, ConfigurationError

__all__ = ["UpsertConflictError", "UpsertSpec", "given_keywords"]


class UpsertConflictError(CommitConflictError):
    """Another writer removed a file this upsert rewrites (it rewrote, deleted from or
    overwrote it) while the batch was being computed, again after the batch was computed once
    more on the newer snapshot. Nothing of the batch was committed and its staged files were
    deleted; restarting the query (or re-running the write) computes it on the table as it is
    then."""


@dataclass(frozen=True)
class UpsertSpec:
    """The options of ``mode="upsert"``, validated on construction:
    ``DeltaSink(uri, mode="upsert", upsert=UpsertSpec(keys=["id"], sequence_by="ts"))`` is
    the same as ``DeltaSink(uri, mode="upsert", keys=["id"], sequence_by="ts")``.

    Attributes:
        keys: the columns that identify a row (a name, or a list of names); stored as a tuple.
        sequence_by: the column(s) that order the changes of one key (none: input order).
        delete_when: a Spark SQL predicate over the input marking the changes that delete.
        partial_updates: keep the stored values of the columns the input lacks.

    Raises:
        ConfigurationError: no keys, a column listed twice, ``sequence_by`` naming a key, an
            empty ``delete_when``, or an option of the wrong type.
    """

    keys: tuple[str, ...]
    sequence_by: tuple[str, ...] = ()
    delete_when: str | None = None
    partial_updates: bool = False

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigurationError(
                "mode='upsert' needs keys=[...]: the columns that identify a row, e.g. keys=['id']"
            )
        key_names = _names("keys", self.keys)
        # the default () is no sequence; a given empty list is refused by _names
        sequence = () if self.sequence_by == () else _names("sequence_by", self.sequence_by)
        overlap = {k.lower() for k in key_names} & {s.lower() for s in sequence}
        if overlap:
            raise ConfigurationError(
                f"sequence_by names key column(s) {sorted(overlap)}: the sequence orders the "
                "changes of one key, so it must be another column (e.g. a change timestamp)"
            )
        delete_when = self.delete_when
        if delete_when is not None and (not isinstance(delete_when, str) or not delete_when):
            raise ConfigurationError(
                f"delete_when must be a Spark SQL predicate (a non-empty string), e.g. "
                f"\"op = 'D'\", got {delete_when!r}"
            )
        if not isinstance(self.partial_updates, bool):
            raise ConfigurationError(
                f"partial_updates must be True or False, got {self.partial_updates!r}"
            )
        object.__setattr__(self, "keys", key_names)
        object.__setattr__(self, "sequence_by", sequence)

    @classmethod
    def of(
        cls,
        mode: str,
        keys: Sequence[str] | None,
        sequence_by: str | Sequence[str] | None,
        delete_when: str | None,
        partial_updates: bool = False,
    ) -> UpsertSpec | None:
        """The spec the keyword options give for ``mode`` (``None`` unless
        ``mode="upsert"``).

        Raises:
            ConfigurationError: an upsert option without ``mode="upsert"``, an upsert without
                keys, or an option of the wrong shape.
        """
        given = given_keywords(keys, sequence_by, delete_when, partial_updates)
        if mode != "upsert":
            if given:
                raise ConfigurationError(
                    f"{', '.join(given)} {'is an option' if len(given) == 1 else 'are options'} "
                    f"of mode='upsert' (got mode={mode!r}). Pass mode='upsert' to update and "
                    "delete rows by key."
                )
            return None
        return cls(
            keys=keys or (),  # type: ignore[arg-type]  # normalised to a tuple on construction
            sequence_by=() if sequence_by is None else sequence_by,  # type: ignore[arg-type]
            delete_when=delete_when,
            partial_updates=partial_updates,
        )


def given_keywords(
    keys: Sequence[str] | None,
    sequence_by: str | Sequence[str] | None,
    delete_when: str | None,
    partial_updates: bool,
) -> list[str]:
    """The upsert keywords of ``DeltaSink`` that were given (not left at their defaults)."""
    return [
        name
        for name, value in (
            ("keys", keys),
            ("sequence_by", sequence_by),
            ("delete_when", delete_when),
            ("partial_updates", partial_updates or None),
        )
        if value is not None
    ]


def _names(option: str, value: str | Sequence[str]) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ConfigurationError(
            f"{option} must be a column name or a non-empty list of column names, got {value!r}"
        )
    if len({n.lower() for n in names}) != len(names):
        raise ConfigurationError(f"{option} lists a column twice: {list(names)}")
    return names
