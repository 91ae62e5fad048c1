"""Deployment and packaging, checked the way docs/deploy.md tells users to deploy.

1. The wheel built from pyproject.toml ships the two packages, no tests, and its version.
2. A fresh virtualenv holding that wheel next to pyspark, deltalake and delta-spark imports
   ``framework``, ``committers`` and ``committers.delta`` from the wheel, and no other
   distribution claims the top-level names ``framework`` / ``committers``.
3. A packed virtualenv (venv-pack) shipped with ``--archives pack#environment`` runs a bounded
   job on ``local-cluster[2,1,1024]`` (separate executor JVMs and Python workers) submitted
   with ``spark-submit`` from a directory outside the repository with no PYTHONPATH: the
   executors import the packages from the unpacked archive, never from the source tree, and
   the Delta table holds exactly the rows written. The same job reads the table back with
   ``read_table`` and the ``"deltalake"`` format and writes through the format (a batch write
   and a stream): the format is planned in Python processes on the driver, where the
   executors' relative ``./environment/bin/python`` does not exist.

No test downloads anything. The virtualenvs are built offline from the project venv that runs
this test: every distribution the wheel depends on (resolved from the wheel's own
``Requires-Dist`` through the installed metadata) is hard-linked file by file from the project
venv's site-packages (copied where hard links are impossible), and only the wheel itself is
installed with ``pip install --no-deps --no-index``. ``--system-site-packages`` or a ``.pth``
pointing at the project venv would not do: the project venv holds an *editable* install of
sparksink, so the source tree would be importable through it, and ``packages_distributions()``
would see two ``sparksink`` distributions.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from deltalake import DeltaTable
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from committers.tests._spark_helpers import TEST_JVM_OPTIONS

# Kills processes: runs in its own pytest-xdist worker, beside the rest (`make test`).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("kills_processes")]

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("framework", "committers")
# pyspark workers get pyspark (and py4j) from Spark itself ($SPARK_HOME/python/lib/*.zip),
# so the environment shipped to executors leaves them out, as docs/deploy.md says.
NOT_SHIPPED_TO_EXECUTORS = {"pyspark", "py4j"}


def _clean_env(**extra: str) -> dict[str, str]:
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


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    match = re.search(r'^version\s*=\s*"([^"]+)"', project, re.MULTILINE)
    assert match, "no version in [project] of pyproject.toml"
    return match.group(1)


def _wheel_metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode()


def _dependency_closure(wheel: Path, extras: tuple[str, ...]) -> set[str]:
    """Canonical names of every distribution the wheel needs with ``extras``, resolved through
    the metadata installed in this (the project's) venv, each with the extras asked of it."""
    roots = [
        line.split(":", 1)[1].strip()
        for line in _wheel_metadata(wheel).splitlines()
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


def _site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


def _link_distributions(names: set[str], venv: Path) -> None:
    """Hard-link the installed files of ``names`` into ``venv``'s site-packages (same layout:
    both are venvs of this interpreter). Console scripts are left out: their shebangs name the
    project venv's python."""
    target_site = _site_packages(venv)
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


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _venv_with(wheel: Path, venv: Path, distributions: set[str]) -> Path:
    """A new venv with ``distributions`` linked in and the wheel installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _link_distributions(distributions, venv)
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "--python", str(_python(venv))),
            *("install", "--quiet", "--no-deps", "--no-index", str(wheel)),
        ],
        check=True,
        env=_clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    return venv


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (an in-tree build would leave build/ and
    *.egg-info behind, and pick up stale files from an earlier build/)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    source.mkdir()
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
        env=_clean_env(PIP_DISABLE_PIP_VERSION_CHECK="1"),
    )
    (built,) = (work / "dist").glob("sparksink-*.whl")
    return built


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv: the wheel, its runtime dependencies and delta-spark."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    return _venv_with(wheel, venv, _dependency_closure(wheel, ("delta-spark",)))


def test_the_wheel_ships_the_packages_and_their_version_but_no_tests(wheel: Path) -> None:
    version = _pyproject_version()
    assert wheel.name == f"sparksink-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    top_level = {n.split("/", 1)[0] for n in names}
    assert top_level == {*PACKAGES, f"sparksink-{version}.dist-info"}
    assert not [n for n in names if "/tests/" in n or n.split("/")[-1].startswith("test_")]
    for shipped in (
        "framework/__init__.py",
        "framework/py.typed",
        "framework/spark/__init__.py",
        "framework/testing/__init__.py",  # the conformance suite destinations run
        "committers/__init__.py",
        "committers/py.typed",
        "committers/delta/__init__.py",
    ):
        assert shipped in names

    meta = _wheel_metadata(wheel)
    assert f"\nVersion: {version}\n" in meta
    requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    pyspark = next(r for r in requires if re.match(r"Requires-Dist: pyspark\[sql\]", r))
    assert "<4.3" in pyspark
    assert "<=" not in pyspark
    # pandas comes through pyspark[sql] with pyspark's own minimum; nothing caps it below 3.
    assert not [r for r in requires if "pandas" in r and "<" in r]


def test_a_fresh_venv_imports_the_wheel_and_no_other_distribution_claims_its_names(
    wheel: Path, fresh_venv: Path, tmp_path: Path
) -> None:
    script = """
import importlib.metadata, json, sys
import committers, committers.delta, framework
from framework import TwoPhaseSink  # imports pyspark
import delta  # delta-spark
names = importlib.metadata.packages_distributions()  # top-level name -> distributions
print(json.dumps({
    "files": [framework.__file__, committers.__file__, committers.delta.__file__],
    "versions": [framework.__version__, committers.__version__,
                 importlib.metadata.version("sparksink")],
    "owners": {top: names.get(top, []) for top in ["framework", "committers", "delta"]},
    "sys_path": sys.path,
}))
"""
    # Isolated mode (-I): no PYTHONPATH, no user site, no script directory on sys.path.
    done = subprocess.run(
        [str(_python(fresh_venv)), "-I", "-c", script],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    site = _site_packages(fresh_venv)
    for file in report["files"]:
        assert Path(file).is_relative_to(site), file
    assert not [p for p in report["sys_path"] if p and Path(p).is_relative_to(ROOT)]
    assert report["versions"] == [_pyproject_version()] * 3
    owners = {top: {canonicalize_name(d) for d in ds} for top, ds in report["owners"].items()}
    assert owners == {
        "framework": {"sparksink"},
        "committers": {"sparksink"},
        "delta": {"delta-spark"},
    }
    # One distribution, once: no second (say editable or stale) sparksink on sys.path.
    assert len(report["owners"]["framework"]) == len(report["owners"]["committers"]) == 1


@pytest.mark.spark
def test_a_packed_venv_shipped_with_archives_runs_a_job_on_separate_executors(
    wheel: Path, fresh_venv: Path, tmp_path: Path
) -> None:
    import venv_pack

    started = time.monotonic()
    # The executors' environment: the wheel and its runtime dependencies, without pyspark.
    shipped = _dependency_closure(wheel, ()) - NOT_SHIPPED_TO_EXECUTORS
    assert {"deltalake", "pyarrow", "pandas", "fsspec"} <= shipped
    executor_venv = tmp_path / "executor-venv"
    _venv_with(wheel, executor_venv, shipped)
    # .tar.gz, as docs/deploy.md says: Spark unpacks a plain .tar with a Java untar that drops
    # file modes and cannot create venv-pack's bin/ symlinks (the archive has no directory
    # entries). Level 0 keeps the gzip container but skips the compression time.
    pack = tmp_path / "environment.tar.gz"
    venv_pack.pack(prefix=str(executor_venv), output=str(pack), compress_level=0)
    packed = time.monotonic()

    # The driver: the fresh venv (wheel + pyspark), its spark-submit, a copy of the job in a
    # directory outside the repository, a clean environment.
    outside = tmp_path / "submit"
    outside.mkdir()
    job = outside / "deploy_job.py"
    shutil.copy2(Path(__file__).with_name("_deploy_job.py"), job)
    spark_home = _site_packages(fresh_venv) / "pyspark"
    table = tmp_path / "table"
    log = tmp_path / "spark-submit.log"
    try:
        with log.open("w") as stderr:
            done = subprocess.run(
                [
                    str(spark_home / "bin" / "spark-submit"),
                    *("--master", "local-cluster[2,1,1024]"),
                    *("--archives", f"{pack}#environment"),
                    # Python of the executors' workers: relative to each executor's working
                    # directory, where the archive is unpacked as ./environment.
                    *("--conf", "spark.pyspark.python=./environment/bin/python"),
                    # Python of the driver (client mode: the driver runs here, not in an executor).
                    *("--conf", f"spark.pyspark.driver.python={_python(fresh_venv)}"),
                    *("--conf", "spark.driver.host=127.0.0.1"),
                    *("--conf", "spark.ui.enabled=false"),
                    *("--conf", "spark.sql.shuffle.partitions=2"),
                    *("--conf", f"spark.driver.extraJavaOptions={TEST_JVM_OPTIONS}"),
                    *("--conf", f"spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}"),
                    str(job),
                    str(table),
                ],
                cwd=outside,
                env=_clean_env(SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1"),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                timeout=420,
            )
    finally:
        # Each executor unpacked the archive (~0.5 GB) under $SPARK_HOME/work, inside the
        # module's venv; local-cluster workers ignore SPARK_WORKER_DIR.
        shutil.rmtree(spark_home / "work", ignore_errors=True)
        pack.unlink()
    finished = time.monotonic()
    assert done.returncode == 0, log.read_text()[-6000:] + done.stdout[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in report["seconds"].items())
    print(f"packing {packed - started:.1f} s, spark-submit {finished - packed:.1f} s ({steps})")

    version = _pyproject_version()
    executor_dirs = set()
    for worker in report["workers"]:
        cwd = Path(worker["cwd"])
        # Each Python worker runs in its executor's working directory ...
        assert not cwd.is_relative_to(ROOT), worker
        executor_dirs.add(cwd)
        environment = cwd / "environment"
        # ... with the shipped interpreter, importing the packages from the unpacked archive.
        assert Path(worker["python"]) == environment / "bin" / "python", worker
        for module in ("committers", "committers_delta", "framework"):
            assert Path(worker[module]).is_relative_to(environment), worker
        # pyspark is not in the archive: the workers import Spark's own (python/lib/pyspark.zip).
        assert "pyspark.zip" in Path(worker["pyspark"]).parts, worker
        assert worker["version"] == worker["distribution"] == version
        assert not [p for p in worker["sys_path"] if p and Path(p).is_relative_to(ROOT)], worker
    assert executor_dirs

    assert [(w["staging"], w["rows"]) for w in report["writes"]] == [
        ("arrow", 100),
        ("spark", 100),
    ]
    expected = [(i, f"row-{i}", "even" if i % 2 == 0 else "odd") for i in range(200)]

    def rows(uri: Path) -> list[tuple]:
        table_rows = DeltaTable(str(uri)).to_pyarrow_table().to_pylist()
        return sorted((r["id"], r["label"], r["part"]) for r in table_rows)

    assert rows(table) == expected
    assert report["reads"] == {"read_table": list(range(200)), "format": list(range(200))}
    assert rows(tmp_path / "table-copy") == [r for r in expected if r[2] == "even"]
    assert rows(tmp_path / "table-stream") == expected
