"""A small HTTP proxy on 127.0.0.1 that injects S3 faults in front of a real S3 server.

For a set fraction of PUT and GET requests (a deterministic sequence drawn from ``seed``: the
n-th eligible request gets the same fault whatever the order in which concurrent clients send
them) it answers with one of:

* ``slowdown``: 503 with an S3 ``SlowDown`` error body; the request is not forwarded;
* ``internal``: 500 with an S3 ``InternalError`` body; not forwarded;
* ``drop_before``: resets the connection without forwarding (the request never lands);
* ``drop_after``: forwards the request, then resets the connection instead of answering
  (the request DID land; the client cannot know).

Gateway impersonations: ``ignore_if_none_match=True`` removes ``If-None-Match`` from PUTs and
re-signs them (SigV4, with the credentials given), so the server overwrites an existing key
instead of answering 412; ``reject_if_none_match=True`` answers such PUTs ``501``.

The proxy runs in its own process: delta-rs holds the GIL during some blocking calls (e.g.
``DeltaTable.is_deltatable``), which would stall a proxy thread in the test process. The parent
controls it through a private path (``/__fault_proxy__/...``, not a valid bucket name). Every
socket has a timeout; :meth:`FaultProxy.stop` ends the process (SIGTERM, then SIGKILL).

Run standalone (e.g. in front of the docker compose MinIO)::

    python -m integration_tests._fault_proxy '{"upstream": "http://127.0.0.1:9000",
                                               "fault_rate": 0.1}'
"""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import re
import select
import socket
import struct
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

__all__ = ["FAULT_KINDS", "FaultProxy", "fault_proxy"]

FAULT_KINDS = ("slowdown", "internal", "drop_before", "drop_after")

_CONTROL = "/__fault_proxy__/"
_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)
_SOCKET_TIMEOUT = 30.0
_START_TIMEOUT = 30.0
_MAX_BODY = 512 * 1024 * 1024
_ERROR_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>{code}</Code><Message>{message}</Message>"
    "<RequestId>fault-proxy</RequestId></Error>"
)


