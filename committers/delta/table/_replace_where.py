"""``replace_where``: the rows an overwrite replaces, as a predicate over the table's columns.

Delta's replaceWhere semantics: the overwrite deletes the table's rows for which the predicate
is TRUE and adds the new rows, which must all satisfy it, in one transaction. A row for which
the predicate is NULL (``is_even = true`` on a NULL ``is_even``) is not deleted, as in a SQL
``DELETE ... WHERE``; a new row for which it is NULL is refused, as delta-spark's constraint on
the written rows refuses it (its CHECK fails on NULL as on FALSE).

One predicate, three evaluators that must agree exactly:

* Spark checks every written row against :meth:`ReplaceWhere.sql` (and, with
  ``staging="spark"``, filters the rewritten files' rows with it);
* pyarrow evaluates it on the rows of the files the overwrite rewrites (:meth:`mask`), and on
  the rows the ``"deltalake"`` format writer receives;
* the committer decides per file from its partition values and statistics whether it holds no
  matching row, only matching rows, or maybe some (:class:`FileClassifier`).

So only what all three evaluate identically is accepted: comparisons of a column with literals
(``=``, ``!=``/``<>``, ``<``, ``<=``, ``>``, ``>=``, ``IN``, ``NOT IN``, ``IS [NOT] NULL``), a
boolean column on its own (``is_even``, meaning ``is_even = true``), combined with ``AND``,
``OR``, ``NOT`` and parentheses, on top-level columns (partition or data columns) of string,
integer, decimal, date or boolean type. Comparisons follow SQL's three-valued logic. A literal
is converted to its column's type the way Spark casts it (``day = '2026-11-21'`` on a date
column compares dates; a date literal must be ``YYYY-MM-DD``); a number for a string column is
refused, because Spark would compare numbers there. Spark is handed a canonical rendering of
the parsed predicate (typed literals, quoted names), never the text itself, so its parser cannot
read the text differently from ours.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import pyarrow as pa
import pyarrow.compute as pc

from committers.delta.table._delta_schema import quote
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._rules import TableShape, WritePlan
from committers.delta.table._skipping import FilePruner, Op, Predicate, evaluate
from framework.errors import ConfigurationError, SchemaMismatchError
from framework.sink import RowCheck, sql_string

__all__ = ["FileClassifier", "FileOutcome", "ReplaceWhere", "with_replace_where"]

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
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
#: Backslash escapes of a Spark SQL string literal that mean the character itself.
_ESCAPES = frozenset("'\"\\")
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
#: Each operator under NOT (exact in three-valued logic: NOT of NULL is NULL).
_NEGATED = {
    "=": "!=",
    "==": "!=",
    "!=": "=",
    "<>": "=",
    "<": ">=",
    "<=": ">",
    ">": "<=",
    ">=": "<",
    "in": "not in",
    "not in": "in",
    "is null": "is not null",
    "is not null": "is null",
}
_SUPPORTED = (
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_integer,
    pa.types.is_decimal,
    pa.types.is_date,
    pa.types.is_boolean,
)
_SPARK_OPS = {
    "eq": "=",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
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
    bare: bool = False  # a column on its own: ``= TRUE``, checked to be boolean when bound

    def negated(self) -> _Comparison:
        return dataclasses.replace(self, op=_NEGATED[self.op])


_Conjunction = tuple[_Comparison, ...]
_Dnf = tuple[_Conjunction, ...]


def _and(left: _Dnf, right: _Dnf) -> _Dnf:
    return tuple(a + b for a in left for b in right)  # distribute into DNF


class _Parser:
    """Recursive descent into disjunctive normal form; ``NOT`` is pushed down to the
    comparisons (De Morgan and the operators' negations hold in three-valued logic)."""

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
            f"replace_where {self.text!r} does not parse: {problem}. It must compare columns "
            "with literals (=, !=, <, <=, >, >=, IN, NOT IN, IS [NOT] NULL, or a boolean column "
            "alone), joined by AND / OR / NOT, e.g. \"day = '2026-11-21'\" or "
            "\"is_even = true AND region IN ('eu', 'us')\"."
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

    def parse(self) -> _Dnf:
        if not self.tokens:
            self.fail("it is empty")
        result = self.disjunction(False)
        if self.peek() is not None:
            self.fail(f"unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return result

    def disjunction(self, negate: bool) -> _Dnf:
        # NOT (a OR b) = NOT a AND NOT b
        result = self.conjunction(negate)
        while self.accept("keyword", "OR"):
            right = self.conjunction(negate)
            result = _and(result, right) if negate else result + right
        return result

    def conjunction(self, negate: bool) -> _Dnf:
        # NOT (a AND b) = NOT a OR NOT b
        result = self.factor(negate)
        while self.accept("keyword", "AND"):
            right = self.factor(negate)
            result = result + right if negate else _and(result, right)
        return result

    def factor(self, negate: bool) -> _Dnf:
        if self.accept("keyword", "NOT"):
            return self.factor(not negate)
        if self.accept("punct", "("):
            inner = self.disjunction(negate)
            self.take("punct", ")")
            return inner
        comparison = self.comparison()
        return ((comparison.negated() if negate else comparison,),)

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
        following = self.peek()
        if following is None or following[0] != "op":  # a boolean column on its own
            return _Comparison(column, "=", (_Literal("bool", "TRUE"),), bare=True)
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
            return _Literal("string", self.string_body(value))
        if kind == "number":
            return _Literal("number", value)
        if kind == "keyword" and value in ("TRUE", "FALSE"):
            return _Literal("bool", value)
        if kind == "keyword" and value == "DATE":
            return _Literal("date", self.string_body(self.take("string")))
        if kind == "keyword" and value == "NULL":
            self.fail("a comparison with NULL is never true; use IS NULL or IS NOT NULL")
        self.fail(f"expected a literal, got {value!r}")

    def string_body(self, quoted: str) -> str:
        """The value of a string literal; only escapes that mean the character itself."""

        def unescape(match: re.Match[str]) -> str:
            escaped = match.group(1)
            if escaped is None:
                return "'"  # a doubled quote
            if escaped not in _ESCAPES:
                self.fail(
                    f"the escape \\{escaped} in {quoted} is not supported; write the character "
                    "itself"
                )
            return escaped

        return re.sub(r"\\(.)|''", unescape, quoted[1:-1])


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
            value = int(literal.text)
            if not -(2**63) <= value < 2**63:
                raise refuse(f"{literal.text} is outside the range of a long")
            return value
        if pa.types.is_decimal(dtype) and literal.kind in ("number", "string"):
            number = decimal.Decimal(literal.text)
            if not number.is_finite() or len(number.as_tuple().digits) > 38:
                raise refuse(f"{literal.text!r} is not a decimal of at most 38 digits")
            return number
        if pa.types.is_date(dtype) and literal.kind in ("date", "string"):
            if not _DATE.match(literal.text):
                raise refuse(f"{literal.text!r} is not a date written YYYY-MM-DD")
            return datetime.date.fromisoformat(literal.text)
        if pa.types.is_boolean(dtype) and literal.kind == "bool":
            return literal.text == "TRUE"
    except (ValueError, ArithmeticError) as err:
        raise refuse(f"{literal.text!r} is not a valid value: {err}") from err
    raise refuse(f"cannot compare with {literal.kind} literal {literal.text!r}")


FileOutcome = Literal["none", "all", "some"]


@dataclass(frozen=True)
class ReplaceWhere:
    """A parsed ``replace_where`` (see the module docstring), bound to the table's columns by
    :meth:`bind` before it can evaluate.

    Attributes:
        text: the predicate as given (quoted in messages and recorded in the commit).
    """

    text: str
    _terms: _Dnf
    _bound: tuple[tuple[Predicate, ...], ...] | None = None
    _partitions: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, text: object) -> ReplaceWhere:
        """Raises: ConfigurationError: not a string, or outside the accepted grammar."""
        if not isinstance(text, str):
            raise ConfigurationError(f"replace_where must be a string, got {text!r}")
        return cls(text, _Parser(text).parse())

    def bind(
        self, schema: pa.Schema, table_uri: str, partition_by: Sequence[str] = ()
    ) -> ReplaceWhere:
        """This predicate with its columns resolved in ``schema`` (the table's columns; names
        match ignoring case, as in Spark) and its literals typed for them; ``partition_by``
        names the partition columns among them.

        Raises:
            SchemaMismatchError: it names a column the table does not have.
            ConfigurationError: a column's type is not supported, or a literal does not fit it.
        """
        by_name = {name.lower(): name for name in schema.names}
        bound: list[tuple[Predicate, ...]] = []
        for conjunction in self._terms:
            bound_conjunction: list[Predicate] = []
            for comparison in conjunction:
                name = by_name.get(comparison.column.lower())
                if name is None:
                    raise SchemaMismatchError(
                        f"replace_where {self.text!r} names {comparison.column!r}, which is not "
                        f"a column of {table_uri} (its columns: {schema.names}). Name the "
                        "table's columns in replace_where."
                    )
                dtype = schema.field(name).type
                if not any(test(dtype) for test in _SUPPORTED):
                    raise ConfigurationError(
                        f"replace_where {self.text!r}: column {name!r} is {dtype}; only "
                        "string, integer, decimal, date and boolean columns can be used (their "
                        "comparisons mean the same in Spark, in pyarrow and on file statistics)."
                    )
                if comparison.bare and not pa.types.is_boolean(dtype):
                    raise ConfigurationError(
                        f"replace_where {self.text!r}: column {name!r} is {dtype}, not boolean, "
                        "so it cannot stand alone as a condition; compare it with a literal."
                    )
                typed = tuple(_typed(lit, name, dtype, self.text) for lit in comparison.literals)
                op, negated = _OPS[comparison.op]
                value = typed if op == "in" else (typed[0] if typed else None)
                bound_conjunction.append(Predicate(name, op, value, negated))
            bound.append(tuple(bound_conjunction))
        partitions = {by_name[p.lower()] for p in partition_by if p.lower() in by_name}
        return ReplaceWhere(self.text, self._terms, tuple(bound), frozenset(partitions))

    def _terms_bound(self) -> tuple[tuple[Predicate, ...], ...]:
        if self._bound is None:
            raise RuntimeError("ReplaceWhere.bind() must run before it evaluates")
        return self._bound

    @property
    def columns(self) -> tuple[str, ...]:
        """The table columns it reads, in order of appearance."""
        names = (p.column for conjunction in self._terms_bound() for p in conjunction)
        return tuple(dict.fromkeys(names))

    @property
    def on_partitions_only(self) -> bool:
        """Whether it reads partition columns only: it then selects whole files."""
        return all(name in self._partitions for name in self.columns)

    def matches(self, values: Mapping[str, Any]) -> bool:
        """Whether a row with these (typed) column values is replaced: the predicate is TRUE
        for them, under SQL's three-valued logic (a missing column is NULL)."""
        return any(
            all(evaluate(p, values.get(p.column)) is True for p in conjunction)
            for conjunction in self._terms_bound()
        )

    def sql(self) -> str:
        """The predicate as Spark SQL: quoted names, literals of the columns' types."""
        return " OR ".join(
            "(" + " AND ".join(_spark(p) for p in conjunction) + ")"
            for conjunction in self._terms_bound()
        )

    def mask(self, rows: pa.Table | pa.RecordBatch) -> pa.Array | pa.ChunkedArray:
        """Per row of ``rows`` (named as the table's columns; a missing column is NULL):
        whether the predicate is TRUE for it (NULL counts as false)."""
        result: Any = None
        for conjunction in self._terms_bound():
            term: Any = None
            for predicate in conjunction:
                value = _arrow(predicate, rows)
                term = value if term is None else pc.and_kleene(term, value)
            result = term if result is None else pc.or_kleene(result, term)
        return pc.fill_null(result, False)


def _spark_literal(value: Any) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return f"{value}BD"  # a decimal of exactly the literal's digits
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    return sql_string(str(value))


def _spark(predicate: Predicate) -> str:
    column = quote(predicate.column)
    if predicate.op == "is_null":
        return f"{column} IS NULL"
    if predicate.op == "is_not_null":
        return f"{column} IS NOT NULL"
    if predicate.op == "in":
        listed = ", ".join(_spark_literal(v) for v in predicate.value)
        return f"{column} {'NOT IN' if predicate.negated else 'IN'} ({listed})"
    op = "<>" if predicate.op == "eq" and predicate.negated else _SPARK_OPS[predicate.op]
    return f"{column} {op} {_spark_literal(predicate.value)}"


def _arrow_literal(value: Any) -> pa.Scalar:
    if isinstance(value, bool):
        return pa.scalar(value, pa.bool_())
    if isinstance(value, int):
        return pa.scalar(value, pa.int64())
    return pa.scalar(value)


def _arrow(predicate: Predicate, rows: pa.Table | pa.RecordBatch) -> Any:
    """One predicate on ``rows``, NULL where SQL gives NULL."""
    if predicate.column in rows.schema.names:
        column: Any = rows.column(predicate.column)
    else:
        column = pa.nulls(rows.num_rows)
    if pa.types.is_integer(column.type):
        column = column.cast(pa.int64())  # Spark widens both sides of an integer comparison
    if predicate.op == "is_null":
        return pc.is_null(column)
    if predicate.op == "is_not_null":
        return pc.is_valid(column)
    if pa.types.is_null(column.type):  # a column the rows lack: every comparison is NULL
        return pa.nulls(rows.num_rows, pa.bool_())
    if predicate.op == "in":  # x IN (a, b) is x = a OR x = b, in three-valued logic too
        hit: Any = None
        for value in predicate.value:
            equal = pc.equal(column, _arrow_literal(value))
            hit = equal if hit is None else pc.or_kleene(hit, equal)
        return pc.invert(hit) if predicate.negated else hit
    literal = _arrow_literal(predicate.value)
    compare = {
        "eq": pc.not_equal if predicate.negated else pc.equal,
        "lt": pc.less,
        "le": pc.less_equal,
        "gt": pc.greater,
        "ge": pc.greater_equal,
    }[predicate.op]
    return compare(column, literal)


class FileClassifier:
    """Decides, from a live file's partition values and statistics, whether it may hold rows
    ``where`` replaces:

    * ``"none"``: no row can match (every conjunction is ruled out by a partition value that
      does not make it TRUE, or by statistics, trusted as far as :mod:`_skipping` trusts
      them): the file is untouched;
    * ``"all"``: some conjunction reads partition columns only and is TRUE for the file's
      partition values, so every row matches: the file is removed whole, without reading it;
    * ``"some"``: anything else; its rows must be read.
    """

    def __init__(self, where: ReplaceWhere, shape: TableShape) -> None:
        self._partitions = frozenset(shape.partition_by)
        self._terms = where._terms_bound()
        self._pruners = [
            FilePruner(conjunction, shape, shape.column_mapping) for conjunction in self._terms
        ]

    def __call__(self, action: Mapping[str, Any]) -> FileOutcome:
        """``action``: a row of ``get_add_actions(flatten=True)``."""
        for conjunction in self._terms:
            if all(p.column in self._partitions for p in conjunction) and all(
                evaluate(p, action.get(f"partition.{p.column}")) is True for p in conjunction
            ):
                return "all"
        if any(pruner.keep(action) for pruner in self._pruners):
            return "some"
        return "none"


def with_replace_where(
    plan: WritePlan, replace_where: ReplaceWhere, table_uri: str, *, log_writable: bool = True
) -> tuple[WritePlan, ReplaceWhere]:
    """``plan`` with a row check that every written row satisfies ``replace_where`` (TRUE,
    not NULL), and ``replace_where`` bound to the plan's table.

    Raises:
        SchemaMismatchError, ConfigurationError: see :meth:`ReplaceWhere.bind`.
        UnsupportedTableFeatureError: a predicate on data columns (which rewrites files) on a
            table with deletion vectors on storage the sink's log writer cannot commit to
            (``log_writable`` false: the removes must name the vectors); an append-only table
            is refused for every overwrite, by ``check_replaceable``.
    """
    shape = plan.shape
    bound = replace_where.bind(shape.arrow_schema(), table_uri, shape.partition_by)
    if not bound.on_partitions_only:
        _check_rewritable(shape, bound, table_uri, log_writable)
    check = RowCheck(
        error="ConstraintViolationError",
        rule=f"replace_where ({bound.text})",
        predicate=bound.sql(),
        shown=bound.columns,
        hint="An overwrite may only write rows its replace_where covers: filter the "
        "DataFrame with the same predicate, or widen replace_where.",
    )
    inputs = dataclasses.replace(plan.input_plan, checks=(*plan.input_plan.checks, check))
    return dataclasses.replace(plan, input_plan=inputs), bound


def _check_rewritable(
    shape: TableShape, where: ReplaceWhere, table_uri: str, log_writable: bool
) -> None:
    if "deletionVectors" in shape.features and not log_writable:
        raise UnsupportedTableFeatureError(
            f"replace_where {where.text!r} reads data columns, so the overwrite rewrites the "
            f"files holding matching rows, and it cannot rewrite {table_uri}: it uses deletion "
            "vectors, and the remove of a rewritten file must name its vector, which delta-rs "
            "cannot write; the sink writes such commits itself only on local and S3 storage. "
            "Nothing was written. Use a replace_where on partition columns only, or "
            "delta-spark for this table."
        )
