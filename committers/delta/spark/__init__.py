"""Everything of the Delta connector that runs Spark jobs: Spark's own Parquet writer as a
stager, the Python rewrite tasks (compaction groups, ``replace_where`` rewrites, upsert
rewrites), and the planning and staging of upserts. It may import pyspark, ``framework``
(``framework.spark`` through its connector API) and the layers below it: ``storage``,
``table``, ``read`` and ``write``; not ``commit`` or anything above."""
