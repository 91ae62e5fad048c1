"""Which schemas a Delta stream can read files of, by delta-spark's rule.

A stream reads every file with one schema, its *read schema*. Files written under another
schema (a ``metaData`` action of a commit the stream crosses, or an older snapshot it reads)
are readable with it when delta-spark's ``SchemaUtils.isReadCompatible`` says so: every column
of the file's schema is in the read schema (same name, same case), with a type readable as the
read type (the same type; for structs, arrays and maps the same rule inside) and not read as
NOT NULL when it was nullable. The read schema may have more columns: a file written before a
column was added reads it as null. Schemas are Delta's JSON (Spark's ``StructType`` JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["describe_difference", "read_compatible"]

_NULL_TYPES = frozenset({"null", "void"})


def _nullability_compatible(existing_nullable: bool, read_nullable: bool) -> bool:
    """Nulls written may not be read as NOT NULL."""
    return read_nullable or not existing_nullable


def _type_compatible(existing: Any, read: Any) -> bool:
    if isinstance(existing, str) and existing in _NULL_TYPES:
        return True
    if not (isinstance(existing, Mapping) and isinstance(read, Mapping)):
        return bool(existing == read)
    kind = existing.get("type")
    if kind != read.get("type"):
        return False
    if kind == "struct":
        return read_compatible(existing, read)
    if kind == "array":
        return _nullability_compatible(
            bool(existing.get("containsNull", True)), bool(read.get("containsNull", True))
        ) and _type_compatible(existing.get("elementType"), read.get("elementType"))
    if kind == "map":
        return (
            _nullability_compatible(
                bool(existing.get("valueContainsNull", True)),
                bool(read.get("valueContainsNull", True)),
            )
            and _type_compatible(existing.get("keyType"), read.get("keyType"))
            and _type_compatible(existing.get("valueType"), read.get("valueType"))
        )
    return bool(existing == read)


def _fields(schema: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(f["name"]): f for f in schema.get("fields", ())}


def read_compatible(existing: Mapping[str, Any], read: Mapping[str, Any]) -> bool:
    """Whether files written with struct ``existing`` can be read with struct ``read``."""
    written, reading = _fields(existing), _fields(read)
    if not set(written) <= set(reading):
        return False
    for name, field in reading.items():
        old = written.get(name)
        if old is None:
            continue  # added later: read as null
        if not _nullability_compatible(
            bool(old.get("nullable", True)), bool(field.get("nullable", True))
        ):
            return False
        if not _type_compatible(old.get("type"), field.get("type")):
            return False
    return True


def describe_difference(existing: Mapping[str, Any], read: Mapping[str, Any]) -> str:
    """What separates two schemas, top-level columns named (for error messages)."""
    written, reading = _fields(existing), _fields(read)
    parts = []
    new = [n for n in written if n not in reading]
    if new:
        parts.append(f"column(s) {', '.join(map(repr, new))} not in the stream's schema")
    gone = [n for n in reading if n not in written]
    if gone:
        parts.append(f"no column(s) {', '.join(map(repr, gone))}")
    changed = [
        n
        for n, f in reading.items()
        if n in written
        and (
            written[n].get("type") != f.get("type")
            or written[n].get("nullable") != f.get("nullable")
        )
    ]
    if changed:
        parts.append(f"another type or nullability for {', '.join(map(repr, changed))}")
    return "; ".join(parts) or "the same columns"
