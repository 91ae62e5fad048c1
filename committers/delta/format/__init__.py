"""The ``"deltalake"`` Spark format (reads through Spark's Python Data Source API, writes
through :class:`~committers.delta.DeltaSink`) and :func:`~committers.delta.read_table`. It sits
above the sink: it may import pyspark, ``framework`` and every other layer of the connector,
except ``inspect``."""
