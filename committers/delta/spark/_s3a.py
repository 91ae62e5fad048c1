"""Spark's ``s3a`` file system configured from the table's own location, for ``staging="spark"``.

With ``staging="spark"`` (and for upserts, and Spark-staged compaction) Spark's own Parquet
reader and writer touch an S3 table's files through Hadoop's S3A file system (hadoop-aws),
while the driver still lists, reads footers and commits through fsspec and delta-rs. All three
must reach the same bucket on the same endpoint as the same principal, so the S3A settings are
derived from the sink's :class:`TableLocation` (its ``storage_options`` and the environment),
never configured separately:

* ``s3://bucket/t`` is written by Spark as ``s3a://bucket/t`` (the same objects);
* the settings are **per bucket** (``fs.s3a.bucket.<bucket>.*``) and set in the SQL
  configuration of the writing SparkSession, which Spark copies into the Hadoop configuration
  of every job of that session: no global ``fs.s3a.*`` setting, and no other bucket, changes;
* credentials: keys given in ``storage_options`` or resolved by botocore from long-lived
  sources (environment, shared credentials file) are handed to S3A as they are handed to
  delta-rs (``SimpleAWSCredentialsProvider``, or ``TemporaryAWSCredentialsProvider`` with a
  session token). Credentials that expire (STS, SSO, ``credential_process``, container and
  instance roles) are resolved by the AWS SDK's default chain in every JVM instead, which
  renews them there from the same sources; that needs the JVM to see the same ``AWS_PROFILE``
  and AWS config files as this process;
* no credentials at all: anonymous access on both sides.

Refusals (:class:`ConfigurationError`, before anything is written): an S3A setting the user
made for this bucket (per bucket, or the global endpoint and access key) that disagrees with
the table's options; an S3A file system Spark already built for the bucket with another
endpoint or identity (Hadoop caches one per bucket and JVM, and would ignore ours).
:func:`prepare_s3a` returns, instead of raising, why Spark cannot follow the table's
credentials at all (hadoop-aws missing, a profile the JVM does not see): ``staging="auto"``
then stages with the Python writers.

When the table's credentials change (static keys rotated between writes of this process),
the settings this module made are replaced and the cached S3A file system of the bucket is
closed so that the next use builds one with the new keys: a write in flight in the same JVM on
the same bucket with the old file system would fail (and not commit).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from committers.delta.storage._storage import (
    EXPLICIT_CREDENTIALS,
    ResolvedCredentials,
    TableLocation,
    parse_duration,
)
from framework.errors import ConfigurationError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["S3A_SCHEME", "prepare_s3a", "require_s3a", "s3a_settings"]

S3A_SCHEME = "s3a"
SIMPLE_PROVIDER = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
TEMPORARY_PROVIDER = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
ANONYMOUS_PROVIDER = "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
SDK_CHAIN_PROVIDER = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"
# botocore providers of long-lived keys, handed to S3A as they are (see _storage).
_STATIC_METHODS = frozenset(
    {EXPLICIT_CREDENTIALS, "env", "shared-credentials-file", "config-file", "boto-config"}
)
# What a JVM's AWS SDK chain reads to find the same expiring credentials botocore found.
_CHAIN_ENVIRONMENT = ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")
# Settings whose global (not per-bucket) value, set by the user, must agree with the table's.
_CHECKED_GLOBALLY = ("endpoint", "access.key")
_MARKER = "spark.sparksink.s3a.bucket.{bucket}"
# What a bucket's S3A file system is recognised by (endpoint and identity).
_IDENTITY = ("endpoint", "access.key", "aws.credentials.provider")
# Per bucket, the identity of the S3A file system this process's JVM last built with settings
# of this module (Hadoop's cache of file systems is per JVM, not per session).
_CONFIGURED: dict[str, str] = {}


def s3a_settings(location: TableLocation, credentials: ResolvedCredentials) -> dict[str, str]:
    """The S3A settings (names without the ``fs.s3a.`` / per-bucket prefix) that reach
    ``location`` as delta-rs does with ``credentials``. Contains secrets: never log it."""
    opts = location.storage_options
    settings: dict[str, str] = {}
    endpoint = opts.get("AWS_ENDPOINT_URL")
    if endpoint:
        settings["endpoint"] = endpoint.rstrip("/")
        settings["connection.ssl.enabled"] = str(urlparse(endpoint).scheme == "https").lower()
    if opts.get("AWS_REGION"):
        settings["endpoint.region"] = opts["AWS_REGION"]
    virtual = opts.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
    if virtual is not None:
        settings["path.style.access"] = str(virtual.strip().lower() not in _TRUE).lower()
    elif endpoint:
        settings["path.style.access"] = "true"  # as delta-rs and fsspec address custom endpoints
    for option, name in (
        ("connect_timeout", "connection.establish.timeout"),
        ("timeout", "connection.timeout"),
    ):
        if option in opts:
            settings[name] = str(int(parse_duration(option, opts[option]) * 1000))  # ms
    if "max_retries" in opts:
        settings["attempts.maximum"] = opts["max_retries"]
    settings.update(_credential_settings(credentials))
    return settings


_TRUE = frozenset({"true", "1", "yes", "on"})


def _credential_settings(credentials: ResolvedCredentials) -> dict[str, str]:
    values = credentials.values
    if credentials.method is None:
        return {"aws.credentials.provider": ANONYMOUS_PROVIDER}
    if credentials.method not in _STATIC_METHODS:
        return {"aws.credentials.provider": SDK_CHAIN_PROVIDER}
    settings = {
        "access.key": values["AWS_ACCESS_KEY_ID"],
        "secret.key": values["AWS_SECRET_ACCESS_KEY"],
        "aws.credentials.provider": SIMPLE_PROVIDER,
    }
    if values.get("AWS_SESSION_TOKEN"):
        settings["session.token"] = values["AWS_SESSION_TOKEN"]
        settings["aws.credentials.provider"] = TEMPORARY_PROVIDER
    return settings


def require_s3a(spark: SparkSession, location: TableLocation, needs: str) -> None:
    """On S3, :func:`prepare_s3a` for ``needs`` (what must use Spark's s3a, as a sentence
    start).

    Raises:
        ConfigurationError: Spark's s3a cannot reach ``location`` as delta-rs does.
    """
    problem = prepare_s3a(spark, location) if location.is_s3 else None
    if problem:
        raise ConfigurationError(f"{needs}, which cannot reach {location.uri} here: {problem}.")


def prepare_s3a(spark: SparkSession, location: TableLocation) -> str | None:
    """Configure ``spark`` so that its S3A file system reaches ``location`` as the sink's
    fsspec and delta-rs clients do (see the module docstring). Returns why it cannot (the
    caller refuses ``staging="spark"`` or falls back to the Python writers), else ``None``.

    Raises:
        ConfigurationError: S3A settings the user made, or an S3A file system Spark already
            built for the bucket, disagree with the table's endpoint or credentials.
    """
    session: Any = spark
    jvm = session._jvm
    try:
        jvm.org.apache.hadoop.fs.FileSystem.getFileSystemClass(
            S3A_SCHEME, session._jsc.hadoopConfiguration()
        )
    except Exception:  # no JVM (Spark Connect) or no S3AFileSystem on the classpath
        return (
            "Spark has no s3a:// file system here: hadoop-aws and the AWS SDK bundle are not "
            "on Spark's classpath (`make jars` fetches them; see docs/deploy.md)"
        )
    credentials = location.resolve_credentials()
    if credentials.method is not None and credentials.method not in _STATIC_METHODS:
        problem = _jvm_environment_differs(jvm, location, credentials)
        if problem:
            return problem
    settings = s3a_settings(location, credentials)
    with _py4j_quiet():
        _set_bucket_settings(spark, location, settings)
        _check_cached_filesystem(spark, location, settings)
    return None


@contextlib.contextmanager
def _py4j_quiet() -> Iterator[None]:
    """py4j logs every command and answer it exchanges with the JVM at DEBUG, the secrets
    this module sets and reads included: above DEBUG while they cross."""
    logger = logging.getLogger("py4j")
    level = logger.level
    logger.setLevel(max(logging.INFO, logger.getEffectiveLevel()))
    try:
        yield
    finally:
        logger.setLevel(level)


def _jvm_environment_differs(
    jvm: Any, location: TableLocation, credentials: ResolvedCredentials
) -> str | None:
    """Why the JVM's AWS SDK would not find the expiring credentials botocore found here."""
    wanted = {name: os.environ.get(name) for name in _CHAIN_ENVIRONMENT}
    if location.storage_options.get("AWS_PROFILE"):
        wanted["AWS_PROFILE"] = location.storage_options["AWS_PROFILE"]
    for name, value in wanted.items():
        in_jvm = jvm.java.lang.System.getenv(name)
        if (in_jvm or None) != (value or None):
            return (
                f"the credentials come from {credentials.method} and expire, so Spark's JVM "
                f"must renew them from the same source, but its {name} is {in_jvm!r} where the "
                f"table's is {value!r} (a profile given only in storage_options, or an "
                "environment changed after the SparkSession started); set it in the "
                "environment before the session starts"
            )
    return None


