"""The tests' servers in containers, through testcontainers-python, from the images that
``make images`` (``tools/containers.py``) built on this machine; nothing is pulled.

:func:`image` says whether an image can be used (an engine answers and the image is built for
the current inputs); where it cannot, the callers run the same server as a local process and
:func:`servers_report` says which ran. Containers carry the label ``sparksink.test`` with the
process that started them, and are removed when their context exits; those of a process that
died first (a test run killed) are removed by :func:`remove_orphaned_containers`, which the
test session runs at its start. (Ryuk, testcontainers' own reaper, is off: its image comes from
Docker Hub.)
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Read by testcontainers when it first starts a container: set before anything imports it.
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")

from committers.tests._jars import tool
from committers.tests._spark_helpers import TEST_JVM_OPTIONS

__all__ = [
    "ContainerBroker",
    "container",
    "freeze",
    "image",
    "new_container",
    "remove_orphaned_containers",
    "servers_report",
]

LABEL = "sparksink.test"
# SINK_TEST_CONTAINERS=0 runs every server as a local process even where images exist.
_SWITCH = "SINK_TEST_CONTAINERS"


@functools.cache
def image(name: str) -> str | None:
    """The tag of the locally built image ``name`` when containers are to be used, else None."""
    if os.environ.get(_SWITCH, "1") == "0":
        return None
    return tool("containers").built_image(name)


def servers_report() -> str:
    """One line: which servers the tests run in containers and which as local processes."""
    containers = tool("containers")
    if os.environ.get(_SWITCH, "1") == "0":
        return f"test servers: local processes ({_SWITCH}=0)"
    if not containers.engine_answers():
        return "test servers: local processes (no Docker engine answers; `make images` starts one)"
    parts = []
    for name, what in (("seaweedfs", "S3"), ("kafka", "Kafka"), ("spark", "Spark cluster")):
        tag = image(name)
        parts.append(f"{what} {'in container ' + tag if tag else 'as local process'}")
    return "test servers: " + ", ".join(parts) + " (images: `make images`)"


def new_container(
    name: str,
    *,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    ports: dict[int, tuple[str, int | None]] | None = None,
    volumes: tuple[tuple[str, str, str], ...] = (),
    network: Any = None,
    aliases: tuple[str, ...] = (),
    **docker_run: Any,
) -> Any:
    """An unstarted testcontainers ``DockerContainer`` of the image ``name``, labelled for
    clean-up; ``ports`` maps a container port to a (host address, host port or None) pair;
    ``docker_run`` goes to ``docker run`` (network_mode, tmpfs, ...).

    Raises:
        RuntimeError: the image is not built (run ``make images``).
    """
    from testcontainers.core.container import DockerContainer

    tag = image(name)
    if tag is None:
        raise RuntimeError(f"no {name} image: run `make images` (needs a Docker engine)")
    made = DockerContainer(tag).with_kwargs(labels={LABEL: str(os.getpid())}, **docker_run)
    if command is not None:
        made = made.with_command(command)
    made = made.with_envs(**(env or {}))
    for port, host in (ports or {}).items():
        # with_bind_ports takes no host address; docker-py's (address, port) pair keeps the
        # published port on 127.0.0.1.
        made.ports[f"{port}/tcp"] = host
    for volume in volumes:
        made = made.with_volume_mapping(*volume)
    if network is not None:
        made = made.with_network(network).with_network_aliases(*aliases)
    return made


@contextlib.contextmanager
def container(name: str, **settings: Any) -> Iterator[Any]:
    """A started container (see :func:`new_container`), removed on exit."""
    started = new_container(name, **settings).start()
    try:
        yield started
    finally:
        with contextlib.suppress(Exception):
            started.stop()


def freeze(wrapped: Any, timeout: float = 60.0) -> None:
    """Pauses the docker-py container ``wrapped`` (``docker pause``: every process in it
    stopped by the cgroup freezer, its sockets still open), retried until it takes.

    runc gives a cgroup v1 freezer well under a second to settle and then fails with "unable
    to freeze" and thaws again; a JVM with many threads on a loaded machine can take longer.
    Each failed attempt leaves the container running, so retrying is safe.

    Raises:
        docker.errors.APIError: the container could not be frozen within ``timeout`` seconds.
    """
    from docker.errors import APIError

    deadline = time.monotonic() + timeout
    while True:
        try:
            wrapped.pause()
            return
        except APIError as error:
            if "unable to freeze" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def remove_orphaned_containers() -> int:
    """Removes the test containers whose starting process is gone; returns how many."""
    containers = tool("containers")
    if not containers.engine_answers():
        return 0
    listed = containers.docker(
        "ps",
        "-a",
        "--filter",
        f"label={LABEL}",
        "--format",
        f'{{{{.ID}}}} {{{{.Label "{LABEL}"}}}}',
    )
    orphans = []
    for line in listed.stdout.splitlines():
        container_id, _, pid = line.partition(" ")
        if not pid.isdigit() or not Path(f"/proc/{pid}").exists():
            orphans.append(container_id)
    if orphans:
        containers.docker("rm", "-f", *orphans)
    return len(orphans)


class ContainerBroker:
    """A Kafka broker (KRaft) in a container of the ``kafka`` image, with the interface of
    ``tools/kafka_broker.py``'s ``LocalBroker``: ``start`` (again after ``kill``, with the
    same data and port), ``stop``, ``kill`` (``docker kill``: SIGKILL), ``bootstrap``."""

    _READY = b"Transition from STARTING to STARTED"
    _START_TIMEOUT = 90.0

    def __init__(self, directory: Path, *, partitions: int = 3) -> None:
        from integration_tests._s3server import free_port

        self.directory = Path(directory)
        self.port = free_port()
        self.partitions = partitions
        self._container: Any = None
        self._starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ContainerBroker:
        """Starts (or restarts) the broker and waits until it serves requests.

        Raises:
            RuntimeError: no image, or the broker did not come up within 90 s (its log says why).
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._container is None:
            self._container = new_container(
                "kafka",
                env={
                    "ADVERTISED": self.bootstrap,
                    "PARTITIONS": str(self.partitions),
                    # C1 and a serial collector: less CPU on the suite's two shared cores.
                    "JAVA_TOOL_OPTIONS": TEST_JVM_OPTIONS,
                },
                ports={9092: ("127.0.0.1", self.port)},
            ).start()
        else:
            self._container.get_wrapped_container().start()
        self._starts += 1
        deadline = time.monotonic() + self._START_TIMEOUT
        while time.monotonic() < deadline:
            logs = self._container.get_wrapped_container().logs()
            if logs.count(self._READY) >= self._starts:
                return self
            time.sleep(0.2)
        tail = self._container.get_wrapped_container().logs()[-3000:].decode(errors="replace")
        raise RuntimeError(f"the Kafka container did not start within 90 s:\n{tail}")

    def kill(self) -> None:
        """Kills the broker at once (SIGKILL to the container), as a crash would."""
        if self._container is not None:
            self._container.get_wrapped_container().kill()

    def stop(self) -> None:
        """Stops and removes the container (its data goes with it)."""
        if self._container is not None:
            (self.directory / "broker.log").write_bytes(
                self._container.get_wrapped_container().logs()
            )
            self._container.stop()
            self._container = None
