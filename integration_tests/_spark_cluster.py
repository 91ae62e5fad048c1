"""A Spark standalone cluster of separate hosts, each a container of the locally built
``spark`` image on a network of its own: a master, two workers (one core each) and, for each
run, a driver; the S3 server (SeaweedFS) in another container on the same network.

Nothing is shared between the hosts but the network: the driver runs ``spark-submit`` with
the job's packed virtualenv (docs/deploy.md, Option 1: venv-pack, ``--archives
...#environment``; the driver's own copy is the same environment, unpacked into a directory
mounted in its container), the executors unpack the archive from the driver, the table and the
job's source live in S3, and the streaming checkpoint on a directory only the driver's
container mounts (as a driver machine's disk). The test process reaches S3 through the port
the server publishes on 127.0.0.1 and drives the containers through the Docker engine: kill a
worker, freeze one, kill the driver.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from committers.tests._spark_helpers import TEST_JVM_OPTIONS
from integration_tests._containers import container, new_container
from integration_tests._s3server import S3Server, seaweedfs_on_network

JOB = Path(__file__).with_name("_cluster_job.py")
WORKERS = ("worker-1", "worker-2")
_REGISTERED = b"Successfully registered with master"
# Executors that stop answering are given up after 20 s (Spark's default is 120 s).
_FAST_FAILURE = {
    "spark.network.timeout": "20s",
    "spark.network.timeoutInterval": "5s",
    "spark.executor.heartbeatInterval": "2s",
    "spark.task.maxFailures": "8",
}
#: Every JVM of the cluster (master, workers, executors, driver) compiles with C1 only and
#: collects with one thread: short runs on two shared cores spend less CPU that way.
_JVM_SETTINGS = {
    "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
}


@dataclass
class DriverRun:
    """How a driver's run ended: its exit code (None: killed by the test) and its output."""

    exit_code: int | None
    output: str


class SparkCluster:
    """The master, the workers and the S3 server, started by :func:`spark_cluster`."""

    def __init__(self, network: Any, s3: S3Server, environment: Path, pack: Path) -> None:
        self.network = network
        self.s3 = s3  # as the test process reaches it
        self.s3_inside = s3.endpoint.replace("127.0.0.1", "s3")  # as the hosts reach it
        self.environment = environment
        self.pack = pack
        self.workers: dict[str, Any] = {}

    def worker(self, hostname: str) -> Any:
        """The Docker container (docker-py) of the worker whose host name is ``hostname``."""
        for name, started in self.workers.items():
            wrapped = started.get_wrapped_container()
            wrapped.reload()
            if wrapped.attrs["Config"]["Hostname"] == hostname or name == hostname:
                return wrapped
        raise KeyError(f"no worker runs on host {hostname!r}")

    def ensure_workers(self, timeout: float = 90.0) -> None:
        """Every worker running and registered with the master (restarted if killed or
        unpaused if frozen by an earlier test)."""
        for started in self.workers.values():
            wrapped = started.get_wrapped_container()
            wrapped.reload()
            if wrapped.status == "paused":
                wrapped.unpause()
            elif wrapped.status != "running":
                before = wrapped.logs().count(_REGISTERED)
                wrapped.start()
                _wait_for_log(wrapped, _REGISTERED, before + 1, timeout)

    def start_driver(self, job_args: list[str], state: Path, env: dict[str, str]) -> Any:
        """A driver container running the job (``spark-submit``); returns it started."""
        submit = [
            "/opt/spark/bin/spark-submit",
            *("--master", "spark://master:7077"),
            *("--archives", "/pack/environment.tar.gz#environment"),
            *("--conf", "spark.pyspark.python=./environment/bin/python"),
            *("--conf", "spark.pyspark.driver.python=/opt/environment/bin/python"),
            *("--conf", "spark.driver.host=driver"),
            *("--conf", "spark.ui.enabled=false"),
            *("--conf", "spark.executor.memory=768m"),
            *("--conf", "spark.sql.shuffle.partitions=2"),
            *("--conf", f"spark.hadoop.fs.s3a.endpoint={self.s3_inside}"),
            *("--conf", "spark.hadoop.fs.s3a.path.style.access=true"),
            *("--conf", "spark.hadoop.fs.s3a.connection.ssl.enabled=false"),
            *("--conf", f"spark.hadoop.fs.s3a.access.key={self.s3.access_key}"),
            *("--conf", f"spark.hadoop.fs.s3a.secret.key={self.s3.secret_key}"),
            *(
                arg
                for key, value in {**_FAST_FAILURE, **_JVM_SETTINGS}.items()
                for arg in ("--conf", f"{key}={value}")
            ),
            "/job/cluster_job.py",
            *job_args,
        ]
        return new_container(
            "spark",
            entrypoint=submit[0],
            command=submit[1:],
            hostname="driver",
            env={
                "S3_ENDPOINT": self.s3_inside,
                "AWS_ACCESS_KEY_ID": self.s3.access_key,
                "AWS_SECRET_ACCESS_KEY": self.s3.secret_key,
                **env,
            },
            volumes=(
                (str(self.environment), "/opt/environment", "ro"),
                (str(self.pack), "/pack/environment.tar.gz", "ro"),
                (str(JOB), "/job/cluster_job.py", "ro"),
                (str(state), "/state", "rw"),
            ),
            network=self.network,
            aliases=("driver",),
        ).start()

    @contextlib.contextmanager
    def driver(
        self, job_args: list[str], state: Path, env: dict[str, str] | None = None
    ) -> Iterator[Any]:
        """A started driver container (see :meth:`start_driver`), removed on exit; the test
        acts on the cluster while it runs and ends it with :func:`finished`."""
        started = self.start_driver(job_args, state, env or {})
        try:
            yield started
        finally:
            started.stop()

    def run_driver(
        self, job_args: list[str], state: Path, env: dict[str, str] | None = None
    ) -> DriverRun:
        """Runs the job to its end (at most 10 minutes) and removes the driver's container."""
        with self.driver(job_args, state, env) as started:
            return finished(started)


