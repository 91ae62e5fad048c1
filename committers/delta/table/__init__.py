"""What a Delta table is, read through delta-rs: the Delta schema and its Arrow and Spark
mappings, protocol and writer features, the rules every written row and file must meet, file
statistics, snapshots, file skipping, the ``replace_where`` predicate, opening and creating a
table, and a clean interpreter exit after delta-rs reads. It may import ``framework``
(pyspark-free parts) and ``committers.delta.storage``; never pyspark."""
