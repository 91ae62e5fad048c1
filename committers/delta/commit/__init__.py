"""Everything that writes the Delta log: the global committer (one idempotent transaction per
epoch for appends, overwrites and upserts), compaction's ``dataChange=false`` commit, and
VACUUM. It may import ``framework`` and every layer below it (``storage``, ``table``, ``read``,
``write``, ``spark``); nothing above (the sink, the format, the CLI)."""
