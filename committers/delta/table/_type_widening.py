"""Type widening (PROTOCOL.md, "Type Widening"): the type changes a table's schema records,
and which of them this connector reads.

A column (or a nested field, a map key or value, an array element) whose type was widened
keeps its history in the ``delta.typeChanges`` metadata of its nearest struct field. Files
written before a change hold the narrower type; every reader here converts them to the
current type (pyarrow's cast in :mod:`committers.delta.read._source`, Spark's Parquet reader
for the scans Spark runs, both checked against delta-spark). A change outside the protocol's
list is refused by name, as readers must.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from committers.delta.table._delta_schema import ArrayType, DeltaField, MapType, StructType
from committers.delta.table._protocol import UnsupportedTableFeatureError

__all__ = [
    "ENABLE_TYPE_WIDENING",
    "TYPE_CHANGES",
    "check_type_changes",
    "is_supported_widening",
    "widens_types",
    "with_type_changes",
]

#: The metadata key of a field's type history.
TYPE_CHANGES = "delta.typeChanges"
#: The table property that lets writers widen types (PROTOCOL.md: else they must not).
ENABLE_TYPE_WIDENING = "delta.enableTypeWidening"

_INTEGERS = ("byte", "short", "integer", "long")
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
#: The integer types' digits, for a widening to a decimal (PROTOCOL.md: 10 for byte to int, 20
#: for long).
_INTEGER_DIGITS = {"byte": 10, "short": 10, "integer": 10, "long": 20}


def is_supported_widening(from_type: str, to_type: str) -> bool:
    """Whether the protocol allows widening ``from_type`` to ``to_type`` (Delta type names:
    ``integer``, ``decimal(10,2)``, ``timestamp_ntz``...)."""
    if from_type in _INTEGERS and to_type in _INTEGERS:
        return _INTEGERS.index(from_type) < _INTEGERS.index(to_type)
    if to_type == "double":
        return from_type in ("float", "byte", "short", "integer")
    if from_type == "date":
        return to_type == "timestamp_ntz"
    wider = _DECIMAL.match(to_type)
    if wider is None:
        return False
    precision, scale = int(wider.group(1)), int(wider.group(2))
    narrower = _DECIMAL.match(from_type)
    if narrower is not None:  # decimal(p, s) -> decimal(p + k1, s + k2), k1 >= k2 >= 0
        grown, scaled = precision - int(narrower.group(1)), scale - int(narrower.group(2))
        return grown >= scaled >= 0 and (grown, scaled) != (0, 0)
    digits = _INTEGER_DIGITS.get(from_type)
    return digits is not None and precision - scale >= digits


def widens_types(features: Iterable[str], configuration: Mapping[str, str]) -> bool:
    """Whether a write may widen the table's column types: the feature is supported and
    ``delta.enableTypeWidening`` is on (delta-spark widens then under schema evolution)."""
    enabled = str(configuration.get(ENABLE_TYPE_WIDENING, "false")).lower() == "true"
    return "typeWidening" in features and enabled


def with_type_changes(schema: StructType, widened: Mapping[str, str]) -> StructType:
    """``schema`` with each top-level column of ``widened`` (name -> its new Delta type)
    retyped, the change appended to its ``delta.typeChanges``, as writers must record it."""
    fields = []
    for f in schema.fields:
        new_type = widened.get(f.name)
        if new_type is None or new_type == f.type:
            fields.append(f)
            continue
        change = {"fromType": f.type, "toType": new_type}
        metadata = {**f.metadata, TYPE_CHANGES: [*_changes_of(f), change]}
        fields.append(dataclasses.replace(f, type=new_type, metadata=metadata))
    return StructType(tuple(fields))


def check_type_changes(uri: str, schema: StructType) -> None:
    """Refuse a table whose schema records a type change the protocol does not allow (its
    older files could not be read as the current type).

    Raises:
        UnsupportedTableFeatureError: naming each such column and change.
    """
    wrong = [
        f"{path}: {change.get('fromType')} to {change.get('toType')}"
        for path, change in _type_changes(schema)
        if not is_supported_widening(str(change.get("fromType")), str(change.get("toType")))
    ]
    if wrong:
        raise UnsupportedTableFeatureError(
            f"table {uri} records type changes that are not widenings Delta allows "
            f"({'; '.join(wrong)}): its older files cannot be read as the current types, so "
            "nothing was read or written. Rewrite the affected columns with the engine that "
            "changed them."
        )


def _type_changes(struct: StructType, prefix: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(column path, change) of every recorded type change, nested fields included."""
    for field in struct.fields:
        path = f"{prefix}{field.name}"
        for change in _changes_of(field):
            where = change.get("fieldPath")
            yield (f"{path}.{where}" if where else path), change
        yield from _nested_changes(field.type, f"{path}.")


def _changes_of(field: DeltaField) -> list[dict[str, Any]]:
    changes = field.metadata.get(TYPE_CHANGES) or []
    if isinstance(changes, str):  # (as some writers spell metadata values)
        changes = json.loads(changes)
    return [dict(c) for c in changes]


def _nested_changes(t: Any, prefix: str) -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(t, StructType):
        yield from _type_changes(t, prefix)
    elif isinstance(t, ArrayType):
        yield from _nested_changes(t.element, prefix)
    elif isinstance(t, MapType):
        yield from _nested_changes(t.key, prefix)
        yield from _nested_changes(t.value, prefix)
