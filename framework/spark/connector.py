"""What a connector needs from the Spark runtime, published in one place.

A destination or source built on this framework (``committers.delta`` is one) imports the Spark
side of the framework from here, never from the private ``framework.spark._*`` modules, which
may change shape freely. Everything below keeps its name and meaning across releases; a change
to this list is a change of the framework's API (pinned by ``framework/tests/test_core.py``).

Writing:
    :func:`apply_input_plan` shapes a DataFrame by a sink's :class:`~framework.sink.InputPlan`
    (casts, renames, row checks as Spark expressions); :func:`arrow_schema_of` is the Arrow
    schema a sink is prepared with for rows of a Spark schema; :class:`SparkStager` and
    :class:`StagesWithSpark` let a sink stage a batch with Spark's own writers;
    :class:`PlansEachBatch` lets a sink plan each batch's rows right before it is staged;
    :class:`SinkBatchWriter` / :class:`SinkStreamWriter` run a sink behind
    ``df.write.format(...)`` / ``df.writeStream.format(...)``.
Running Spark jobs for a sink:
    :func:`staging_job_group` names the job group of a sink's tasks and
    :func:`wait_for_tasks_to_end` waits until none of them runs any more (so nothing writes
    after a failure is reported); :func:`translate_task_error` turns a failed task's Java
    exception back into the sink's own :class:`~framework.errors.SinkError`;
    :func:`parquet_files` reads a list of Parquet files with Spark's scan (no directory
    listing; no listing at all where their sizes are known); :func:`compiled_class` and
    :func:`new_instance` compile a small Java class at run time (for work a py4j call per item
    would make slow); :func:`is_connect_dataframe` tells a Spark Connect DataFrame from a
    classic one.
Reading:
    :func:`register_data_source` registers a Python data source; :class:`BoundedSourceReader`
    reads a :class:`~framework.source.FileGroupSource` in Spark tasks;
    :class:`FileStreamReader` streams what a :class:`FileDiscovery` finds, each micro-batch
    bounded by an :class:`AdmissionLimit`.

Importing this module imports pyspark.
"""

from framework.spark._errors import translate_task_error
from framework.spark._files import parquet_files
from framework.spark._format_writer import SinkBatchWriter, SinkStreamWriter
from framework.spark._janino import compiled_class, new_instance
from framework.spark._native import (
    PlansEachBatch,
    SparkStager,
    StagesWithSpark,
    is_connect_dataframe,
)
from framework.spark._plan import apply_input_plan
from framework.spark._quiesce import staging_job_group, wait_for_tasks_to_end
from framework.spark._source import BoundedSourceReader, register_data_source
from framework.spark._stream_source import AdmissionLimit, FileDiscovery, FileStreamReader
from framework.spark._two_phase import arrow_schema_of

__all__ = [
    "AdmissionLimit",
    "BoundedSourceReader",
    "FileDiscovery",
    "FileStreamReader",
    "PlansEachBatch",
    "SinkBatchWriter",
    "SinkStreamWriter",
    "SparkStager",
    "StagesWithSpark",
    "apply_input_plan",
    "arrow_schema_of",
    "compiled_class",
    "is_connect_dataframe",
    "new_instance",
    "parquet_files",
    "register_data_source",
    "staging_job_group",
    "translate_task_error",
    "wait_for_tasks_to_end",
]
