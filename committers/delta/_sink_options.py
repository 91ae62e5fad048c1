"""The checks of DeltaSink's constructor arguments: app ids, schema modes, writer options,
upsert specs, and delta-spark's option names answered with ours."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from committers.delta.table._protocol import IN_COMMIT_TIMESTAMPS_KEY, uses_in_commit_timestamps
from committers.delta.table._rules import COLUMN_MAPPING_MODE
from committers.delta.write._options import WriterOptions
from committers.delta.write._upsert_spec import UpsertSpec, given_keywords
from framework.errors import ConfigurationError

__all__ = [
    "DELTA_SPARK_SPELLINGS",
    "check_app_id",
    "check_schema_mode",
    "check_table_configuration",
    "resolved_upsert_spec",
    "resolved_writer_options",
]


def check_app_id(app_id: str | None) -> None:
    if app_id is None:
        return
    if not isinstance(app_id, str) or not app_id.strip():
        raise ConfigurationError(f"app_id must be a non-empty string or None, got {app_id!r}")
    if any(ord(c) < 32 for c in app_id):
        raise ConfigurationError(f"app_id must not contain control characters: {app_id!r}")


#: delta-spark writer options (``.option(name, ...)``) and where their meaning lives here.
DELTA_SPARK_SPELLINGS = {
    "mergeSchema": "use schema_mode='merge' to add the input's new columns to the table",
    "merge_schema": "use schema_mode='merge' to add the input's new columns to the table",
    "replaceWhere": "use mode='overwrite', replace_where='...'",
    "options": "pass each option as a keyword argument of DeltaSink, and storage settings as "
    "storage_options={...} (AWS_ENDPOINT_URL, AWS_REGION, ...)",
    "partitionBy": "use partition_by=[...]",
    "path": "the table URI is DeltaSink's first argument, table_uri",
    "txnAppId": "use app_id=...; the batch id is the txn version",
    "txnVersion": "the streaming batch id is the txn version; for a bounded write pass "
    "epoch_id= to TwoPhaseSink(...).write(df, epoch_id=...)",
    "checkpointLocation": "pass checkpoint_location= to TwoPhaseSink(...).write_stream(df, ...)",
    "maxRecordsPerFile": "use target_file_size=<bytes> to bound file sizes",
    "overwriteSchema": "use mode='overwrite', schema_mode='overwrite'",
    "overwrite_schema": "use mode='overwrite', schema_mode='overwrite'",
    "userMetadata": "use user_metadata='...'",
    "outputMode": "pass output_mode= to TwoPhaseSink(...).write_stream(df, ...)",
}


def check_schema_mode(schema_mode: object, mode: object, replace_where: object) -> None:
    """Raises: ConfigurationError: an unknown ``schema_mode``, or ``"overwrite"`` outside an
    overwrite of the whole table."""
    if schema_mode not in ("strict", "merge", "overwrite"):
        raise ConfigurationError(
            f"schema_mode must be 'strict', 'merge' or 'overwrite', got {schema_mode!r}"
        )
    if schema_mode == "overwrite" and mode != "overwrite":
        raise ConfigurationError(
            "schema_mode='overwrite' replaces the table's schema together with all its rows: "
            f"it needs mode='overwrite' (got mode={mode!r}). To add the input's new columns "
            "to the table instead, use schema_mode='merge'."
        )
    if schema_mode == "overwrite" and replace_where is not None:
        raise ConfigurationError(
            "schema_mode='overwrite' cannot be combined with replace_where (as delta-spark "
            "refuses overwriteSchema with replaceWhere): the rows replace_where keeps would "
            "not fit the new schema. Overwrite the whole table, or keep the schema."
        )


def resolved_writer_options(given: WriterOptions | None, **keywords: Any) -> WriterOptions:
    """``given``, or the options the keywords spell (each keyword defaults to the field's
    default).

    Raises:
        ConfigurationError: ``given`` is no :class:`WriterOptions`, or a keyword other than
            its default comes with it (which of the two would win is not obvious).
    """
    if given is None:
        return WriterOptions(**keywords)
    if not isinstance(given, WriterOptions):
        raise ConfigurationError(
            f"writer_options must be a WriterOptions, got {type(given).__name__}"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(WriterOptions)}
    both = sorted(name for name, value in keywords.items() if value != defaults[name])
    if both:
        raise ConfigurationError(
            f"{', '.join(both)} given both as keyword and through writer_options: set "
            f"{'it' if len(both) == 1 else 'them'} in the WriterOptions only"
        )
    return given


def resolved_upsert_spec(
    mode: str,
    given: UpsertSpec | None,
    keys: Sequence[str] | None,
    sequence_by: str | Sequence[str] | None,
    delete_when: str | None,
    partial_updates: bool,
) -> UpsertSpec | None:
    """The upsert's spec: ``given``, or the one the keywords spell (``None`` unless
    ``mode="upsert"``).

    Raises:
        ConfigurationError: ``given`` without ``mode="upsert"``, together with an upsert
            keyword, or not an :class:`UpsertSpec`; or the keywords are invalid.
    """
    if given is None:
        return UpsertSpec.of(mode, keys, sequence_by, delete_when, partial_updates)
    if not isinstance(given, UpsertSpec):
        raise ConfigurationError(f"upsert must be an UpsertSpec, got {type(given).__name__}")
    if mode != "upsert":
        raise ConfigurationError(f"upsert=UpsertSpec(...) needs mode='upsert' (got mode={mode!r})")
    keywords = given_keywords(keys, sequence_by, delete_when, partial_updates)
    if keywords:
        raise ConfigurationError(
            f"{', '.join(keywords)} given both as keyword and through upsert=UpsertSpec(...): "
            "set them in the UpsertSpec only"
        )
    return given


def check_table_configuration(configuration: Mapping[str, str]) -> None:
    """Raises: ConfigurationError: properties of a table the sink would create that delta-rs,
    which creates it, cannot create."""
    if configuration.get(COLUMN_MAPPING_MODE, "none") != "none":
        raise ConfigurationError(
            "the sink cannot create a column-mapped table (delta-rs assigns physical names "
            "only when it creates the table empty). Create it first, e.g. "
            "deltalake.DeltaTable.create(uri, schema, configuration="
            "{'delta.columnMapping.mode': 'name'}), and the sink writes into it."
        )
    if uses_in_commit_timestamps(configuration):
        raise ConfigurationError(
            f"the sink cannot create a table with in-commit timestamps ({IN_COMMIT_TIMESTAMPS_KEY}"
            "): delta-rs, which creates tables, does not support them. Create it with "
            "delta-spark (CREATE TABLE ... TBLPROPERTIES ('delta.enableInCommitTimestamps' = "
            "'true')), and the sink writes into it."
        )