def _set_bucket_settings(
    spark: SparkSession, location: TableLocation, settings: dict[str, str]
) -> None:
    """Put ``settings`` under the bucket's prefix in ``spark``'s configuration (replacing
    those this module made earlier, e.g. with other credentials).

    Raises:
        ConfigurationError: the user set one of them (or a checked global one) otherwise.
    """
    session: Any = spark
    prefix = f"fs.s3a.bucket.{location.bucket}."
    in_session = {name: spark.conf.get(prefix + name, None) for name in settings}
    marker = _MARKER.format(bucket=location.bucket)
    set_by_us = _made_by_us(spark.conf.get(marker, None), spark.conf, prefix)
    # The SparkContext's Hadoop configuration (spark.hadoop.*) is the user's; the session's
    # SQL configuration holds ours (recognised by the marker) or the user's.
    context = session._jsc.hadoopConfiguration()
    conflicts = [
        prefix + name
        for name, value in settings.items()
        if (context.get(prefix + name) or value) != value
        or (not set_by_us and (in_session[name] or value) != value)
    ]
    merged = session._jsparkSession.sessionState().newHadoopConf()
    for name in _CHECKED_GLOBALLY:
        value = merged.get("fs.s3a." + name)
        if value and value != settings.get(name):
            conflicts.append("fs.s3a." + name)
    if conflicts:
        raise ConfigurationError(
            f"Spark's S3A settings for bucket {location.bucket!r} disagree with the table's "
            f"storage options ({location.endpoint}, {_identity(settings)}): "
            f"{', '.join(sorted(conflicts))}. The sink configures Spark's s3a for the "
            "table's bucket from storage_options and the AWS environment (one place for "
            "delta-rs, fsspec and Spark): remove those settings from the Spark "
            "configuration, or make the storage options name the same endpoint and keys."
        )
    if in_session == settings:
        return
    for name, value in settings.items():
        spark.conf.set(prefix + name, value)
    spark.conf.set(marker, f"{','.join(sorted(settings))}:{_fingerprint(settings)}")


