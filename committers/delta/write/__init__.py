"""The task side of a write: the sink's validated options (:class:`WriterOptions`, and
:class:`UpsertSpec` for ``mode="upsert"``), the committables a staging task reports (one per
staged file), and the Arrow writer that turns batches into large Parquet files with their
statistics and manifests. It may import ``framework`` (pyspark-free parts),
``committers.delta.storage`` and ``committers.delta.table``; never pyspark.

Published here: the option values a :class:`~committers.delta.DeltaSink` accepts as objects.
"""

from committers.delta.write._auto_compact import AutoCompact
from committers.delta.write._options import WriterOptions
from committers.delta.write._upsert_spec import UpsertSpec

__all__ = ["AutoCompact", "UpsertSpec", "WriterOptions"]