class FaultProxy:
    """Handle on a fault-injecting proxy process; a context manager, or start()/stop().

    Args:
        upstream: base URL of the real S3 server (``http://host:port``).
        fault_rate: fraction (0..1) of eligible requests that get a fault.
        seed: seed of the fault sequence.
        methods: HTTP methods eligible for faults.
        kinds: fault kinds to draw from (uniformly).
        cycle_kinds: inject the kinds in turn instead of drawing them, so that any
            ``len(kinds)`` consecutive faults include every kind.
        path_pattern: if given, only requests whose path matches this regex get faults.
        max_faults: stop injecting after this many faults (``None``: no limit).
        ignore_if_none_match: strip ``If-None-Match`` from PUTs (needs the credentials).
        reject_if_none_match: answer PUTs carrying ``If-None-Match`` with 501.
        access_key, secret_key, region: used only to re-sign stripped requests.
        key_expiry: access key id -> Unix time from which requests signed with it are refused
            with ``400 ExpiredToken``, as S3 answers an expired STS session (counted as the
            fault kind ``expired``).
    """

    def __init__(
        self,
        upstream: str,
        *,
        fault_rate: float = 0.0,
        seed: int = 0,
        methods: Sequence[str] = ("PUT", "GET"),
        kinds: Sequence[str] = FAULT_KINDS,
        cycle_kinds: bool = False,
        path_pattern: str | None = None,
        max_faults: int | None = None,
        ignore_if_none_match: bool = False,
        reject_if_none_match: bool = False,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = "us-east-1",
        key_expiry: dict[str, float] | None = None,
    ) -> None:
        self.config: dict[str, Any] = {
            "upstream": upstream,
            "fault_rate": float(fault_rate),
            "seed": seed,
            "methods": [m.upper() for m in methods],
            "kinds": list(kinds),
            "cycle_kinds": cycle_kinds,
            "path_pattern": path_pattern,
            "max_faults": max_faults,
            "ignore_if_none_match": ignore_if_none_match,
            "reject_if_none_match": reject_if_none_match,
            "access_key": access_key,
            "secret_key": secret_key,
            "region": region,
            "key_expiry": dict(key_expiry or {}),
        }
        _ProxyCore(self.config)  # validate here, in the caller's process
        self._process: subprocess.Popen[bytes] | None = None
        self._endpoint: str | None = None
        self._final: dict[str, Counter[str]] | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>`` (kept after :meth:`stop`, for messages)."""
        assert self._endpoint is not None, "proxy not started"
        return self._endpoint

    def start(self) -> FaultProxy:
        root = str(Path(__file__).resolve().parents[1])
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD_MAIN, root],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._process = process
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(self.config).encode())
        process.stdin.close()  # config travels on stdin, never on the command line
        ready, _, _ = select.select([process.stdout], [], [], _START_TIMEOUT)
        line = process.stdout.readline().decode() if ready else ""
        if not line.startswith("LISTENING "):
            self.stop()
            raise RuntimeError(f"fault proxy did not start (got {line!r})")
        self._endpoint = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def _control(self, path: str, payload: dict[str, Any] | None = None) -> dict[str, Any]:
        parsed = urlparse(self.endpoint)
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=10)
        try:
            body = json.dumps(payload).encode() if payload is not None else None
            conn.request("POST" if body else "GET", _CONTROL + path, body=body)
            response = conn.getresponse()
            data: dict[str, Any] = json.loads(response.read() or b"{}")
            return data
        finally:
            conn.close()

    def set_fault_rate(self, rate: float) -> None:
        """Change the fault rate of the running proxy (e.g. 0 while setting up)."""
        self._control("config", {"fault_rate": float(rate)})

    def _stats(self) -> dict[str, Counter[str]]:
        if self._final is not None:
            return self._final
        raw = self._control("stats")
        return {name: Counter(raw[name]) for name in ("requests", "faults")}

    @property
    def requests(self) -> Counter[str]:
        """Requests seen, per HTTP method (control requests excluded)."""
        return self._stats()["requests"]

    @property
    def faults(self) -> Counter[str]:
        """Faults injected, per kind."""
        return self._stats()["faults"]

    def stop(self) -> None:
        """Stop the proxy process; counters stay readable afterwards."""
        process, self._process = self._process, None
        if process is None:
            return
        if self._endpoint is not None and process.poll() is None:
            with contextlib.suppress(Exception):
                self._final = self._stats()
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def fault_proxy(upstream: str, **kwargs: Any) -> Iterator[FaultProxy]:
    """Run a :class:`FaultProxy` for the duration of the context."""
    proxy = FaultProxy(upstream, **kwargs)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


_CHILD_MAIN = """
import sys
sys.path.insert(0, sys.argv[1])
from integration_tests._fault_proxy import _serve
_serve(sys.stdin.read())
"""


# -- the proxy itself (runs in the child process) ----------------------------------------------


class _ProxyCore:
    """Configuration, fault decisions and counters of one proxy."""

    def __init__(self, config: dict[str, Any]) -> None:
        parsed = urlparse(config["upstream"])
        if parsed.scheme != "http" or not parsed.hostname:
            raise ValueError(f"upstream must be an http:// URL, got {config['upstream']!r}")
        unknown = set(config["kinds"]) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
        if config["ignore_if_none_match"] and not (config["access_key"] and config["secret_key"]):
            raise ValueError("ignore_if_none_match needs access_key and secret_key to re-sign")
        self.upstream_host = parsed.hostname
        self.upstream_port = parsed.port or 80
        self.methods = frozenset(config["methods"])
        self.kinds: tuple[str, ...] = tuple(config["kinds"])
        self.cycle_kinds = bool(config.get("cycle_kinds", False))
        pattern = config["path_pattern"]
        self.path_pattern = re.compile(pattern) if pattern else None
        self.max_faults = config["max_faults"]
        self.ignore_if_none_match = bool(config["ignore_if_none_match"])
        self.reject_if_none_match = bool(config["reject_if_none_match"])
        self.access_key = config["access_key"]
        self.secret_key = config["secret_key"]
        self.region = config["region"]
        self.key_expiry: dict[str, float] = dict(config.get("key_expiry") or {})
        self.fault_rate = float(config["fault_rate"])
        self.rng = random.Random(config["seed"])
        self.lock = threading.Lock()
        self.requests: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()

    def draw(self, method: str, path: str) -> str | None:
        with self.lock:
            self.requests[method] += 1
            if method not in self.methods or self.fault_rate <= 0:
                return None
            if self.path_pattern is not None and not self.path_pattern.search(path):
                return None
            if self.max_faults is not None and sum(self.faults.values()) >= self.max_faults:
                return None
            if self.rng.random() >= self.fault_rate:
                return None
            if self.cycle_kinds:
                kind = self.kinds[sum(self.faults.values()) % len(self.kinds)]
            else:
                kind = self.rng.choice(self.kinds)
            self.faults[kind] += 1
            return kind

    def expired(self, authorization: str | None) -> bool:
        """Whether a request signed as ``authorization`` (a SigV4 header) uses an expired key."""
        found = _CREDENTIAL.search(authorization or "")
        expiry = self.key_expiry.get(found.group(1)) if found else None
        if expiry is None or time.time() < expiry:
            return False
        with self.lock:
            self.faults["expired"] += 1
        return True

    def stats(self) -> dict[str, dict[str, int]]:
        with self.lock:
            return {"requests": dict(self.requests), "faults": dict(self.faults)}

    def resign(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> list[tuple[str, str]]:
        """Re-sign a request with SigV4 after its headers changed (keeps its payload hash)."""
        from botocore.auth import S3SigV4Auth, SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        class _KeepPayloadHash(S3SigV4Auth):
            def _modify_request_before_signing(self, request: Any) -> None:
                SigV4Auth._modify_request_before_signing(self, request)

        drop = {"authorization", "x-amz-date", "x-amz-security-token"}
        kept = [(k, v) for k, v in headers if k.lower() not in drop]
        host = next(v for k, v in headers if k.lower() == "host")
        request = AWSRequest(method=method, url=f"http://{host}{path}", data=body)
        for name, value in kept:
            request.headers[name] = value
        if "X-Amz-Content-SHA256" not in request.headers:
            request.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
        signer = _KeepPayloadHash(Credentials(self.access_key, self.secret_key), "s3", self.region)
        signer.add_auth(request)
        return list(request.headers.items())


class _Handler(BaseHTTPRequestHandler):
    core: _ProxyCore
    protocol_version = "HTTP/1.1"
    timeout = _SOCKET_TIMEOUT
    _upstream: http.client.HTTPConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return

    def do_GET(self) -> None:
        if self.path.startswith(_CONTROL):
            self._control()
        else:
            self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _control(self) -> None:
        body = self._read_body()
        if self.path == _CONTROL + "config" and body:
            with self.core.lock:
                self.core.fault_rate = float(json.loads(body)["fault_rate"])
        payload = json.dumps(self.core.stats()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            total = 0
            while True:
                size_line = self.rfile.readline(1024)
                if not size_line:
                    raise ConnectionError("client closed during a chunked body")
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline(1024).strip():  # trailers
                        pass
                    break
                total += size
                if total > _MAX_BODY:
                    raise ValueError("request body too large")
                chunks.append(self.rfile.read(size))
                self.rfile.readline(1024)  # CRLF after each chunk
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            raise ValueError("request body too large")
        return self.rfile.read(length) if length else b""

    def _drop(self) -> None:
        """Reset the client connection, without any response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _error(self, status: int, code: str, message: str) -> None:
        body = _ERROR_BODY.format(code=code, message=message).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        if status == 503:
            self.send_header("Retry-After", "0")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _forward(
        self, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        core = self.core
        for attempt in range(2):  # one reconnect if a kept-alive upstream connection went stale
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(
                    core.upstream_host, core.upstream_port, timeout=_SOCKET_TIMEOUT
                )
            conn = self._upstream
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in headers:
                    conn.putheader(name, value)
                if body or self.command in ("PUT", "POST"):
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body if body else None)
                response = conn.getresponse()
                data = response.read()
                out_headers = [
                    (k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP
                ]
                if self.command == "HEAD":
                    length = response.getheader("Content-Length")
                    if length is not None:
                        out_headers.append(("Content-Length", length))
                if response.will_close:
                    conn.close()
                    self._upstream = None
                return response.status, response.reason, out_headers, data
            except (http.client.HTTPException, OSError):
                conn.close()
                self._upstream = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def _proxy(self) -> None:
        core = self.core
        try:
            body = self._read_body()
        except (OSError, ValueError):
            self._drop()
            return
        if core.expired(self.headers.get("Authorization")):
            self._error(400, "ExpiredToken", "The provided token has expired.")
            return
        fault = core.draw(self.command, self.path)
        if fault == "drop_before":
            self._drop()
            return
        if fault == "slowdown":
            self._error(503, "SlowDown", "Please reduce your request rate.")
            return
        if fault == "internal":
            self._error(500, "InternalError", "We encountered an internal error. Please try again.")
            return

        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP]
        conditional = self.command == "PUT" and any(
            k.lower() == "if-none-match" for k, _ in headers
        )
        if conditional and core.reject_if_none_match:
            self._error(
                501,
                "NotImplemented",
                "A header you provided implies functionality that is not implemented",
            )
            return
        if conditional and core.ignore_if_none_match:
            headers = [(k, v) for k, v in headers if k.lower() != "if-none-match"]
            headers = core.resign(self.command, self.path, headers, body)
            headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        try:
            status, reason, out_headers, data = self._forward(headers, body)
        except (http.client.HTTPException, OSError):
            self._error(502, "BadGateway", "upstream unreachable")
            return
        if fault == "drop_after":
            self._drop()
            return
        self.send_response(status, reason)
        for name, value in out_headers:
            self.send_header(name, value)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD" and data:
            self.wfile.write(data)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            if self._upstream is not None:
                self._upstream.close()
                self._upstream = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def _serve(config_json: str, *, max_lifetime: float = 3600.0) -> None:
    """Child process entry: serve until terminated (or ``max_lifetime`` seconds, a safety net)."""
    core = _ProxyCore(json.loads(config_json))

    class Handler(_Handler):
        pass

    Handler.core = core
    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.daemon = True
    thread.start()
    sys.stdout.write(f"LISTENING {server.server_address[1]}\n")
    sys.stdout.flush()
    deadline = time.monotonic() + max_lifetime
    try:
        while time.monotonic() < deadline:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    _cfg = {
        "fault_rate": 0.1,
        "seed": 0,
        "methods": ["PUT", "GET"],
        "kinds": list(FAULT_KINDS),
        "cycle_kinds": False,
        "path_pattern": None,
        "max_faults": None,
        "ignore_if_none_match": False,
        "reject_if_none_match": False,
        "access_key": None,
        "secret_key": None,
        "region": "us-east-1",
    }
    _cfg.update(json.loads(sys.argv[1]))
    _serve(json.dumps(_cfg))
