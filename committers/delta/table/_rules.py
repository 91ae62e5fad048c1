"""What a Delta table requires of every row, and the shape of the files written for it.

:func:`plan_write` turns the table (or, for a table still to be created, the input) into

* an :class:`~framework.sink.InputPlan`, evaluated by the engine in its own tasks: columns the
  table defines but the input lacks (generated columns, nullable columns in merge mode) are
  filled in; NOT NULL, CHECK constraints, invariants, given generated values and partition
  values are checked on every row; columns are renamed to their physical names and partition
  values spelled as the Delta log stores them;
* a :class:`FileLayout`, telling the writers which received columns go into the files (with
  which Arrow types and Parquet field ids) and which name the partition.

A feature's rule applies only when the table's protocol enables the feature, as PROTOCOL.md
defines; features the sink cannot honour are refused first (see ``_protocol.py``). The plan is
plain data and compares by value: the committer rebuilds it from the table it commits to and
commits only if it is unchanged (a constraint added while the batch was staging is caught).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from deltalake import DeltaTable

from committers.delta.table._delta_schema import (
    ArrayType,
    DeltaField,
    MapType,
    StructType,
    arrow_schema,
    parse_arrow_schema,
    parse_schema,
    quote,
    spark_type,
    walk,
)
from committers.delta.table._identity import (
    IDENTITY_FEATURE,
    IdentityColumn,
    check_explicit_values,
    identity_columns,
    placeholder_sql,
)
from committers.delta.table._protocol import TableFeatures
from committers.delta.table._schema import (
    HIVE_NULL,
    SINK_SPELLING,
    OptionSpelling,
    SchemaMode,
    merge_schemas,
    nullable_nested,
    spelled_differently,
)
from committers.delta.table._type_widening import (
    check_type_changes,
    widens_types,
    with_type_changes,
)
from framework.errors import SchemaMismatchError, UnsupportedTypeError
from framework.sink import InputPlan, PlannedColumn, RowCheck

__all__ = [
    "MAX_MICROS",
    "MIN_MICROS",
    "FileLayout",
    "TableShape",
    "WritePlan",
    "as_column_type",
    "new_table_schema",
    "plan_write",
]

CONSTRAINT_PREFIX = "delta.constraints."
DEFAULTS_FEATURE = "allowColumnDefaults"
COLUMN_MAPPING_MODE = "delta.columnMapping.mode"
SPARK_FIELD_ID = "parquet.field.id"
# delta-spark's record of a CHAR(n) / VARCHAR(n) column (a string in the log).
CHAR_VARCHAR_TYPE = "__CHAR_VARCHAR_TYPE_STRING"
_CHAR_VARCHAR = re.compile(r"(char|varchar)\((\d+)\)")

#: Instants Delta can spell (years 1 to 9999), in microseconds since the epoch.
MIN_MICROS = -62135596800000000
MAX_MICROS = 253402300799999999
_MICROS_PER_DAY = 86400000000
_SHOWN_COLUMNS = 10  # columns quoted in a violation message


@dataclass(frozen=True)
class TableShape:
    """What the sink needs to know of a table: schema, partitioning and the rules it enables."""

    schema: StructType
    partition_by: tuple[str, ...]
    features: TableFeatures
    configuration: tuple[tuple[str, str], ...]

    @classmethod
    def of_table(cls, table: DeltaTable) -> TableShape:
        protocol = table.protocol()
        metadata = table.metadata()
        return cls(
            schema=parse_schema(table.schema().to_json()),
            partition_by=tuple(metadata.partition_columns),
            features=TableFeatures.of(protocol.min_writer_version, protocol.writer_features),
            configuration=tuple(sorted((k, str(v)) for k, v in metadata.configuration.items())),
        )

    @property
    def widens_types(self) -> bool:
        """Whether a schema merge may widen its columns' types (see ``_type_widening``)."""
        return widens_types(self.features.enabled, dict(self.configuration))

    @classmethod
    def for_new_table(cls, schema: pa.Schema, partition_by: Sequence[str]) -> TableShape:
        """The table the sink will create for input ``schema`` (no features, no rules)."""
        return cls(
            schema=parse_arrow_schema(new_table_schema(schema)),
            partition_by=tuple(partition_by),
            features=TableFeatures.of(2, None),
            configuration=(),
        )

    @property
    def constraints(self) -> list[tuple[str, str]]:
        if "checkConstraints" not in self.features:
            return []
        return [
            (key[len(CONSTRAINT_PREFIX) :], value)
            for key, value in self.configuration
            if key.startswith(CONSTRAINT_PREFIX)
        ]

    @property
    def column_mapping(self) -> bool:
        mode = dict(self.configuration).get(COLUMN_MAPPING_MODE, "none")
        return "columnMapping" in self.features and mode in ("name", "id")

    def stored_name(self, column: str) -> str:
        """The name the files, the stats and the partition values give top-level ``column``:
        its physical name under column mapping, else its name."""
        return self.schema.field(column).physical_name if self.column_mapping else column

    def arrow_schema(self) -> pa.Schema:
        """The table's logical schema in Arrow (what the input is matched against)."""
        logical = arrow_schema(self.schema, physical=False)
        return pa.schema(
            [a.with_nullable(f.nullable) for a, f in zip(logical, self.schema.fields, strict=True)]
        )

    @property
    def generated_columns(self) -> frozenset[str]:
        if "generatedColumns" not in self.features:
            return frozenset()
        return frozenset(f.name for f in self.schema.fields if f.generation_expression)

    @property
    def identity_columns(self) -> tuple[IdentityColumn, ...]:
        return identity_columns(self.schema, IDENTITY_FEATURE in self.features)

    @property
    def defaulted_columns(self) -> frozenset[str]:
        """Columns with a ``CURRENT_DEFAULT`` the table's protocol enables (delta-spark's
        ``DEFAULT``): an input lacking one gets its default."""
        if DEFAULTS_FEATURE not in self.features:
            return frozenset()
        return frozenset(f.name for f in self.schema.fields if f.default_expression is not None)

    @property
    def computed_columns(self) -> frozenset[str]:
        """Columns the sink fills in when the input lacks them: generated, identity and
        defaulted ones."""
        return (
            self.generated_columns
            | {c.name for c in self.identity_columns}
            | self.defaulted_columns
        )


