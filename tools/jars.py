"""Fetches the JVM jars that run delta-spark, Spark's ``s3a`` file system and Spark's Kafka
source beside pyspark, and a Kafka broker for the tests.

    python tools/jars.py                   # fetch once into the cache, then reuse it (make jars)
    python tools/jars.py --print-classpath # the cached jars, comma-separated (spark.jars, --jars)
    python tools/jars.py --kafka-broker    # the broker's jar directory (fetched if missing)

What is fetched, through Maven (``mvn dependency:copy-dependencies`` on ``tools/jars/pom.xml``):
``io.delta:delta-spark_<spark major.minor>_<scala>`` (with delta-storage and the rest of its
runtime dependencies), ``org.apache.hadoop:hadoop-aws`` at the Hadoop version pyspark bundles
(with the AWS SDK v2 bundle it declares) and ``org.apache.spark:spark-sql-kafka-0-10_<scala>``
at pyspark's version (with its kafka-clients). The Spark, Scala and Hadoop versions are read
from the installed pyspark; every artifact pyspark already ships (Scala, Spark, Hadoop's client,
Jackson, Parquet, log4j, ...) is left out, and the result is checked to hold no class that a
pyspark jar holds too, so the classpath never carries two versions of a class.

Where: ``$SPARKSINK_JARS_DIR`` if set, else ``${XDG_CACHE_HOME:-~/.cache}/sparksink/jars/<key>``
(outside the source tree), ``<key>`` naming pyspark's version, Scala, delta-spark, Hadoop and a
digest of the pom (a pom that gains a dependency fills a new directory).

The Kafka broker (``org.apache.kafka:kafka_2.13`` in KRaft mode, ``tools/jars/kafka-broker/
pom.xml``) runs in a JVM of its own, so its jars go to a directory of their own,
``.../sparksink/kafka-broker/<version>-<pom digest>``, not beside pyspark's.
A directory is complete once its ``jars.txt`` lists its jars; a complete directory is reused
without running Maven. A missing one is filled with Maven offline first (``mvn -o``), then
online. Maven's local repository is one of our own, ``.../sparksink/maven-repository`` (Maven's
settings, ``~/.m2/settings.xml`` with its mirrors and proxies, still apply): Maven leaves the
poms of the versions it did not pick in its repository without their jars, and Spark's Ivy
resolver (``--packages``) fails on such entries in ``~/.m2`` ("download failed"). The copied
jars are hard links to the repository's files where the file system allows, so the 670 MiB are
stored once.

Failure: a missing Maven, an unreachable registry or a class clash exits with status 1 and a
message saying what failed and how to fix it; nothing incomplete is left in the cache.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

POM = Path(__file__).resolve().parent / "jars" / "pom.xml"
BROKER_POM = POM.parent / "kafka-broker" / "pom.xml"
STAMP = "jars.txt"
# Named in full, so that a registry out of reach is reported as such (a goal prefix such as
# "dependency:" is reported as "no plugin found" instead).
COPY_DEPENDENCIES = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies"
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
# "scala-library-2.13.18.jar" -> "scala-library"; "zstd-jni-1.5.7-7.jar" -> "zstd-jni"
# Every Spark module's jar carries this empty class (pyspark's own jars too): not a clash.
_SPARK_STUB = "org/apache/spark/unused/UnusedStubClass.class"
_ARTIFACT_OF_JAR = re.compile(r"^(?P<artifact>.+?)-\d[^-]*(-.+)?\.jar$")


class JarsError(Exception):
    """A fetch that failed, or jars missing at run time; the message says how to fix it."""


@dataclass(frozen=True)
class JarSet:
    """The jars for one installed pyspark: which versions, and where they are cached."""

    spark_version: str
    scala_binary: str
    hadoop_version: str
    jackson_version: str
    delta_version: str
    pyspark_jars: Path

    @property
    def spark_binary(self) -> str:
        return ".".join(self.spark_version.split(".")[:2])

    @property
    def delta_artifact(self) -> str:
        return f"io.delta:delta-spark_{self.spark_binary}_{self.scala_binary}:{self.delta_version}"

    @property
    def hadoop_aws_artifact(self) -> str:
        return f"org.apache.hadoop:hadoop-aws:{self.hadoop_version}"

    @property
    def kafka_artifact(self) -> str:
        return f"org.apache.spark:spark-sql-kafka-0-10_{self.scala_binary}:{self.spark_version}"

    @property
    def key(self) -> str:
        return (
            f"spark{self.spark_version}-scala{self.scala_binary}-delta{self.delta_version}"
            f"-hadoop{self.hadoop_version}-{_digest(POM)}"
        )

    @property
    def directory(self) -> Path:
        explicit = os.environ.get("SPARKSINK_JARS_DIR")
        return Path(explicit) if explicit else cache_root() / "jars" / self.key


def _digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()[:10]


def cache_root() -> Path:
    """Where the project keeps what it fetches and builds: ``$XDG_CACHE_HOME/sparksink``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(cache) / "sparksink"


