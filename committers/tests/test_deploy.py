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
import re
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from deltalake import DeltaTable
from packaging.utils import canonicalize_name

from committers.tests._packaging import (
    PACKAGES,
    ROOT,
    build_wheel,
    clean_env,
    dependency_closure,
    pack_executor_env,
    pyproject_version,
    python_of,
    site_packages,
    venv_with,
    wheel_metadata,
)
from committers.tests._spark_helpers import TEST_JVM_OPTIONS

# Kills processes: runs in its own pytest-xdist worker, beside the rest (`make test`).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("kills_processes")]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def fresh_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new venv: the wheel, its runtime dependencies and delta-spark."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    return venv_with(wheel, venv, dependency_closure(wheel, ("delta-spark",)))


def test_the_wheel_ships_the_packages_and_their_version_but_no_tests(wheel: Path) -> None:
    version = pyproject_version()
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

    meta = wheel_metadata(wheel)
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
        [str(python_of(fresh_venv)), "-I", "-c", script],
        cwd=tmp_path,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    site = site_packages(fresh_venv)
    for file in report["files"]:
        assert Path(file).is_relative_to(site), file
    assert not [p for p in report["sys_path"] if p and Path(p).is_relative_to(ROOT)]
    assert report["versions"] == [pyproject_version()] * 3
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
    started = time.monotonic()
    pack = pack_executor_env(wheel, tmp_path)
    packed = time.monotonic()

    # The driver: the fresh venv (wheel + pyspark), its spark-submit, a copy of the job in a
    # directory outside the repository, a clean environment.
    outside = tmp_path / "submit"
    outside.mkdir()
    job = outside / "deploy_job.py"
    shutil.copy2(Path(__file__).with_name("_deploy_job.py"), job)
    spark_home = site_packages(fresh_venv) / "pyspark"
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
                    *("--conf", f"spark.pyspark.driver.python={python_of(fresh_venv)}"),
                    *("--conf", "spark.driver.host=127.0.0.1"),
                    *("--conf", "spark.ui.enabled=false"),
                    *("--conf", "spark.sql.shuffle.partitions=2"),
                    *("--conf", f"spark.driver.extraJavaOptions={TEST_JVM_OPTIONS}"),
                    *("--conf", f"spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}"),
                    str(job),
                    str(table),
                ],
                cwd=outside,
                env=clean_env(SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1"),
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

    version = pyproject_version()
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