def new_table_schema(input_schema: pa.Schema) -> pa.Schema:
    """The schema of a table the sink creates for ``input_schema``: every column and nested
    field nullable, as delta-spark creates a table from a DataFrame (``spark.range`` ids are
    NOT NULL in Spark, and must not make a NOT NULL table by accident). NOT NULL columns come
    from creating the table first, with a schema that says so."""
    return pa.schema(
        [f.with_type(nullable_nested(f.type)).with_nullable(True) for f in input_schema],
        metadata=input_schema.metadata,
    )


@dataclass(frozen=True)
class FileLayout:
    """How the columns the writers receive map onto files and partition values.

    Attributes:
        file_schema: the data columns, named and typed as in the Parquet files (physical
            names, ``PARQUET:field_id`` metadata under column mapping).
        partition_columns: received columns holding partition values, already spelled as the
            log stores them (strings or null); each name is also its ``partitionValues`` key.
        hive_directories: files go under ``name=value/`` directories; otherwise (column
            mapping, as delta-spark and delta-rs do it) under random two-character prefixes,
            because readers that parse such directory names would take physical names for
            columns.
    """

    file_schema: pa.Schema
    partition_columns: tuple[str, ...]
    hive_directories: bool = True

    @property
    def received_columns(self) -> list[str]:
        return [*self.file_schema.names, *self.partition_columns]


@dataclass(frozen=True)
class WritePlan:
    shape: TableShape
    input_plan: InputPlan
    layout: FileLayout

    @property
    def generated_identity(self) -> tuple[IdentityColumn, ...]:
        """The identity columns whose values each batch generates (those the input lacks):
        their planned expressions are placeholders until the batch's values are reserved
        (:func:`~committers.delta.table._identity.with_generated_values`)."""
        planned = {c.name: c.expression for c in self.input_plan.columns}
        return tuple(
            c for c in self.shape.identity_columns if planned.get(c.name) == placeholder_sql(c)
        )


