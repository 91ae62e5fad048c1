"""``replace_where``: the partitions an overwrite replaces, as a Spark SQL predicate.

One text has two uses that must agree exactly:

* the engine checks every written row against it (Spark SQL, as a row check of the input plan);
* the committer picks the files to remove by evaluating it on each file's partition values.

So only what both sides evaluate identically is accepted: comparisons of a partition column
with literals (``=``, ``!=``/``<>``, ``<``, ``<=``, ``>``, ``>=``, ``IN``, ``NOT IN``,
``IS [NOT] NULL``), combined with ``AND``, ``OR`` and parentheses, on partition columns of
string, integer, date, boolean or decimal type. Comparisons follow SQL's three-valued logic: a
NULL partition value matches only ``IS NULL``. A literal is converted to its column's type the
way Spark casts it (``day = '2026-11-21'`` on a date column compares dates); a numeric literal
for a string column is refused, because Spark would compare numbers there.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import pyarrow as pa

from committers.delta._rules import WritePlan
from committers.delta._skipping import Op, Predicate, evaluate
from framework.errors import ConfigurationError, SchemaMismatchError
from framework.sink import RowCheck

__all__ = ["ReplaceWhere", "with_replace_where"]

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>'(?:[^'\\]|\\.|'')*')
      | (?P<number>-?\d+(?:\.\d+)?)
      | (?P<quoted>`(?:[^`]|``)+`)
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<op><=|>=|<>|!=|==|=|<|>)
      | (?P<punct>[(),])
    )""",
    re.VERBOSE,
)
_KEYWORDS = frozenset({"AND", "OR", "IN", "NOT", "IS", "NULL", "TRUE", "FALSE", "DATE"})
#: The parsed operators, as the evaluator's (``negated`` for the inequalities).
_OPS: dict[str, tuple[Op, bool]] = {
    "=": ("eq", False),
    "==": ("eq", False),
    "!=": ("eq", True),
    "<>": ("eq", True),
    "<": ("lt", False),
    "<=": ("le", False),
    ">": ("gt", False),
    ">=": ("ge", False),
    "in": ("in", False),
    "not in": ("in", True),
    "is null": ("is_null", False),
    "is not null": ("is_not_null", False),
}


@dataclass(frozen=True)
class _Literal:
    kind: str  # "string", "number", "bool", "date"
    text: str


@dataclass(frozen=True)
class _Comparison:
    column: str
    op: str  # a key of _OPS
    literals: tuple[_Literal, ...] = ()


