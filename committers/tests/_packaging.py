"""Packaging as docs/deploy.md tells users to: the wheel built from a copy of the sources, and
virtualenvs made of it and of the project venv's installed distributions, offline (no test
downloads anything). Every distribution the wheel depends on (resolved from the wheel's own
``Requires-Dist`` through the installed metadata) is hard-linked file by file from the project
venv's site-packages (copied where hard links are impossible), and only the wheel itself is
installed with ``pip install --no-deps --no-index``. ``--system-site-packages`` or a ``.pth``
pointing at the project venv would not do: the project venv holds an *editable* install of
sparksink, so the source tree would be importable through it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("framework", "committers")
# pyspark workers get pyspark (and py4j) from Spark itself ($SPARK_HOME/python/lib/*.zip),
# so the environment shipped to executors leaves them out, as docs/deploy.md says.
NOT_SHIPPED_TO_EXECUTORS = {"pyspark", "py4j"}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a process that must not see the repository or the project venv."""
    venv_bin = str(Path(sys.executable).parent)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_HOME"}
        and not k.startswith(("PYSPARK_", "SPARK_"))
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    return {**env, **extra}


def pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', project, re.MULTILINE)
    assert match, "no version in [project] of pyproject.toml"
    return match.group(1)


def wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def dependency_closure(wheel: Path, extras: tuple[str, ...]) -> set[str]:
    """Canonical names of every distribution the wheel needs with ``extras``, resolved through
    the metadata installed in this (the project's) venv, each with the extras asked of it."""
    roots = [
        line.split(":", 1)[1].strip()
        for line in wheel_metadata(wheel).splitlines()
        if line.startswith("Requires-Dist:")
    ]
    wanted: dict[str, set[str]] = {}
    todo = [(Requirement(r), ("", *extras)) for r in roots]
    while todo:
        req, active = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in active):
            continue
        name = canonicalize_name(req.name)
        if name == "sparksink":  # e.g. the dev extra's self-reference; not followed
            continue
        if name in wanted and req.extras <= wanted[name]:
            continue
        wanted[name] = wanted.get(name, set()) | set(req.extras)
        dist = metadata.distribution(name)  # absent from the project venv: a failed test
        todo.extend((Requirement(r), ("", *sorted(wanted[name]))) for r in dist.requires or [])
    return set(wanted)


def site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


def _link_distributions(names: set[str], venv: Path) -> None:
    """Hard-link the installed files of ``names`` into ``venv``'s site-packages (same layout:
    both are venvs of this interpreter). Console scripts are left out: their shebangs name the
    project venv's python."""
    target_site = site_packages(venv)
    for name in sorted(names):
        dist = metadata.distribution(name)
        for file in dist.files or []:
            source = Path(dist.locate_file(file))
            if not source.is_file() or ".." in file.parts:
                continue
            target = target_site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:  # another file system: copy instead
                shutil.copy2(source, target)


def python_of(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_with(wheel: Path, venv: Path, distributions: set[str]) -> Path:
    """A new venv with ``distributions`` linked in and the wheel installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _link_distributions(distributions, venv)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(python_of(venv))),
            *("install", "--quiet", "--no-deps", "--no-index", str(wheel)),
        ],
        check=True,
        env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    return venv


def build_wheel(work: Path) -> Path:
    """The wheel, built from a copy of the sources (an in-tree build would leave build/ and
    *.egg-info behind, and pick up stale files from an earlier build/)."""
    source = work / "src"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    # No build isolation: setuptools comes from the dev extra, so the build needs no network.
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"),
            *("--no-build-isolation", "--no-index", "-w", str(work / "dist"), str(source)),
        ],
        check=True,
        cwd=work,
        env=clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    (built,) = (work / "dist").glob("sparksink-*.whl")
    return built


def pack_executor_env(wheel: Path, work: Path, python_prefix: str | None = None) -> Path:
    """The executors' environment of docs/deploy.md's Option 1 (the wheel and its runtime
    dependencies, without pyspark) packed with venv-pack into ``work/environment.tar.gz``;
    ``python_prefix``: where the nodes' Python lives, if not where this one does.

    A .tar.gz, as docs/deploy.md says: Spark unpacks a plain .tar with a Java untar that drops
    file modes and cannot create venv-pack's bin/ symlinks (the archive has no directory
    entries). Level 0 keeps the gzip container but skips the compression time."""
    import venv_pack

    shipped = dependency_closure(wheel, ()) - NOT_SHIPPED_TO_EXECUTORS
    assert {"deltalake", "pyarrow", "pandas", "fsspec"} <= shipped
    executor_venv = work / "executor-venv"
    venv_with(wheel, executor_venv, shipped)
    if python_prefix is not None:
        # venv-pack 0.2 rewrites link targets by prefix, "<base>/bin/python" to
        # "<python_prefix>/bin/python3.X": a link to "<base>/bin/python3.X" would end as
        # "python3.X3.X". Links to "<base>/bin/python" come out right.
        for link in (executor_venv / "bin").iterdir():
            if link.is_symlink() and os.path.isabs(os.readlink(link)):
                link.unlink()
                link.symlink_to(Path(sys.base_prefix) / "bin" / "python")
    pack = work / "environment.tar.gz"
    venv_pack.pack(
        prefix=str(executor_venv), output=str(pack), compress_level=0, python_prefix=python_prefix
    )
    shutil.rmtree(executor_venv)
    return pack
