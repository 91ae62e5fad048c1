"""Everything that writes the Delta log: the one commit sequence every delta-rs commit runs
through (``_sequence``), the global committer (one idempotent transaction per epoch for
appends, overwrites and upserts), the blind-append writer with its incremental view of
the log, checkpoints, expired-log clean-up and (on object stores) the batches' staging
clean-up off the commit path, compaction's
``dataChange=false`` commit, and VACUUM. It may import ``framework`` and every layer below it
(``storage``, ``table``, ``read``, ``write``, ``spark``); nothing above (the sink, the format,
the CLI)."""