def plan_write(
    shape: TableShape,
    input_schema: pa.Schema,
    schema_mode: SchemaMode,
    table_uri: str,
    spelling: OptionSpelling = SINK_SPELLING,
) -> WritePlan:
    """Plan writing input of ``input_schema`` into the table described by ``shape``; errors
    name options as ``spelling`` spells them.

    Raises:
        UnsupportedTableFeatureError: the table needs a feature the sink cannot honour.
        SchemaMismatchError: the input does not fit the table (with how to fix it).
        UnsupportedTypeError: a column has a type the sink cannot write.
    """
    shape.features.check_writable(table_uri)
    check_type_changes(table_uri, shape.schema)
    try:
        table_schema = shape.arrow_schema()
    except ValueError as err:  # a Delta type the sink has no spelling for (variant, ...)
        raise UnsupportedTypeError(f"table {table_uri} cannot be written: {err}") from err
    merged = merge_schemas(
        table_schema,
        input_schema,
        schema_mode,
        shape.computed_columns,
        spelling,
        widening=shape.widens_types,
    )
    check_explicit_values(shape.identity_columns, input_schema.names, table_uri)
    added = [f for f in merged if f.name not in shape.schema.names]
    if added and shape.column_mapping:
        raise SchemaMismatchError(
            f"the input has new columns {[f.name for f in added]}, but {table_uri} uses column "
            "mapping and delta-rs cannot add columns to such a table. Add the columns with "
            "an engine that can (ALTER TABLE ... ADD COLUMNS in delta-spark), or drop them "
            "from the input."
        )
    if added and shape.identity_columns:
        raise SchemaMismatchError(
            f"the input has new columns {[f.name for f in added]}, but {table_uri} has "
            "identity columns, and the sink commits to such tables by appending rows only. Add "
            "the columns with delta-spark (ALTER TABLE ... ADD COLUMNS), or drop them from the "
            "input."
        )
    shape = evolved_shape(shape, merged)
    given = {f.name.lower(): f for f in input_schema}  # names match ignoring case
    table_types = {f.name: f.type for f in shape.arrow_schema()}
    try:
        columns = tuple(
            _defined_column(shape, f, given.get(f.name.lower()), table_types[f.name])
            for f in shape.schema.fields
        )
        output, layout = _output(shape)
        plan = InputPlan(columns=columns, checks=tuple(_checks(shape, given)), output=output)
    except ValueError as err:  # a Delta type the sink has no spelling for
        raise UnsupportedTypeError(f"table {table_uri} cannot be written: {err}") from err
    return WritePlan(shape, plan, layout)


def evolved_shape(shape: TableShape, merged: pa.Schema) -> TableShape:
    """``shape`` after a schema merge gave ``merged`` (:func:`merge_schemas`): its columns
    retyped where the merge widened them (the changes recorded), the new columns appended.
    The same object when nothing changed."""
    current = shape.arrow_schema()
    added = [f for f in merged if f.name not in current.names]
    retyped = [
        f for f in merged if f.name in current.names and f.type != current.field(f.name).type
    ]
    if not added and not retyped:
        return shape
    widened = (
        {f.name: str(f.type) for f in parse_arrow_schema(pa.schema(retyped)).fields}
        if retyped
        else {}
    )
    schema = with_type_changes(shape.schema, widened)
    new_fields = parse_arrow_schema(pa.schema(added)).fields if added else ()
    return TableShape(
        StructType(schema.fields + tuple(new_fields)),
        shape.partition_by,
        shape.features,
        shape.configuration,
    )


def _defined_column(
    shape: TableShape, f: DeltaField, source: pa.Field | None, table_type: pa.DataType
) -> PlannedColumn:
    """The column as the table defines it: the input's (``source``, whatever the case of its
    name; cast when it spells a nested name differently), generated, or null."""
    origin = None
    if source is not None:
        expression = quote(source.name)
        if spelled_differently(source.type, table_type):
            expression = f"CAST({expression} AS {spark_type(f.type, physical=False)})"
    elif f.name in shape.generated_columns:
        expression = as_column_type(f.generation_expression, f)
        origin = f"generation expression of column {f.name!r}"
    elif f.is_identity and IDENTITY_FEATURE in shape.features:
        expression = placeholder_sql(IdentityColumn.of(f))  # values reserved per batch
    elif f.name in shape.defaulted_columns:
        # Spark SQL, as delta-spark stores it; evaluated by Spark once per batch's query (so
        # current_timestamp() is one instant per batch, as per statement in delta-spark).
        expression = as_column_type(f.default_expression, f)
        origin = f"default of column {f.name!r}"
    else:
        expression = as_column_type(None, f)
    return PlannedColumn(name=f.name, expression=expression, origin=origin)


def as_column_type(sql: str | None, f: DeltaField) -> str:
    """Spark SQL ``sql`` (a generation expression, a default; ``None``: NULL) cast to
    ``f``'s type."""
    return f"CAST(({sql or 'NULL'}) AS {spark_type(f.type, physical=False)})"


