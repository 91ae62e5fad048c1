"""What a connector needs from the engine-agnostic core, beyond ``framework.sink`` and
``framework.source``, published in one place.

:func:`crash_point` marks a step where the crash-point campaign may kill the process (see
``docs/reliability.md``), and :func:`crash_with_workers` lets a crash in a Python worker take its
driver down too; :func:`check_row_count` compares the rows the files to commit hold
with the rows the write job wrote (raising :class:`~framework.errors.RowCountMismatchError`);
:func:`refuse_unknown_options` refuses keyword arguments a sink does not have, saying what to use
instead.
The Spark side of a connector's needs is :mod:`framework.spark.connector`. Importing this
module does not import pyspark. A change to this list is a change of the framework's API
(pinned by ``framework/tests/test_core.py``).
"""

from framework._crash import crash_point, crash_with_workers
from framework._foreign_options import refuse_unknown_options
from framework._row_count import check_row_count

__all__ = ["check_row_count", "crash_point", "crash_with_workers", "refuse_unknown_options"]
