"""Where a table lives: one URI and one set of storage options for both staging and commits.

Staging goes through fsspec (s3fs for ``s3://``), the Delta log through delta-rs; both are built
from the same :class:`TableLocation`, so they always see the same endpoint and credentials.
Filesystem clients are created lazily on whichever process uses them and are never pickled.

S3 options use delta-rs names (case-insensitive; the common aliases delta-rs accepts work too):

=========================  ===================================  ===============================
option                     delta-rs (commits)                   s3fs / botocore (staging)
=========================  ===================================  ===============================
``AWS_ENDPOINT_URL``       same                                 ``client_kwargs.endpoint_url``
``AWS_ACCESS_KEY_ID``      same                                 ``key``
``AWS_SECRET_ACCESS_KEY``  same                                 ``secret``
``AWS_SESSION_TOKEN``      same                                 ``token``
``AWS_REGION``             same                                 ``client_kwargs.region_name``
``AWS_ALLOW_HTTP``         same                                 (``http://`` endpoints allowed)
``AWS_PROFILE``            resolved to keys through botocore    ``profile``
``connect_timeout``        same (default ``5s``)                ``config_kwargs.connect_timeout``
``timeout``                same                                 ``config_kwargs.read_timeout``
``max_retries``            same                                 botocore ``total_max_attempts``
                                                                (= max_retries + 1)
=========================  ===================================  ===============================

Other names are refused with a clear error: Hadoop S3A names (``fs.s3a.endpoint``, also with a
``spark.hadoop.`` prefix) name their equivalent above; unknown names for S3 or local tables list
the supported ones. Options of other schemes (``gs://``, ``az://``, ...) go to delta-rs and
fsspec unchanged.

When options leave something out, the standard AWS sources fill it in:

* non-secret settings (endpoint: ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``; region:
  ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` / the profile's ``region``; ``AWS_ALLOW_HTTP``) are
  resolved ONCE, by :meth:`TableLocation.of` on the driver, and travel with the location, so
  executors talk to the same endpoint even when their environment differs;
* credentials are never copied out of the environment: each process resolves them with
  botocore's standard chain (environment variables, ``AWS_PROFILE`` and the shared
  credentials/config files, SSO, container and instance roles). delta-rs is handed exactly the
  credentials botocore resolves, so staging and commits always use the same identity.

Secrets never appear in ``repr``/``str`` of a location or of its options (see
:meth:`TableLocation.redacted_options` for a loggable view).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import fsspec

from framework.errors import ConfigurationError

__all__ = [
    "CREDENTIAL_RENEW_MARGIN",
    "DEFAULT_CONNECT_TIMEOUT",
    "DEFAULT_S3_MAX_ATTEMPTS",
    "EXPLICIT_CREDENTIALS",
    "SECRET_OPTIONS",
    "CredentialIdentity",
    "ResolvedCredentials",
    "StorageOptions",
    "TableLocation",
]

#: Connect timeout used on both sides when ``connect_timeout`` is not given.
DEFAULT_CONNECT_TIMEOUT = "5s"
#: botocore attempts per S3 request (first try included) when ``max_retries`` is not given.
DEFAULT_S3_MAX_ATTEMPTS = 5

_S3_SCHEMES = ("s3", "s3a")

# Canonical (delta-rs) option names and the aliases accepted for them (compared upper-cased).
_ALIASES: dict[str, tuple[str, ...]] = {
    "AWS_ENDPOINT_URL": ("AWS_ENDPOINT", "ENDPOINT_URL", "ENDPOINT"),
    "AWS_ACCESS_KEY_ID": ("ACCESS_KEY_ID",),
    "AWS_SECRET_ACCESS_KEY": ("SECRET_ACCESS_KEY",),
    "AWS_SESSION_TOKEN": ("SESSION_TOKEN", "AWS_TOKEN", "TOKEN"),
    "AWS_REGION": ("REGION", "AWS_DEFAULT_REGION"),
    "AWS_ALLOW_HTTP": ("ALLOW_HTTP",),
    "AWS_PROFILE": ("PROFILE",),
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": ("VIRTUAL_HOSTED_STYLE_REQUEST",),
    "connect_timeout": ("CONNECT_TIMEOUT",),
    "timeout": ("TIMEOUT",),
    "max_retries": ("MAX_RETRIES",),
}
_CANONICAL = {alias: name for name, aliases in _ALIASES.items() for alias in aliases}
_CANONICAL.update({name.upper(): name for name in _ALIASES})

# Hadoop S3A names users bring from Spark configurations, with what to write instead.
_HADOOP_EQUIVALENTS = {
    "fs.s3a.endpoint": "AWS_ENDPOINT_URL",
    "fs.s3a.access.key": "AWS_ACCESS_KEY_ID",
    "fs.s3a.secret.key": "AWS_SECRET_ACCESS_KEY",
    "fs.s3a.session.token": "AWS_SESSION_TOKEN",
    "fs.s3a.endpoint.region": "AWS_REGION",
    "fs.s3a.region": "AWS_REGION",
    "fs.s3a.path.style.access": "AWS_VIRTUAL_HOSTED_STYLE_REQUEST (inverted: 'false' = path style)",
    "fs.s3a.connection.ssl.enabled": (
        "AWS_ALLOW_HTTP='true' (inverted) with an http:// AWS_ENDPOINT_URL"
    ),
    "fs.s3a.connection.establish.timeout": "connect_timeout",
    "fs.s3a.connection.timeout": "timeout",
    "fs.s3a.attempts.maximum": "max_retries",
    "fs.s3a.retry.limit": "max_retries",
    "fs.s3a.aws.credentials.provider": (
        "AWS_PROFILE, or the standard AWS credential chain (environment, shared files, roles)"
    ),
}

#: Option names whose values are secret: never shown in reprs or logs.
SECRET_OPTIONS = frozenset({"AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"})
_PARTLY_SECRET = frozenset({"AWS_ACCESS_KEY_ID"})
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "CREDENTIAL", "SAS", "ACCOUNT_KEY")

_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off", ""})
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|m|min|mins|h)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "sec": 1.0, "secs": 1.0}
_DURATION_UNITS.update({"m": 60.0, "min": 60.0, "mins": 60.0, "h": 3600.0})


def _is_secret(name: str) -> bool:
    upper = name.upper()
    return upper in SECRET_OPTIONS or any(word in upper for word in _SECRET_WORDS)


def _mask(name: str, value: str) -> str:
    if name in _PARTLY_SECRET:
        return f"{value[:4]}***" if len(value) > 8 else "***"
    return "***" if _is_secret(name) else value


class StorageOptions(Mapping[str, str]):
    """An immutable, hashable mapping of storage options whose ``repr`` hides secrets.

    Behaves like a ``dict[str, str]`` for reading; ``dict(options)`` gives the real values.
    """

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, str] | None = None) -> None:
        self._data: dict[str, str] = dict(data or {})

    def __getitem__(self, key: str) -> str:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return dict(self._data) == dict(other)
        return NotImplemented

    def redacted(self) -> dict[str, str]:
        """A copy safe to log: secret values are replaced by ``***``."""
        return {name: _mask(name, value) for name, value in self._data.items()}

    def __repr__(self) -> str:
        return f"StorageOptions({self.redacted()!r})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[Any, ...]:
        return (StorageOptions, (self._data,))


def _normalize(table_uri: str) -> str:
    """Local paths and file:// URLs become absolute local paths; other URLs stay as given."""
    parsed = urlparse(table_uri)
    if parsed.scheme in ("", "file") or (len(parsed.scheme) == 1 and os.name == "nt"):
        path = parsed.path if parsed.scheme == "file" else table_uri
        return os.path.abspath(os.path.expanduser(path)).rstrip("/") or "/"
    return table_uri.rstrip("/")