_Conjunction = tuple[_Comparison, ...]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str]] = []
        position = 0
        while position < len(text):
            if text[position:].strip() == "":
                break
            match = _TOKEN.match(text, position)
            if match is None:
                self.fail(f"unexpected text at {text[position:].strip()[:20]!r}")
            kind = match.lastgroup
            assert kind is not None
            value = match.group(kind)
            if kind == "word" and value.upper() in _KEYWORDS:
                kind, value = "keyword", value.upper()
            self.tokens.append((kind, value))
            position = match.end()
        self.index = 0

    def fail(self, problem: str) -> NoReturn:
        raise ConfigurationError(
            f"replace_where {self.text!r} does not parse: {problem}. It must compare partition "
            "columns with literals (=, !=, <, <=, >, >=, IN, NOT IN, IS [NOT] NULL), joined by "
            "AND / OR, e.g. \"day = '2026-11-21'\"."
        )

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (value is not None and token[1] != value):
            self.fail(f"expected {value or kind} at token {self.index + 1}")
        self.index += 1
        assert token is not None
        return token[1]

    def accept(self, kind: str, value: str) -> bool:
        if self.peek() == (kind, value):
            self.index += 1
            return True
        return False

    def parse(self) -> tuple[_Conjunction, ...]:
        if not self.tokens:
            self.fail("it is empty")
        result = self.disjunction()
        if self.peek() is not None:
            self.fail(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return result

    def disjunction(self) -> tuple[_Conjunction, ...]:
        terms = list(self.conjunction())
        while self.accept("keyword", "OR"):
            terms.extend(self.conjunction())
        return tuple(terms)

    def conjunction(self) -> tuple[_Conjunction, ...]:
        result = self.factor()
        while self.accept("keyword", "AND"):
            right = self.factor()
            result = tuple(left + r for left in result for r in right)  # distribute into DNF
        return result

    def factor(self) -> tuple[_Conjunction, ...]:
        if self.accept("punct", "("):
            inner = self.disjunction()
            self.take("punct", ")")
            return inner
        return ((self.comparison(),),)

    def comparison(self) -> _Comparison:
        token = self.peek()
        if token is None or token[0] not in ("word", "quoted"):
            self.fail("expected a column name")
        assert token is not None
        self.index += 1
        column = token[1][1:-1].replace("``", "`") if token[0] == "quoted" else token[1]
        if self.accept("keyword", "IS"):
            negated = self.accept("keyword", "NOT")
            self.take("keyword", "NULL")
            return _Comparison(column, "is not null" if negated else "is null")
        negated = self.accept("keyword", "NOT")
        if negated or self.accept("keyword", "IN"):
            if negated:
                self.take("keyword", "IN")
            self.take("punct", "(")
            literals = [self.literal()]
            while self.accept("punct", ","):
                literals.append(self.literal())
            self.take("punct", ")")
            return _Comparison(column, "not in" if negated else "in", tuple(literals))
        op = self.take("op")
        return _Comparison(column, op, (self.literal(),))

    def literal(self) -> _Literal:
        token = self.peek()
        if token is None:
            self.fail("expected a literal")
        assert token is not None
        self.index += 1
        kind, value = token
        if kind == "string":
            body = value[1:-1]
            return _Literal("string", re.sub(r"\\(.)|''", lambda m: m.group(1) or "'", body))
        if kind == "number":
            return _Literal("number", value)
        if kind == "keyword" and value in ("TRUE", "FALSE"):
            return _Literal("bool", value)
        if kind == "keyword" and value == "DATE":
            text = self.take("string")[1:-1]
            return _Literal("date", text)
        if kind == "keyword" and value == "NULL":
            self.fail("a comparison with NULL is never true; use IS NULL or IS NOT NULL")
        self.fail(f"expected a literal, got {value!r}")


def _typed(literal: _Literal, column: str, dtype: pa.DataType, text: str) -> Any:
    """``literal`` as a value of ``dtype``, as Spark would cast it for the comparison."""

    def refuse(why: str) -> ConfigurationError:
        return ConfigurationError(
            f"replace_where {text!r}: {why} (column {column!r} is {dtype}). Compare it with a "
            "literal of its own type."
        )

    try:
        if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
            if literal.kind != "string":
                raise refuse(f"{literal.text} is not a string literal")
            return literal.text
        if pa.types.is_integer(dtype) and literal.kind in ("number", "string"):
            return int(literal.text)
        if pa.types.is_decimal(dtype) and literal.kind in ("number", "string"):
            return decimal.Decimal(literal.text)
        if pa.types.is_date(dtype) and literal.kind in ("date", "string"):
            return datetime.date.fromisoformat(literal.text)
        if pa.types.is_boolean(dtype) and literal.kind == "bool":
            return literal.text == "TRUE"
    except (ValueError, ArithmeticError) as err:
        raise refuse(f"{literal.text!r} is not a valid value: {err}") from err
    raise refuse(f"cannot compare with {literal.kind} literal {literal.text!r}")


_SUPPORTED = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_integer,
    pa.types.is_decimal,
    pa.types.is_date,
    pa.types.is_boolean,
)