def pom_delta_version() -> str:
    """The delta-spark version the pom names (the one place it is pinned)."""
    found = ElementTree.parse(POM).find("m:properties/m:delta.version", _POM_NS)
    assert found is not None and found.text, f"{POM} lacks <delta.version>"
    return found.text.strip()


def installed_jar_set(delta_version: str | None = None) -> JarSet:
    """The jar set for the pyspark importable here.

    Raises:
        JarsError: pyspark is not installed, or its jars do not name Scala's or Hadoop's version.
    """
    try:
        import pyspark
    except ImportError as error:
        raise JarsError(
            f"pyspark is not importable by {sys.executable} ({error}); run this with the "
            "project's virtualenv (make jars creates it)."
        ) from error
    jars = Path(pyspark.__file__).parent / "jars"
    scala = _version_of(jars, "scala-library")
    return JarSet(
        spark_version=pyspark.__version__,
        scala_binary=".".join(scala.split(".")[:2]),
        hadoop_version=_version_of(jars, "hadoop-client-api"),
        jackson_version=_version_of(jars, "jackson-databind"),
        delta_version=delta_version or pom_delta_version(),
        pyspark_jars=jars,
    )


def _version_of(jars: Path, artifact: str) -> str:
    found = sorted(jars.glob(f"{artifact}-[0-9]*.jar"))
    if not found:
        raise JarsError(f"no {artifact}-<version>.jar in {jars}: is this a pyspark installation?")
    return found[0].name[len(artifact) + 1 : -len(".jar")]


def cached_jars(jar_set: JarSet) -> list[Path]:
    """The jars of a complete cache directory.

    Raises:
        JarsError: the directory is missing or incomplete (the message says: run ``make jars``).
    """
    stamp = jar_set.directory / STAMP
    if stamp.is_file():
        jars = [jar_set.directory / name for name in stamp.read_text().split()]
        if jars and all(jar.is_file() for jar in jars):
            return jars
    raise JarsError(
        f"the delta-spark, hadoop-aws and Kafka source jars for pyspark {jar_set.spark_version} "
        f"({jar_set.delta_artifact}, {jar_set.hadoop_aws_artifact}, {jar_set.kafka_artifact}) "
        "are not in "
        f"{jar_set.directory}. Run `make jars` (or `python tools/jars.py`) to fetch them "
        "through Maven."
    )


def fetch(jar_set: JarSet, log=print) -> list[Path]:
    """The cached jars, fetched first if the cache lacks them (see the module docstring).

    Raises:
        JarsError: Maven is missing, the fetch failed, or a fetched jar clashes with pyspark.
    """
    try:
        return cached_jars(jar_set)
    except JarsError:
        pass
    what = f"{jar_set.delta_artifact}, {jar_set.hadoop_aws_artifact} and {jar_set.kafka_artifact}"
    properties = {
        "spark.version": jar_set.spark_version,
        "spark.binary.version": jar_set.spark_binary,
        "scala.binary.version": jar_set.scala_binary,
        "hadoop.version": jar_set.hadoop_version,
        "jackson.version": jar_set.jackson_version,
        "delta.version": jar_set.delta_version,
        "excludeArtifactIds": ",".join(sorted(_artifacts_in(jar_set.pyspark_jars))),
    }
    _fill(
        jar_set.directory,
        POM,
        properties,
        what,
        log,
        check=lambda staged, jars: _check_no_clash(jar_set.pyspark_jars, staged, jars),
    )
    return cached_jars(jar_set)


