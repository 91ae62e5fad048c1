"""The change data feed (PROTOCOL.md, "Change Data Files", "Add CDC File"): which tables want
change files, and how they are laid out.

A table with ``delta.enableChangeDataFeed=true`` records what each commit changed. Adds and
removes say it for commits that add or remove whole files (appends, overwrites of whole
files): readers derive ``insert`` rows from added files and ``delete`` rows from removed ones.
A commit that rewrites files (an upsert, a ``replace_where`` on data columns) must write
*change files* instead: Parquet files under ``_change_data/`` holding the changed rows with a
``_change_type`` column, each logged by a ``cdc`` action with ``dataChange: false``. When a
commit has ``cdc`` actions, readers take its changes from them alone, so every change of that
commit (its inserted rows too) must be in them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = [
    "CHANGE_DATA_DIR",
    "CHANGE_DATA_FEED",
    "CHANGE_TYPE",
    "DELETE",
    "INSERT",
    "UPDATE_POSTIMAGE",
    "UPDATE_PREIMAGE",
    "writes_change_data",
]

#: The table property that turns the change data feed on.
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"
#: Where change files live, below the table root (readers skip ``_`` directories for data).
CHANGE_DATA_DIR = "_change_data"
#: The column of a change file naming the kind of change of each row.
CHANGE_TYPE = "_change_type"
INSERT = "insert"
DELETE = "delete"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"


def writes_change_data(configuration: Mapping[str, str | None] | Iterable[tuple[str, str]]) -> bool:
    """Whether a table of this ``configuration`` (its ``metaData.configuration``) records
    its changes: a rewrite of its files must then write change files."""
    pairs = configuration.items() if isinstance(configuration, Mapping) else configuration
    return any(key == CHANGE_DATA_FEED and str(value).lower() == "true" for key, value in pairs)
