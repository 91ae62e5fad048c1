"""What a sink asks the engine to do to every row before its writers see it.

A destination may define rules its writers must enforce (Delta: CHECK constraints, NOT NULL,
generated columns, column mapping). Evaluating them where the rows already are (in the engine's
tasks, at the engine's speed) beats shipping every row to Python first, so a sink describes them
as an :class:`InputPlan` of SQL expressions and the engine runtime applies it:

1. ``columns``: the rows as the destination defines them, computed from the input (e.g. a
   generated column filled in);
2. ``checks``: rules every such row must satisfy; the first violating row fails its task with the
   named error, quoting the row's values, so nothing of the epoch is committed;
3. ``output``: what the writers receive, computed from the ``columns`` (e.g. physical names,
   partition values spelled for the destination).

Expressions are Spark SQL (the dialect Delta's own rules are written in); identifiers are
quoted with backticks. The plan is plain data: it pickles, and no engine is imported here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["InputPlan", "PlannedColumn", "RowCheck", "sql_string"]


@dataclass(frozen=True, kw_only=True)
class PlannedColumn:
    """One column computed by a SQL expression over the previous stage's columns.

    Attributes:
        name: the column's name after this stage.
        expression: Spark SQL producing it.
        metadata: engine column metadata to attach (e.g. ``{"parquet.field.id": 3}``).
        origin: where the expression comes from, for an error when the engine cannot
            evaluate it (e.g. ``"the default of column 'v'"``); ``None``: the input itself.
    """

    name: str
    expression: str
    metadata: Mapping[str, object] = field(default_factory=dict)
    origin: str | None = None


@dataclass(frozen=True, kw_only=True)
class RowCheck:
    """A rule every row must satisfy.

    Attributes:
        error: name of the :mod:`framework.errors` class raised for a violating row.
        rule: what the rule is, for the error message (``CHECK constraint positive (x > 0)``).
        predicate: Spark SQL over the ``columns`` stage; a row violates the rule unless the
            predicate is TRUE (NULL violates too: say so in the predicate if it should not).
        shown: columns (of the ``columns`` stage) whose values the error message quotes.
        hint: how to fix it, appended to the message.
    """

    error: str
    rule: str
    predicate: str
    shown: tuple[str, ...] = ()
    hint: str = ""


@dataclass(frozen=True, kw_only=True)
class InputPlan:
    """See the module docstring. ``output`` must hold at least one column."""

    columns: tuple[PlannedColumn, ...]
    checks: tuple[RowCheck, ...]
    output: tuple[PlannedColumn, ...]

    def __post_init__(self) -> None:
        if not self.output:
            raise ValueError("an InputPlan needs at least one output column")


def sql_string(text: str) -> str:
    """A Spark SQL string literal holding exactly ``text``."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