def broker_directory() -> Path:
    """Where the Kafka broker's jars are cached (see the module docstring)."""
    version = ElementTree.parse(BROKER_POM).find("m:properties/m:kafka.version", _POM_NS)
    assert version is not None and version.text, f"{BROKER_POM} lacks <kafka.version>"
    return cache_root() / "kafka-broker" / f"{version.text.strip()}-{_digest(BROKER_POM)}"


def fetch_broker(log=print) -> Path:
    """The Kafka broker's jar directory, fetched first if the cache lacks it.

    Raises:
        JarsError: Maven is missing or the fetch failed.
    """
    directory = broker_directory()
    if not (directory / STAMP).is_file():
        what = f"the Kafka broker {directory.name.split('-')[0]} (org.apache.kafka:kafka_2.13)"
        _fill(directory, BROKER_POM, {}, what, log, check=lambda staged, jars: None)
    return directory


def _fill(target: Path, pom: Path, properties: dict[str, str], what: str, log, check) -> None:
    """Copies ``pom``'s runtime dependencies into ``target`` (replacing an incomplete earlier
    attempt), its ``jars.txt`` written last; ``check(staged, jar names)`` may refuse them."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarsError(
            f"Maven (mvn) is not on PATH; it fetches {what}. Install Maven 3.6 or newer "
            "(Debian/Ubuntu: apt-get install maven; or https://maven.apache.org/install.html), "
            "then run `make jars` again."
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    repository = cache_root() / "maven-repository"
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as scratch:
        staged = Path(scratch) / "jars"
        _copy_dependencies(mvn, pom, properties, staged, repository, what, log)
        jars = sorted(path.name for path in staged.glob("*.jar"))
        _link_to_repository(staged, jars, repository)
        check(staged, jars)
        (staged / STAMP).write_text("\n".join(jars) + "\n")
        if target.exists():  # an incomplete earlier attempt (a complete one returned above)
            shutil.rmtree(target)
        try:
            staged.rename(target)
        except OSError:
            if not (target / STAMP).is_file():  # not a concurrent fetch that finished first
                raise


def _copy_dependencies(
    mvn: str,
    pom: Path,
    properties: dict[str, str],
    into: Path,
    repository: Path,
    what: str,
    log,
) -> None:
    """Runs Maven offline (the local repository may hold everything), then online."""
    command = [
        mvn,
        "--batch-mode",
        "--file",
        str(pom),
        COPY_DEPENDENCIES,
        *[f"-D{name}={value}" for name, value in properties.items()],
        "-DincludeScope=runtime",
        f"-DoutputDirectory={into}",
        f"-Dmaven.repo.local={repository}",
    ]
    offline = subprocess.run([*command, "--offline"], capture_output=True, text=True)
    if offline.returncode == 0:
        log(f"Copied {what} and their dependencies from {repository} (offline).")
        return
    log(f"Fetching {what} and their dependencies with Maven...")
    online = subprocess.run(command, capture_output=True, text=True)
    if online.returncode != 0:
        said = _maven_errors(online.stdout) or online.stdout[-3000:] + online.stderr[-2000:]
        raise JarsError(
            f"Maven could not fetch {what} (with their dependencies) from Maven Central or the "
            f"repositories of ~/.m2/settings.xml. Maven said:\n{said}\n"
            "Check the network connection, a proxy (<proxies> in ~/.m2/settings.xml) or a "
            "mirror, then run `make jars` again."
        )
    log(f"Fetched {what}.")


def _link_to_repository(directory: Path, names: list[str], repository: Path) -> None:
    """Replaces each copied jar by a hard link to the same file in Maven's repository (where
    the file system allows it), so that the jars are stored once."""
    in_repository = {path.name: path for path in repository.rglob("*.jar")}
    for name in names:
        copy, original = directory / name, in_repository.get(name)
        if original is None or original.stat().st_size != copy.stat().st_size:
            continue
        link = directory / f".{name}.link"
        try:
            os.link(original, link)
        except OSError:  # another file system, or links not supported: keep the copy
            continue
        os.replace(link, copy)


def _maven_errors(output: str) -> str:
    """Maven's own error lines, without its generic advice (which follows a bare "[ERROR]")."""
    errors = []
    for line in output.splitlines():
        if line.strip() == "[ERROR]":
            break
        if line.startswith("[ERROR]"):
            errors.append(line)
    return "\n".join(errors)


