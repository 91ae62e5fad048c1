"""The jars `make jars` cached (``tools/jars.py``): delta-spark, hadoop-aws and Spark's Kafka
source for the test session and for test drivers run as their own processes, and the Kafka
broker's."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

# delta-spark beside the sink, in the session's one JVM (its jars come from `make jars`).
DELTA_SPARK_CONFIGS = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # delta-spark rebuilds a snapshot's state in 50 partitions by default: 2 cores here.
    "spark.databricks.delta.snapshotPartitions": "2",
    # ... and lists the files of a VACUUM in 10,000 tasks (95 s for a table of ten files).
    "spark.sql.sources.parallelPartitionDiscovery.parallelism": "2",
}

_TOOLS = Path(__file__).resolve().parents[2] / "tools"


def local_jar_configs(jars: list[str]) -> dict[str, str]:
    """The settings that put ``jars`` on a local-mode session's class path.

    Not ``spark.jars``: that copies every jar (about 700 MB with the AWS SDK bundle) into the
    session's temporary directory, which a killed driver never deletes, so the crash tests
    filled the disk. In local mode the executors run in the driver's JVM, so the driver's
    class path is enough, and nothing is copied."""
    return {"spark.driver.extraClassPath": os.pathsep.join(jars)} if jars else {}


def tool(name: str) -> Any:
    """The module ``tools/<name>.py`` (tools/ is not a package), loaded once."""
    module_name = f"_sparksink_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, _TOOLS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def fetched_jars() -> tuple[list[str], str | None]:
    """The delta-spark, hadoop-aws and Kafka source jars `make jars` cached for the installed
    pyspark, or the reason they are missing (what to run)."""
    jars = tool("jars")
    try:
        return [str(jar) for jar in jars.cached_jars(jars.installed_jar_set())], None
    except jars.JarsError as missing:
        return [], str(missing)


def broker_jars() -> tuple[Path | None, str | None]:
    """The Kafka broker's jar directory `make jars` cached, or the reason it is missing."""
    jars = tool("jars")
    directory = jars.broker_directory()
    if (directory / jars.STAMP).is_file():
        return directory, None
    return None, f"the Kafka broker's jars are not in {directory}: run `make jars`"