def _as_text(name: str, value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise ConfigurationError(
        f"storage option {name!r} must be a string, got {type(value).__name__}"
    )


def _reject_foreign_name(raw_name: str, scheme: str) -> None:
    """Hadoop-style and unknown option names are errors, never silently ignored."""
    name = raw_name.removeprefix("spark.hadoop.")
    if name.lower().startswith("fs."):
        equivalent = _HADOOP_EQUIVALENTS.get(name.lower())
        instead = (
            f"use {equivalent}"
            if equivalent
            else f"the options this sink understands are {', '.join(_ALIASES)}"
        )
        raise ConfigurationError(
            f"storage option {raw_name!r} is a Hadoop file system setting, which does not reach "
            f"delta-rs or fsspec (the sink does not write through Hadoop): {instead}"
        )
    if scheme == "file":
        raise ConfigurationError(
            f"storage option {raw_name!r} is not used by local tables; local paths take no "
            "storage options"
        )
    if scheme in _S3_SCHEMES and raw_name.upper() not in _CANONICAL:
        raise ConfigurationError(
            f"unknown storage option {raw_name!r} for an S3 table. Every option is applied to "
            "both staging (s3fs) and commits (delta-rs), and these are the ones the sink can "
            f"apply to both: {', '.join(_ALIASES)} (aliases and any case accepted)"
        )


def _canonicalize(options: Mapping[str, object], scheme: str) -> dict[str, str]:
    """Map aliases to canonical names; reject two spellings of one option with different values,
    Hadoop-style names, and names unknown for ``scheme``."""
    out: dict[str, str] = {}
    spelled: dict[str, str] = {}
    for raw_name, raw_value in options.items():
        _reject_foreign_name(str(raw_name), scheme)
        name = _CANONICAL.get(str(raw_name).upper(), str(raw_name))
        value = _as_text(str(raw_name), raw_value)
        if name in out and out[name] != value:
            raise ConfigurationError(
                f"storage options {spelled[name]!r} and {raw_name!r} both set {name} "
                "to different values; give it once"
            )
        out[name] = value
        spelled[name] = str(raw_name)
    return out


def _parse_bool(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ConfigurationError(f"storage option {name} must be 'true' or 'false', got {value!r}")


def parse_duration(name: str, value: str) -> float:
    """Seconds in a delta-rs style duration (``"5s"``, ``"250ms"``, ``"1m"``, ``"3"``).

    Raises:
        ConfigurationError: the value is not a duration.
    """
    match = _DURATION.match(value)
    if not match:
        raise ConfigurationError(
            f"storage option {name} must be a duration such as '5s' or '500ms', got {value!r}"
        )
    unit = match.group(2).lower() if match.group(2) else None
    return float(match.group(1)) * _DURATION_UNITS[unit]


def _env_first(environ: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = environ.get(name)
        if value:
            return value
    return None


def _profile_region(profile: str | None) -> str | None:
    """The region configured for ``profile`` in the shared AWS config (no network access)."""
    try:
        import botocore.session

        session = botocore.session.Session(profile=profile)
        region = session.get_config_variable("region")
    except Exception:  # an unknown or broken profile: leave the region to the clients
        return None
    return str(region) if region else None


def _resolve_s3(options: dict[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """Fill in non-secret S3 settings from the environment and validate them."""
    resolved = dict(options)
    if "AWS_ENDPOINT_URL" not in resolved:
        endpoint = _env_first(environ, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
        if endpoint:
            resolved["AWS_ENDPOINT_URL"] = endpoint
    if "AWS_REGION" not in resolved:
        region = _env_first(environ, "AWS_REGION", "AWS_DEFAULT_REGION")
        if not region and (resolved.get("AWS_PROFILE") or environ.get("AWS_PROFILE")):
            region = _profile_region(resolved.get("AWS_PROFILE") or environ.get("AWS_PROFILE"))
        if region:
            resolved["AWS_REGION"] = region
    if "AWS_ALLOW_HTTP" not in resolved and environ.get("AWS_ALLOW_HTTP"):
        resolved["AWS_ALLOW_HTTP"] = environ["AWS_ALLOW_HTTP"]

    allow_http = _parse_bool("AWS_ALLOW_HTTP", resolved.get("AWS_ALLOW_HTTP", "false"))
    endpoint = resolved.get("AWS_ENDPOINT_URL")
    if endpoint is not None:
        parsed = urlparse(endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigurationError(
                f"AWS_ENDPOINT_URL must be an http:// or https:// URL, got {endpoint!r}"
            )
        if parsed.scheme == "http" and not allow_http:
            raise ConfigurationError(
                f"AWS_ENDPOINT_URL {endpoint!r} uses plain http; set AWS_ALLOW_HTTP='true' to "
                "allow unencrypted connections (both staging and commits honour it)"
            )
    for name in ("connect_timeout", "timeout"):
        if name in resolved:
            parse_duration(name, resolved[name])
    if "max_retries" in resolved:
        try:
            if int(resolved["max_retries"]) < 0:
                raise ValueError
        except ValueError:
            raise ConfigurationError(
                f"storage option max_retries must be a non-negative integer, "
                f"got {resolved['max_retries']!r}"
            ) from None
    if "AWS_VIRTUAL_HOSTED_STYLE_REQUEST" in resolved:
        _parse_bool(
            "AWS_VIRTUAL_HOSTED_STYLE_REQUEST", resolved["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"]
        )
    return resolved


#: Method of :class:`ResolvedCredentials` given in the storage options.
EXPLICIT_CREDENTIALS = "explicit"
#: Rebuild a client holding expiring credentials this long before they expire at the latest
#: (earlier for short-lived ones: once half their lifetime is gone).
CREDENTIAL_RENEW_MARGIN = 300.0


@dataclass(frozen=True)
class ResolvedCredentials:
    """S3 credentials as resolved in one process at one moment.

    Attributes:
        values: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN``
            (empty when nothing was found); hidden from ``repr``.
        method: where they came from: ``"explicit"`` (storage options) or botocore's provider
            name (``"env"``, ``"shared-credentials-file"``, ``"custom-process"``,
            ``"assume-role"``, ``"iam-role"``, ...); ``None`` when nothing was found.
        expires_at: Unix time at which they expire; ``None`` for credentials that do not.
        resolved_at: Unix time of the resolution.
    """

    values: Mapping[str, str] = field(repr=False)
    method: str | None
    expires_at: float | None = None
    resolved_at: float = field(default_factory=time.time)

    @property
    def identity(self) -> CredentialIdentity:
        """Who these credentials are, without any secret (safe to pickle and log)."""
        return CredentialIdentity(self.method, self.values.get("AWS_ACCESS_KEY_ID"))

    @property
    def renew_at(self) -> float | None:
        """When a client holding these credentials should be rebuilt with fresh ones: half
        their lifetime, at most :data:`CREDENTIAL_RENEW_MARGIN` before expiry; ``None`` if
        they never expire."""
        if self.expires_at is None:
            return None
        lifetime = max(0.0, self.expires_at - self.resolved_at)
        return self.expires_at - min(CREDENTIAL_RENEW_MARGIN, lifetime / 2)


#: botocore providers of long-lived keys: every process reading them gets the same key id.
_STATIC_METHODS = frozenset({"env", "shared-credentials-file", "config-file", "boto-config"})


@dataclass(frozen=True)
class CredentialIdentity:
    """Where a process's S3 credentials come from and their access key id (not a secret)."""

    method: str | None
    access_key_id: str | None

    def describe(self) -> str:
        """Loggable: the source and a shortened key id."""
        if self.method is None:
            return "no credentials"
        key = self.access_key_id or ""
        shown = f"{key[:4]}...{key[-4:]}" if len(key) > 12 else "***"
        return f"access key {shown} from {self.method}"

    def check_same_principal(self, driver: CredentialIdentity, uri: str) -> None:
        """Fail if this process (an executor) would stage under another identity than the
        driver commits with.

        Keys from roles, SSO or a credential process legitimately differ between processes;
        long-lived keys (environment, credentials files) and their absence do not.

        Raises:
            ConfigurationError: the executor finds no credentials while the driver does, or
                other long-lived keys. Typically the driver's ``os.environ`` was given them
                after the SparkSession started, which executors never see.
        """
        if driver.method is None or driver.method == EXPLICIT_CREDENTIALS:
            return
        if self.method is not None and (
            self.access_key_id == driver.access_key_id
            or (self.method not in _STATIC_METHODS and driver.method not in _STATIC_METHODS)
        ):
            return
        raise ConfigurationError(
            f"the Spark executors staging {uri} find {self.describe()}, but the driver "
            f"commits with {driver.describe()}. Credentials set in the driver's environment "
            "after the SparkSession started never reach the executors: set them before "
            "creating the session, make them available on every node (spark.executorEnv.*, "
            "a profile or an instance role), or pass them as storage_options."
        )


@dataclass(frozen=True)
class TableLocation:
    """A table root plus the storage options needed to reach it.

    Plain values only: a location pickles to executors, which build their clients lazily.

    Attributes:
        uri: normalised table URI: an absolute local path or a ``scheme://`` URL.
        storage_options: delta-rs style options (canonical names, with non-secret S3 settings
            resolved from the environment at construction); ``repr`` hides secret values.
    """

    uri: str
    storage_options: StorageOptions = field(default_factory=StorageOptions)

    def __post_init__(self) -> None:
        if not isinstance(self.storage_options, StorageOptions):
            object.__setattr__(self, "storage_options", StorageOptions(self.storage_options))

    @classmethod
    def of(
        cls,
        table_uri: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> TableLocation:
        """Build a location, resolving and validating its options.

        Args:
            table_uri: local path, ``file://`` or ``s3://bucket/prefix`` URL (any scheme delta-rs
                and fsspec both understand is passed through).
            storage_options: delta-rs style options; see the module docstring.
            environ: the environment to resolve defaults from (``os.environ`` by default).

        Raises:
            ConfigurationError: an option is unknown, Hadoop-style, malformed, given twice
                with different values, an ``http://`` endpoint is used without
                ``AWS_ALLOW_HTTP``, or an S3 URI names no bucket. Nothing is contacted or
                written.
        """
        uri = _normalize(str(table_uri))
        scheme = urlparse(uri).scheme if "://" in uri else "file"
        options = _canonicalize(storage_options or {}, scheme)
        if scheme in _S3_SCHEMES:
            if not urlparse(uri).netloc:
                raise ConfigurationError(f"S3 table URI {table_uri!r} names no bucket")
            options = _resolve_s3(options, os.environ if environ is None else environ)
        return cls(uri, StorageOptions(options))

    @property
    def scheme(self) -> str:
        parsed = urlparse(self.uri)
        return parsed.scheme if "://" in self.uri else "file"

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def is_s3(self) -> bool:
        return self.scheme in _S3_SCHEMES

    @property
    def bucket(self) -> str:
        """The bucket (or host part) of a URL location; empty for local paths."""
        return urlparse(self.uri).netloc if "://" in self.uri else ""

    @property
    def key_prefix(self) -> str:
        """The table root inside its bucket, without leading or trailing slash."""
        return urlparse(self.uri).path.strip("/") if "://" in self.uri else self.uri

    @property
    def endpoint(self) -> str:
        """Human-readable name of the S3 endpoint this location talks to (no secrets)."""
        if not self.is_s3:
            return self.scheme
        endpoint = self.storage_options.get("AWS_ENDPOINT_URL")
        if endpoint:
            return endpoint.rstrip("/")
        region = self.storage_options.get("AWS_REGION", "default region")
        return f"AWS S3 ({region})"

    def redacted_options(self) -> dict[str, str]:
        """The storage options with secret values replaced by ``***`` (safe to log)."""
        return self.storage_options.redacted()

    def resolve_credentials(self) -> ResolvedCredentials:
        """The S3 credentials this process uses: the explicit ones of the storage options, else
        those botocore's standard chain resolves here and now (a fresh resolution each call,
        so credentials that expire are renewed by calling again).

        Raises:
            ConfigurationError: the chain fails (e.g. an unknown profile, a failing
                ``credential_process``); the message names the profile, never a secret.
        """
        opts = self.storage_options
        if opts.get("AWS_ACCESS_KEY_ID") and opts.get("AWS_SECRET_ACCESS_KEY"):
            values = {
                "AWS_ACCESS_KEY_ID": opts["AWS_ACCESS_KEY_ID"],
                "AWS_SECRET_ACCESS_KEY": opts["AWS_SECRET_ACCESS_KEY"],
            }
            if opts.get("AWS_SESSION_TOKEN"):
                values["AWS_SESSION_TOKEN"] = opts["AWS_SESSION_TOKEN"]
            return ResolvedCredentials(values, method=EXPLICIT_CREDENTIALS)
        import botocore.session

        try:
            session = botocore.session.Session(profile=opts.get("AWS_PROFILE"))
            found = session.get_credentials()
            frozen = None if found is None else found.get_frozen_credentials()
        except Exception as err:  # e.g. ProfileNotFound: name the profile, never a secret
            raise ConfigurationError(
                f"cannot resolve AWS credentials for {self.uri}: {type(err).__name__}: {err}"
            ) from err
        if found is None or frozen is None:
            return ResolvedCredentials({}, method=None)  # anonymous / delta-rs's own chain
        values = {
            "AWS_ACCESS_KEY_ID": frozen.access_key,
            "AWS_SECRET_ACCESS_KEY": frozen.secret_key,
        }
        if frozen.token:
            values["AWS_SESSION_TOKEN"] = frozen.token
        # botocore keeps the expiry of refreshable credentials (STS, credential_process, SSO,
        # container and instance roles) only in this private attribute.
        expiry = getattr(found, "_expiry_time", None)
        return ResolvedCredentials(
            values,
            method=str(getattr(found, "method", "") or "unknown"),
            expires_at=expiry.timestamp() if expiry is not None else None,
        )

    def delta_storage_options(
        self, credentials: ResolvedCredentials | None = None
    ) -> dict[str, str]:
        """Options for delta-rs (``DeltaTable(..., storage_options=...)``).

        For S3 the result always names the credentials staging uses (``credentials``, else
        :meth:`resolve_credentials` now) and the connect timeout; ``AWS_PROFILE`` is replaced
        by the credentials it resolves to. delta-rs keeps these values for the life of a
        handle: a long-lived handle must be rebuilt before they expire
        (:attr:`ResolvedCredentials.renew_at`). Contains secrets: never log it.

        Raises:
            ConfigurationError: a named profile cannot be resolved.
        """
        options = dict(self.storage_options)
        if not self.is_s3:
            return options
        options.pop("AWS_PROFILE", None)
        options.update((credentials or self.resolve_credentials()).values)
        options.setdefault("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        return options

    def fsspec_options(self) -> dict[str, Any]:
        """Keyword arguments for the fsspec filesystem of this location's scheme.

        For S3: credentials (only when given explicitly, otherwise botocore's chain resolves the
        same ones), endpoint and region, timeouts and botocore's ``standard`` retry mode
        (capped, jittered exponential backoff on throttling, 5xx and connection errors).
        Contains secrets: never log it.
        """
        if not self.is_s3:
            return {}
        opts = self.storage_options
        kwargs: dict[str, Any] = {}
        for name, key in (
            ("AWS_ACCESS_KEY_ID", "key"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_SESSION_TOKEN", "token"),
            ("AWS_PROFILE", "profile"),
        ):
            if opts.get(name):
                kwargs[key] = opts[name]
        client: dict[str, Any] = {}
        if opts.get("AWS_ENDPOINT_URL"):
            client["endpoint_url"] = opts["AWS_ENDPOINT_URL"]
        if opts.get("AWS_REGION"):
            client["region_name"] = opts["AWS_REGION"]
        if client:
            kwargs["client_kwargs"] = client
        attempts = (
            int(opts["max_retries"]) + 1 if "max_retries" in opts else DEFAULT_S3_MAX_ATTEMPTS
        )
        config: dict[str, Any] = {
            "connect_timeout": parse_duration(
                "connect_timeout", opts.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
            ),
            "retries": {"mode": "standard", "total_max_attempts": attempts},
        }
        if "timeout" in opts:
            config["read_timeout"] = parse_duration("timeout", opts["timeout"])
        virtual = opts.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")
        if virtual is not None:
            style = (
                "virtual" if _parse_bool("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", virtual) else "path"
            )
            config["s3"] = {"addressing_style": style}
        elif opts.get("AWS_ENDPOINT_URL"):
            config["s3"] = {"addressing_style": "path"}  # what delta-rs uses by default
        kwargs["config_kwargs"] = config
        return kwargs

    def upload_filesystem(self) -> fsspec.AbstractFileSystem:
        """An S3 filesystem like :meth:`filesystem` but with botocore's retries off: staged
        uploads are retried and paced by the async writer (``_upload.py``), which has to see
        every throttling answer."""
        options = self.fsspec_options()
        options["config_kwargs"] = {
            **options["config_kwargs"],
            "retries": {"mode": "standard", "total_max_attempts": 1},
        }
        return fsspec.filesystem("s3", **options)

    def filesystem(self) -> fsspec.AbstractFileSystem:
        """The fsspec filesystem for this location, built in the calling process.

        fsspec reuses one instance per distinct set of options within a process.
        """
        protocol = "s3" if self.scheme == "s3a" else self.scheme
        return fsspec.filesystem(protocol, **self.fsspec_options())

    def path(self, relative: str = "") -> str:
        """The fsspec path of ``relative`` (a path relative to the table root)."""
        root = self.uri.split("://", 1)[1] if "://" in self.uri else self.uri
        return f"{root}/{relative}" if relative else root

    def relative(self, path: str) -> str:
        """``path`` (an fsspec path, as listings return them) relative to the table root;
        unchanged if it is not under the root."""
        root = self.path().rstrip("/") + "/"
        return path[len(root) :] if path.startswith(root) else path

    def __repr__(self) -> str:  # never print credentials
        return f"TableLocation({self.uri!r}, storage_options={self.redacted_options()!r})"

    __str__ = __repr__
