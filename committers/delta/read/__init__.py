"""A Delta table as an input, on ``framework.source``: a pinned snapshot as a bounded file
source, the log's appends as an unbounded one, and which schemas a stream may read. It may
import ``framework`` (``framework.spark`` only through its connector API),
``committers.delta.storage`` and ``committers.delta.table``; it imports no pyspark itself."""