def finished(driver: Any, timeout: float = 600.0) -> DriverRun:
    """The driver's exit code and output once it has ended (waiting at most ``timeout`` s)."""
    wrapped = driver.get_wrapped_container()
    code = wrapped.wait(timeout=timeout)["StatusCode"]
    return DriverRun(code, wrapped.logs().decode(errors="replace"))


def _wait_for_log(wrapped: Any, line: bytes, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if wrapped.logs().count(line) >= count:
            return
        time.sleep(0.5)
    tail = wrapped.logs()[-3000:].decode(errors="replace")
    raise RuntimeError(f"{wrapped.name} did not log {line!r} within {timeout:.0f} s:\n{tail}")


def unpack(pack: Path, into: Path) -> Path:
    """The packed environment unpacked into ``into`` (the driver's copy)."""
    into.mkdir(parents=True)
    subprocess.run(["tar", "-xzf", str(pack), "-C", str(into)], check=True)
    return into


@contextlib.contextmanager
def spark_cluster(pack: Path, environment: Path) -> Iterator[SparkCluster]:
    """The cluster, up and registered, removed (containers and network) on exit.

    Raises:
        RuntimeError: an image is missing (``make images``) or a node did not come up.
    """
    from testcontainers.core.network import Network

    with (
        Network() as network,
        seaweedfs_on_network(network, alias="s3") as (s3, _),
        container(
            "spark",
            command=["org.apache.spark.deploy.master.Master", "--host", "master"],
            env={"SPARK_DAEMON_JAVA_OPTS": TEST_JVM_OPTIONS},
            hostname="master",
            network=network,
            aliases=("master",),
        ),
        contextlib.ExitStack() as workers,
    ):
        cluster = SparkCluster(network, s3, environment, pack)
        for name in WORKERS:
            cluster.workers[name] = workers.enter_context(
                container(
                    "spark",
                    command=[
                        "org.apache.spark.deploy.worker.Worker",
                        *("spark://master:7077", "--cores", "1", "--memory", "1g"),
                        *("--host", name),
                    ],
                    env={"SPARK_DAEMON_JAVA_OPTS": TEST_JVM_OPTIONS},
                    hostname=name,
                    network=network,
                    aliases=(name,),
                )
            )
        for started in cluster.workers.values():
            _wait_for_log(started.get_wrapped_container(), _REGISTERED, 1, 90.0)
        yield cluster
