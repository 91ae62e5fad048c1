"""The sink's reading and writing of Delta schema strings: what it writes into a ``metaData``
action is what it read, field metadata, nesting and nullability included."""

from __future__ import annotations

import json

from committers.delta.table._delta_schema import parse_schema, schema_json

_SCHEMA = {
    "type": "struct",
    "fields": [
        {
            "name": "id",
            "type": "long",
            "nullable": False,
            "metadata": {
                "delta.columnMapping.id": 1,
                "delta.columnMapping.physicalName": "col-a",
                "CURRENT_DEFAULT": "42",
            },
        },
        {
            "name": "odd `name`.x",
            "type": {
                "type": "map",
                "keyType": "string",
                "valueType": {
                    "type": "array",
                    "elementType": {
                        "type": "struct",
                        "fields": [
                            {
                                "name": "d",
                                "type": "decimal(38,18)",
                                "nullable": True,
                                "metadata": {},
                            }
                        ],
                    },
                    "containsNull": False,
                },
                "valueContainsNull": True,
            },
            "nullable": True,
            "metadata": {"comment": "ünï 😀"},
        },
    ],
}


def test_a_schema_string_written_is_the_one_read():
    written = schema_json(parse_schema(json.dumps(_SCHEMA)))
    assert json.loads(written) == _SCHEMA
    assert parse_schema(written) == parse_schema(json.dumps(_SCHEMA))