def _made_by_us(marker: str | None, conf: Any, prefix: str) -> bool:
    """Whether the bucket's settings in the session's ``conf`` are still those this module
    made (``marker`` names them and their digest)."""
    if not marker:
        return False
    names, _, digest = marker.rpartition(":")
    values = {name: conf.get(prefix + name, None) for name in names.split(",")}
    return None not in values.values() and _fingerprint(values) == digest


def _check_cached_filesystem(
    spark: SparkSession, location: TableLocation, settings: dict[str, str]
) -> None:
    """Hadoop builds one S3A file system per bucket and JVM and reuses it, whatever the
    configuration of later jobs: the one this JVM holds must use ``settings``. One built
    with settings this module made earlier in this process (in any session of its JVM) is
    closed, so that the next use builds one with ``settings``.

    Raises:
        ConfigurationError: it was built earlier with another endpoint or identity, by a
            use of the bucket the sink did not configure.
    """
    session: Any = spark
    jvm = session._jvm
    hadoop = session._jsparkSession.sessionState().newHadoopConf()
    uri = jvm.java.net.URI(f"{S3A_SCHEME}://{location.bucket}/")
    filesystem = jvm.org.apache.hadoop.fs.FileSystem.get(uri, hadoop)
    differs = _differing(filesystem.getConf(), settings)
    if differs and _CONFIGURED.get(location.bucket) == _identity_of(filesystem.getConf()):
        filesystem.close()  # built with what we configured before: the next use builds anew
        filesystem = jvm.org.apache.hadoop.fs.FileSystem.get(uri, hadoop)
        differs = _differing(filesystem.getConf(), settings)
    if not differs:
        _CONFIGURED[location.bucket] = _identity_of(filesystem.getConf())
    if differs:
        raise ConfigurationError(
            f"Spark already holds an S3A file system for bucket {location.bucket!r} built "
            f"with other settings ({', '.join(differs)}) than the table's storage options, "
            "and Hadoop reuses it for every later job in this JVM. Give the bucket the same "
            "endpoint and credentials everywhere in this Spark application, or write this "
            "table with staging='arrow'."
        )


def _differing(conf: Any, settings: dict[str, str]) -> list[str]:
    return [
        "fs.s3a." + name
        for name in _IDENTITY
        if name in settings and (conf.get("fs.s3a." + name) or "") != settings[name]
    ]


def _identity_of(conf: Any) -> str:
    """A digest of the endpoint and identity an S3A file system's configuration names."""
    return _fingerprint({name: conf.get("fs.s3a." + name) or "" for name in _IDENTITY})


def _fingerprint(settings: dict[str, str]) -> str:
    """A digest of settings (secrets included), to recognise the ones this module made."""
    text = "\n".join(f"{name}={settings[name]}" for name in sorted(settings))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _identity(settings: dict[str, str]) -> str:
    key = settings.get("access.key")
    if key:
        return f"access key {key[:4]}..." if len(key) > 8 else "an access key"
    return settings["aws.credentials.provider"].rsplit(".", 1)[-1]