def _artifacts_in(pyspark_jars: Path) -> set[str]:
    """The artifact ids of the jars pyspark ships (left out of the fetch)."""
    return {_artifact_of(jar) for jar in pyspark_jars.glob("*.jar")} - {None}


def _artifact_of(jar: Path) -> str | None:
    """The artifact id of a jar: from its own Maven metadata where it has one (the longest id
    that prefixes the file name: a shaded jar also holds the metadata of what it shades), else
    the file name up to its version ("log4j-1.2-api-2.25.4.jar" needs the metadata)."""
    with zipfile.ZipFile(jar) as archive:
        declared = [
            name.split("/")[3]
            for name in archive.namelist()
            if name.startswith("META-INF/maven/") and name.endswith("/pom.properties")
        ]
    own = [artifact for artifact in declared if jar.name.startswith(artifact + "-")]
    if own:
        return max(own, key=len)
    match = _ARTIFACT_OF_JAR.match(jar.name)
    return match["artifact"] if match else None


def _classes(jar: Path) -> set[str]:
    with zipfile.ZipFile(jar) as archive:
        return {
            name
            for name in archive.namelist()
            if name.endswith(".class")
            and not name.startswith("META-INF/")
            and not name.endswith("module-info.class")
            and name != _SPARK_STUB
        }


def _check_no_clash(pyspark_jars: Path, fetched: Path, names: list[str]) -> None:
    """Raises JarsError naming each fetched jar that holds a class a pyspark jar holds too."""
    owner: dict[str, str] = {}
    for jar in sorted(pyspark_jars.glob("*.jar")):
        for name in _classes(jar):
            owner.setdefault(name, jar.name)
    clashes = []
    for jar_name in names:
        shared = sorted(name for name in _classes(fetched / jar_name) if name in owner)
        if shared:
            holders = sorted({owner[name] for name in shared})
            clashes.append(
                f"  {jar_name}: {len(shared)} classes also in {', '.join(holders)} "
                f"(e.g. {shared[0]})"
            )
    if clashes:
        raise JarsError(
            "fetched jars hold classes pyspark already ships, so the classpath would carry two "
            "versions of them:\n" + "\n".join(clashes) + f"\nExclude them in {POM}."
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--print-classpath",
        action="store_true",
        help="print the cached jars comma-separated (fails if they were not fetched)",
    )
    parser.add_argument(
        "--kafka-broker",
        action="store_true",
        help="print the Kafka broker's jar directory (fetched first if missing)",
    )
    parser.add_argument("--delta-version", help="delta-spark version (default: the pom's)")
    args = parser.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr)  # noqa: E731
    try:
        if args.kafka_broker:
            print(fetch_broker(log))
            return 0
        jar_set = installed_jar_set(args.delta_version)
        if args.print_classpath:
            print(",".join(str(jar) for jar in cached_jars(jar_set)))
            return 0
        jars = fetch(jar_set, log)
        broker = fetch_broker(log)
    except JarsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    size = sum(jar.stat().st_size for jar in jars) / 2**20
    print(
        f"{len(jars)} jars ({size:.0f} MiB) for pyspark {jar_set.spark_version} in "
        f"{jar_set.directory}; the Kafka broker in {broker}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
