"""The widenings PROTOCOL.md ("Type Widening") allows, and nothing else."""

from __future__ import annotations

import json

import pytest

from committers.delta.table._delta_schema import parse_schema
from committers.delta.table._protocol import UnsupportedTableFeatureError
from committers.delta.table._type_widening import check_type_changes, is_supported_widening

ALLOWED = [
    ("byte", "short"),
    ("byte", "long"),
    ("short", "integer"),
    ("integer", "long"),
    ("float", "double"),
    ("byte", "double"),
    ("integer", "double"),
    ("date", "timestamp_ntz"),
    ("decimal(5,2)", "decimal(10,4)"),
    ("decimal(5,2)", "decimal(6,2)"),
    ("decimal(5,2)", "decimal(6,3)"),
    ("decimal(10,2)", "decimal(12, 4)"),
    ("integer", "decimal(10,0)"),
    ("short", "decimal(12,2)"),
    ("long", "decimal(20,0)"),
    ("long", "decimal(25,5)"),
]
REFUSED = [
    ("long", "integer"),  # narrowing
    ("integer", "integer"),
    ("long", "double"),  # loses precision
    ("float", "decimal(10,2)"),
    ("date", "timestamp"),  # only to timestamp without time zone
    ("timestamp_ntz", "date"),
    ("decimal(5,2)", "decimal(6,4)"),  # scale grows more than precision
    ("decimal(5,2)", "decimal(5,2)"),
    ("decimal(5,2)", "decimal(10,1)"),  # scale shrinks
    ("integer", "decimal(9,0)"),
    ("long", "decimal(21,2)"),
    ("string", "long"),
    ("integer", "string"),
]


@pytest.mark.parametrize(("narrow", "wide"), ALLOWED)
def test_the_protocols_widenings_are_supported(narrow, wide):
    assert is_supported_widening(narrow, wide)


@pytest.mark.parametrize(("narrow", "wide"), REFUSED)
def test_other_type_changes_are_not(narrow, wide):
    assert not is_supported_widening(narrow, wide)


def test_a_wrong_change_of_a_nested_field_is_refused_by_its_path():
    element = {
        "type": "struct",
        "fields": [
            {
                "name": "x",
                "type": "integer",
                "nullable": True,
                "metadata": {"delta.typeChanges": [{"fromType": "long", "toType": "integer"}]},
            }
        ],
    }
    schema = {
        "type": "struct",
        "fields": [
            {
                "name": "a",
                "type": {"type": "array", "elementType": element, "containsNull": True},
                "nullable": True,
                "metadata": {
                    "delta.typeChanges": [
                        {"fromType": "short", "toType": "integer", "fieldPath": "element.y"}
                    ]
                },
            }
        ],
    }
    with pytest.raises(UnsupportedTableFeatureError, match=r"a\.x: long to integer") as raised:
        check_type_changes("t", parse_schema(json.dumps(schema)))
    assert "element.y" not in str(raised.value)  # (an allowed change is not named)