def length_limit(f: DeltaField) -> tuple[str, int] | None:
    """``("char" | "varchar", n)`` for a string column delta-spark declared ``CHAR(n)`` or
    ``VARCHAR(n)``; ``None`` for any other column.

    Raises:
        ValueError: the declaration is on a nested type (``ARRAY<VARCHAR(3)>``, a struct
            holding one), whose lengths this sink does not enforce.
    """
    declared = f.metadata.get(CHAR_VARCHAR_TYPE)
    if declared is None:
        return None
    match = _CHAR_VARCHAR.fullmatch(str(declared).strip().lower())
    if match is None or f.type != "string":
        raise ValueError(
            f"column {f.name!r} is declared {declared} by delta-spark, and this sink enforces "
            "CHAR(n) and VARCHAR(n) lengths on top-level string columns only"
        )
    return match.group(1), int(match.group(2))


def _checks(shape: TableShape, given: Mapping[str, pa.Field]) -> list[RowCheck]:
    shown = tuple(
        f.name for f in shape.schema.fields if isinstance(f.type, str) and f.type != "binary"
    )[:_SHOWN_COLUMNS]
    checks = []
    for path, f in walk(shape.schema):
        column = ".".join(quote(part) for part in path)
        label = ".".join(path)
        parents = [".".join(quote(p) for p in path[:i]) for i in range(1, len(path))]
        for what, must_hold in _non_null_rules(f, column):
            allowed = " OR ".join([f"{p} IS NULL" for p in parents] + [must_hold])
            checks.append(
                RowCheck(
                    error="NullConstraintError",
                    rule=f"NOT NULL {what} {label!r}",
                    predicate=allowed,
                    shown=shown,
                    hint="Filter or fill the nulls before writing "
                    "(df.na.drop(subset=[...]) or coalesce()).",
                )
            )
        if f.invariant and "invariants" in shape.features:
            checks.append(
                RowCheck(
                    error="ConstraintViolationError",
                    rule=f"invariant of column {label!r} ({f.invariant})",
                    predicate=f.invariant,
                    shown=shown,
                    hint="Filter out or fix the rows that break it before writing.",
                )
            )
    for f in shape.schema.fields:
        if f.name in shape.generated_columns and f.name.lower() in given:
            expected = as_column_type(f.generation_expression, f)
            checks.append(
                RowCheck(
                    error="ConstraintViolationError",
                    rule=f"generated column {f.name!r} = {f.generation_expression}",
                    predicate=f"{quote(f.name)} <=> {expected}",
                    shown=shown,
                    hint="Leave the column out of the input to have it computed, or write "
                    "the value its expression gives.",
                )
            )
    for f in shape.schema.fields:
        limit = length_limit(f)
        if limit is not None:
            kind, n = limit
            checks.append(
                RowCheck(
                    error="ConstraintViolationError",
                    rule=f"{kind}({n}) column {f.name!r} holds at most {n} characters",
                    predicate=f"{quote(f.name)} IS NULL OR char_length({quote(f.name)}) <= {n}",
                    shown=shown,
                    hint="Shorten the values (substring()) or filter out the rows before "
                    "writing (delta-spark refuses them too, trailing spaces included).",
                )
            )
    for name, expression in shape.constraints:
        checks.append(
            RowCheck(
                error="ConstraintViolationError",
                rule=f"CHECK constraint {name} ({expression})",
                predicate=expression,
                shown=shown,
                hint="Filter out or fix the rows that break it before writing.",
            )
        )
    for name in shape.partition_by:
        checks.extend(_partition_value_checks(name, shape.schema.field(name).type, shown))
    return checks


def _non_null_rules(f: DeltaField, column: str) -> list[tuple[str, str]]:
    """(what may not be null, SQL that holds when it is not) for one field."""
    rules = []
    if not f.nullable:
        rules.append(("column", f"{column} IS NOT NULL"))
    if isinstance(f.type, ArrayType) and not f.type.contains_null:
        rules.append(
            ("elements of array", f"NOT coalesce(exists({column}, e -> e IS NULL), false)")
        )
    if isinstance(f.type, MapType) and not f.type.value_contains_null:
        values = f"map_values({column})"
        rules.append(("values of map", f"NOT coalesce(exists({values}, v -> v IS NULL), false)"))
    return rules