@dataclass(frozen=True)
class ReplaceWhere:
    """A parsed ``replace_where`` (see the module docstring), bound to the partition columns'
    types by :meth:`bind` before it can evaluate.

    Attributes:
        text: the predicate as given; the engine checks every written row against it.
    """

    text: str
    _terms: tuple[_Conjunction, ...]
    _bound: tuple[tuple[Predicate, ...], ...] | None = None

    @classmethod
    def parse(cls, text: object) -> ReplaceWhere:
        """Raises: ConfigurationError: not a string, or outside the accepted grammar."""
        if not isinstance(text, str):
            raise ConfigurationError(f"replace_where must be a string, got {text!r}")
        return cls(text, _Parser(text).parse())

    def bind(self, partition_schema: pa.Schema, table_uri: str) -> ReplaceWhere:
        """This predicate with its literals typed for ``partition_schema`` (the table's
        partition columns, with their types).

        Raises:
            SchemaMismatchError: it names a column that is not a partition column.
            ConfigurationError: a column's type is not supported, or a literal does not fit it.
        """
        by_name = {name.lower(): name for name in partition_schema.names}
        bound: list[tuple[Predicate, ...]] = []
        for conjunction in self._terms:
            bound_conjunction: list[Predicate] = []
            for comparison in conjunction:
                name = by_name.get(comparison.column.lower())
                if name is None:
                    raise SchemaMismatchError(
                        f"replace_where {self.text!r} names {comparison.column!r}, which is not "
                        f"a partition column of {table_uri} (partition columns: "
                        f"{partition_schema.names or 'none'}). An overwrite replaces whole "
                        "partitions: use replace_where on partition columns only."
                    )
                dtype = partition_schema.field(name).type
                if not any(test(dtype) for test in _SUPPORTED):
                    raise ConfigurationError(
                        f"replace_where {self.text!r}: partition column {name!r} is {dtype}; "
                        "only string, integer, decimal, date and boolean partition columns "
                        "can be used."
                    )
                typed = tuple(_typed(lit, name, dtype, self.text) for lit in comparison.literals)
                op, negated = _OPS[comparison.op]
                value = typed if op == "in" else (typed[0] if typed else None)
                bound_conjunction.append(Predicate(name, op, value, negated))
            bound.append(tuple(bound_conjunction))
        return ReplaceWhere(self.text, self._terms, tuple(bound))

    def matches(self, partition_values: Mapping[str, Any]) -> bool:
        """Whether a file with these (typed) partition values is replaced: the predicate is
        TRUE for them, under SQL's three-valued logic."""
        if self._bound is None:
            raise RuntimeError("ReplaceWhere.bind() must run before matches()")
        return any(
            all(evaluate(c, partition_values.get(c.column)) is True for c in conjunction)
            for conjunction in self._bound
        )


def with_replace_where(
    plan: WritePlan, replace_where: ReplaceWhere, table_uri: str
) -> tuple[WritePlan, ReplaceWhere]:
    """``plan`` with a row check that every written row satisfies ``replace_where``, and
    ``replace_where`` bound to the plan's partition columns.

    Raises:
        SchemaMismatchError, ConfigurationError: see :meth:`ReplaceWhere.bind`; also for a
            table with column mapping (its files' partition values use physical names).
    """
    if plan.shape.column_mapping:
        raise ConfigurationError(
            f"replace_where is not supported on {table_uri}: it uses column mapping. "
            "Overwrite the whole table (mode='overwrite' alone) instead."
        )
    schema = plan.shape.arrow_schema()
    bound = replace_where.bind(
        pa.schema([schema.field(name) for name in plan.shape.partition_by]), table_uri
    )
    check = RowCheck(
        error="ConstraintViolationError",
        rule=f"replace_where ({bound.text})",
        predicate=f"({bound.text})",
        shown=tuple(plan.shape.partition_by),
        hint="An overwrite may only write rows its replace_where covers: filter the "
        "DataFrame with the same predicate, or widen replace_where.",
    )
    inputs = dataclasses.replace(plan.input_plan, checks=(*plan.input_plan.checks, check))
    return dataclasses.replace(plan, input_plan=inputs), bound
