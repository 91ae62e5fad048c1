"""The task side of a write: the sink's validated options, the committables a staging task
reports (one per staged file), and the Arrow writer that turns batches into large Parquet files
with their statistics and manifests. It may import ``framework`` (pyspark-free parts),
``committers.delta.storage`` and ``committers.delta.table``; never pyspark."""