def _partition_value_checks(
    name: str, delta_type: object, shown: tuple[str, ...]
) -> list[RowCheck]:
    """Partition values Delta cannot keep apart from null: '' (the log reads it back as null),
    ``__HIVE_DEFAULT_PARTITION__`` (the directory name of null: Spark's writer and Hive-style
    readers cannot tell them apart); years outside 1..9999, which it cannot spell."""
    column = quote(name)
    if delta_type == "string":
        return [
            RowCheck(
                error="ConstraintViolationError",
                rule=f"partition column {name!r} must not hold an empty string (Delta stores "
                "'' as null)",
                predicate=f"{column} IS NULL OR {column} <> ''",
                shown=shown,
                hint="Write NULL, or a non-empty value such as a placeholder.",
            ),
            RowCheck(
                error="ConstraintViolationError",
                rule=f"partition column {name!r} must not hold the string {HIVE_NULL!r} "
                "(the directory name of a null partition value: Spark's writer, delta-spark "
                "and readers of Hive-style directories take it for null)",
                predicate=f"{column} IS NULL OR {column} <> '{HIVE_NULL}'",
                shown=shown,
                hint="Write NULL, or another placeholder value.",
            ),
        ]
    if delta_type == "timestamp":
        micros = f"unix_micros({column})"
        predicate = f"{column} IS NULL OR {micros} BETWEEN {MIN_MICROS} AND {MAX_MICROS}"
    elif delta_type in ("date", "timestamp_ntz"):
        predicate = f"{column} IS NULL OR year({column}) BETWEEN 1 AND 9999"
    else:
        return []
    return [
        RowCheck(
            error="ConstraintViolationError",
            rule=f"partition column {name!r} must hold a year between 1 and 9999",
            predicate=predicate,
            shown=shown,
            hint="Delta spells partition values with four-digit years; filter or clamp the value.",
        )
    ]


def _output(shape: TableShape) -> tuple[tuple[PlannedColumn, ...], FileLayout]:
    physical = shape.column_mapping
    partitions = set(shape.partition_by)
    data = []
    for f in shape.schema.fields:
        if f.name in partitions:
            continue
        name = f.physical_name if physical else f.name
        expression = quote(f.name)
        if physical and not isinstance(f.type, str):  # nested names are physical too
            expression = f"CAST({expression} AS {spark_type(f.type, physical=True)})"
        metadata = {SPARK_FIELD_ID: f.field_id} if physical and f.field_id is not None else {}
        data.append(PlannedColumn(name=name, expression=expression, metadata=metadata))
    partition_columns = []
    for name in shape.partition_by:
        f = shape.schema.field(name)
        key = f.physical_name if physical else f.name
        partition_columns.append(
            PlannedColumn(name=key, expression=_partition_value_sql(quote(name), f.type))
        )
    file_schema = arrow_schema(shape.schema, physical=physical, skip=frozenset(shape.partition_by))
    layout = FileLayout(
        file_schema, tuple(c.name for c in partition_columns), hive_directories=not physical
    )
    return (*data, *partition_columns), layout


def _partition_value_sql(column: str, delta_type: object) -> str:
    """Spark SQL spelling a partition value as the Delta log stores it (NULL stays NULL)."""
    if delta_type == "timestamp":
        # The instant in UTC, ISO 8601 with its "Z" (as delta-spark writes it, and read the
        # same in any session time zone), computed from the instant, not the session's zone.
        micros = f"unix_micros({column})"
        of_day = f"pmod({micros}, {_MICROS_PER_DAY})"
        days = f"div({micros} - {of_day}, {_MICROS_PER_DAY})"  # exact floor, also before 1970
        day = f"date_from_unix_date(CAST({days} AS INT))"

        def two(value: str) -> str:
            return f"lpad(CAST({value} AS STRING), 2, '0')"

        return (
            f"concat(CAST({day} AS STRING), 'T', "
            f"{two(f'div({of_day}, 3600000000)')}, ':', "
            f"{two(f'pmod(div({of_day}, 60000000), 60)')}, ':', "
            f"{two(f'pmod(div({of_day}, 1000000), 60)')}, '.', "
            f"lpad(CAST(pmod({of_day}, 1000000) AS STRING), 6, '0'), 'Z')"
        )
    if delta_type == "timestamp_ntz":
        return f"date_format({column}, 'yyyy-MM-dd HH:mm:ss.SSSSSS')"
    # Numbers (decimals in plain notation), booleans, dates and strings as Spark spells them.
    return f"CAST({column} AS STRING)"
