"""A Spark standalone cluster on this machine whose workers have distinct host names.

Speculative execution never launches a copy of a task on a host that already runs an attempt
of it (``TaskSetManager`` checks the host, not the executor), so ``local`` and
``local-cluster`` masters, whose executors all share one host, can never speculate. Here each
worker binds its own loopback address (127.0.0.2, 127.0.0.3, ...: Linux routes all of
127.0.0.0/8 to the loopback device), which makes them different hosts to the scheduler.

The master and the workers are JVMs started with pyspark's own ``bin/spark-class``; every
wait is bounded, and :meth:`StandaloneCluster.stop` kills them (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from committers.tests._spark_helpers import TEST_JVM_OPTIONS

_START_TIMEOUT = 60.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


@dataclass
class StandaloneCluster:
    """Handle on a running cluster: ``master_url`` for ``SparkSession.builder.master``."""

    master_url: str
    workers: int
    logs: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(_spark_home() / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own process group: stop() kills the JVM's children
        )


def _wait_for(log: Path, text: str, count: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        content = log.read_text(errors="replace") if log.exists() else ""
        if content.count(text) >= count:
            return
        if process.poll() is not None:
            raise RuntimeError(f"{log.name} exited early:\n{content[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{log.name} did not show {text!r} {count}x within {_START_TIMEOUT}s")


@contextmanager
def standalone_cluster(workdir: Path, workers: int = 2) -> Iterator[StandaloneCluster]:
    """Start a master on 127.0.0.1 and ``workers`` one-core, 1 GiB workers on 127.0.0.2, ...
    and stop them all on exit."""
    env = {
        **os.environ,
        "SPARK_HOME": str(_spark_home()),
        "SPARK_NO_DAEMONIZE": "1",
        "SPARK_DAEMON_JAVA_OPTS": TEST_JVM_OPTIONS,  # the master's and workers' JVMs
    }
    env.pop("SPARK_LOCAL_IP", None)  # each process binds the host it is given
    port = _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    cluster = StandaloneCluster(master_url, workers, workdir)
    try:
        master_log = workdir / "master.log"
        master = _start(
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", str(port), "--webui-port", "0"),
            ],
            master_log,
            env,
        )
        cluster.processes.append(master)
        _wait_for(master_log, "I have been elected leader", 1, master)
        for index in range(workers):
            host = f"127.0.0.{index + 2}"
            cluster.processes.append(
                _start(
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        *("--host", host, "--cores", "1", "--memory", "1g"),
                        *("--webui-port", "0", "--work-dir", str(workdir / f"worker-{index}")),
                        master_url,
                    ],
                    workdir / f"worker-{index}.log",
                    {**env, "SPARK_LOCAL_IP": host},
                )
            )
        _wait_for(master_log, "Registering worker", workers, master)
        yield cluster
    finally:
        cluster.stop()
