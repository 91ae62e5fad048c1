"""A single-node Kafka broker on 127.0.0.1 (KRaft mode: broker and controller in one JVM, no
ZooKeeper), for the tests and ``make kafka-demo``.

    python tools/kafka_broker.py [--port 9092] [--partitions 3]   # runs until Ctrl-C

The broker's jars come from ``tools/jars.py`` (``make jars``); it runs with ``java`` from
``PATH`` (Java 17 or newer) in a process group of its own, with its log directory and its
``broker.log`` under a directory of the caller's. Topics are created on first use with
``partitions`` partitions (``auto.create.topics.enable``), or with :meth:`LocalBroker.create_topic`.

:class:`LocalBroker` starts it (formatting the log directory the first time), waits until it
serves requests, and stops it by its process id: gracefully (:meth:`LocalBroker.stop`), or by
``SIGKILL`` (:meth:`LocalBroker.kill`), after which :meth:`LocalBroker.start` brings it back
on the same ports with the same data, as a crashed broker restarts.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

__all__ = ["BrokerError", "LocalBroker"]

_READY = "Transition from STARTING to STARTED"
_START_TIMEOUT = 90.0
_STOP_TIMEOUT = 30.0


class BrokerError(Exception):
    """The broker could not be started; the message says why and where its log is."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalBroker:
    """One broker process; ``bootstrap`` is its ``host:port`` for clients."""

    def __init__(
        self,
        jars: Path,
        directory: Path,
        *,
        port: int | None = None,
        partitions: int = 3,
        heap: str = "384m",
    ) -> None:
        self.jars = Path(jars)
        self.directory = Path(directory)
        self.port = port or _free_port()
        self.controller_port = _free_port()
        self.partitions = partitions
        self.heap = heap
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.directory / "broker.log"

    def _properties(self) -> Path:
        path = self.directory / "server.properties"
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.controller_port}",
            "listeners": (
                f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}"
            ),
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.directory / "data"),
            "num.partitions": str(self.partitions),
            "auto.create.topics.enable": "true",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Records are kept: a restarted stream must find every offset it has not read.
            "log.retention.ms": "-1",
        }
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def _java(self, main: str, *arguments: str) -> list[str]:
        classpath = os.path.join(str(self.jars), "*")
        return ["java", f"-Xmx{self.heap}", "-cp", classpath, main, *arguments]

    def start(self) -> LocalBroker:
        """Starts the broker (formatting its log directory the first time) and waits until it
        serves requests.

        Raises:
            BrokerError: no ``java``, no jars, the format failed, or the broker did not come up
                within 90 s (it is killed then; its log says why).
        """
        if self.process is not None and self.process.poll() is None:
            return self
        if not any(self.jars.glob("kafka_2.13-*.jar")):
            raise BrokerError(f"no Kafka broker jars in {self.jars}: run `make jars`")
        self.directory.mkdir(parents=True, exist_ok=True)
        properties = self._properties()
        if not (self.directory / "data" / "meta.properties").exists():
            cluster = uuid.uuid4().hex[:22]
            formatted = subprocess.run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    "--standalone",
                    "-t",
                    cluster,
                    "-c",
                    str(properties),
                ),
                capture_output=True,
                text=True,
            )
            if formatted.returncode != 0:
                raise BrokerError(
                    f"formatting the broker's log directory failed:\n"
                    f"{formatted.stdout[-2000:]}{formatted.stderr[-2000:]}"
                )
        offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                self._java("kafka.Kafka", str(properties)),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own group: a killed test run does not orphan it
            )
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(
                    f"the broker exited with {self.process.returncode}; see {self.log_file}"
                )
            with open(self.log_file, "rb") as log:
                log.seek(offset)
                if _READY.encode() in log.read():
                    return self
            time.sleep(0.2)
        self.kill()
        raise BrokerError(
            f"the broker did not start within {_START_TIMEOUT:.0f} s; see {self.log_file}"
        )

    def stop(self) -> None:
        """Stops the broker gracefully (SIGTERM), or kills it after 30 s."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """Kills the broker at once (SIGKILL to its process group), as a crash would."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=9092)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--directory", default="build/kafka-broker")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from jars import JarsError, fetch_broker

    try:
        jars = fetch_broker(lambda line: print(line, file=sys.stderr))
        broker = LocalBroker(
            jars, Path(args.directory), port=args.port, partitions=args.partitions
        ).start()
    except (JarsError, BrokerError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(
        f"Kafka broker at {broker.bootstrap} (log: {broker.log_file}); Ctrl-C stops it",
        file=sys.stderr,
    )
    try:
        while broker.process is not None and broker.process.poll() is None:
            time.sleep(1)
    except KeyboardInterrupt:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
