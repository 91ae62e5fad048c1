"""Apply a sink's :class:`~framework.sink.InputPlan` to a DataFrame, inside Spark's own tasks.

The checks are folded into the first output column as one ``CASE WHEN NOT (rule) THEN
raise_error(...)``: the column is always written, so the optimizer cannot prune the checks, and
the first violating row fails its task with a message the driver turns back into the sink's
error class (see ``_errors.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from framework.errors import SchemaMismatchError
from framework.sink import InputPlan, RowCheck, sql_string
from framework.spark._native import is_connect_dataframe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["apply_input_plan"]

_SHOWN_VALUE_CHARS = 200  # a huge value is cut in the message, not the data


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _violation_message(check: RowCheck) -> str:
    """SQL building ``<Error>: <rule> violated by a row with a=1, b=NULL. <hint>``."""
    parts = [sql_string(f"{check.error}: {check.rule} is violated by a row")]
    for index, name in enumerate(check.shown):
        value = f"cast({_quote(name)} as string)"
        shown = f"coalesce(substring({value}, 1, {_SHOWN_VALUE_CHARS}), 'NULL')"
        parts.append(sql_string((" with " if index == 0 else ", ") + f"{name} = "))
        parts.append(shown)
    parts.append(sql_string(". " + check.hint if check.hint else "."))
    return f"concat({', '.join(parts)})"


def guarded(expression: str, checks: tuple[RowCheck, ...]) -> str:
    """``expression``, failing the task on the first row that violates one of ``checks``."""
    if not checks:
        return expression
    whens = " ".join(
        f"WHEN NOT coalesce(({c.predicate}), false) THEN raise_error({_violation_message(c)})"
        for c in checks
    )
    return f"CASE {whens} ELSE ({expression}) END"


def apply_input_plan(df: DataFrame, plan: InputPlan) -> DataFrame:
    """The DataFrame the sink's writers receive: ``plan.output`` computed from ``df``."""
    if is_connect_dataframe(df):
        # pyspark.sql.functions builds Connect columns only in a Connect-mode process; a
        # process holding a classic and a Connect session needs the Connect module itself.
        from pyspark.sql.connect import functions as F
    else:
        from pyspark.sql import functions as F  # type: ignore[no-redef]

    try:
        defined = df.select(*[F.expr(c.expression).alias(c.name) for c in plan.columns])
    except Exception as err:
        _raise_unevaluable(df, plan, F, err)
        raise
    output = []
    for index, column in enumerate(plan.output):
        expression = guarded(column.expression, plan.checks) if index == 0 else column.expression
        metadata = dict(column.metadata) or None
        output.append(F.expr(expression).alias(column.name, metadata=metadata))
    return defined.select(*output)


def _raise_unevaluable(df: DataFrame, plan: InputPlan, functions: Any, err: Exception) -> None:
    """When Spark cannot analyse the plan's columns (``err``), name the table rules among them
    it cannot evaluate (columns with an ``origin``); return if none is at fault.

    Raises:
        SchemaMismatchError: naming each such rule, its expression and Spark's reason.
    """
    failing = []
    for column in plan.columns:
        if column.origin is None:
            continue
        try:
            df.select(functions.expr(column.expression))
        except Exception as own:
            reason = str(own).strip().splitlines()[0]
            failing.append(f"{column.origin} ({column.expression}): {reason}")
    if failing:
        raise SchemaMismatchError(
            "this Spark cannot evaluate the table's "
            + "; ".join(failing)
            + ". Fix the table's definition (with the engine that made it), or give these "
            "columns in the input. Nothing was written."
        ) from err
