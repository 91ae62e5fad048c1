"""TableLocation for S3: one set of options, translated consistently for s3fs and delta-rs."""

from __future__ import annotations

import logging
import pickle
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from committers.delta.storage._storage import (
    CREDENTIAL_RENEW_MARGIN,
    DEFAULT_S3_MAX_ATTEMPTS,
    CredentialIdentity,
    ResolvedCredentials,
    StorageOptions,
    TableLocation,
    parse_duration,
)
from framework.errors import ConfigurationError
from integration_tests._s3server import S3Server

SECRET = "s3cr3t-value-never-printed"
TOKEN = "t0ken-value-never-printed"
FULL = {
    "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY",
    "AWS_SECRET_ACCESS_KEY": SECRET,
    "AWS_SESSION_TOKEN": TOKEN,
    "AWS_REGION": "eu-west-1",
    "AWS_ALLOW_HTTP": "true",
}
_AWS_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
)


@pytest.fixture
def clean_aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No AWS settings from the machine; never ask an instance-metadata endpoint."""
    for name in _AWS_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    return tmp_path


# -- translation (no server) -------------------------------------------------------------------


def test_one_set_of_options_reaches_both_sides(clean_aws_env: Path) -> None:
    location = TableLocation.of("s3://bucket/path/table/", FULL)
    assert location.uri == "s3://bucket/path/table"
    assert (location.bucket, location.key_prefix) == ("bucket", "path/table")
    assert location.endpoint == "http://127.0.0.1:9000"
    delta = location.delta_storage_options()
    for name, value in FULL.items():
        assert delta[name] == value
    assert delta["connect_timeout"] == "5s"
    fs = location.fsspec_options()
    assert (fs["key"], fs["secret"], fs["token"]) == ("AKIAEXAMPLEKEY", SECRET, TOKEN)
    assert fs["client_kwargs"] == {
        "endpoint_url": "http://127.0.0.1:9000",
        "region_name": "eu-west-1",
    }
    assert fs["config_kwargs"]["connect_timeout"] == 5.0
    assert fs["config_kwargs"]["retries"] == {
        "mode": "standard",
        "total_max_attempts": DEFAULT_S3_MAX_ATTEMPTS,
    }
    assert fs["config_kwargs"]["s3"] == {"addressing_style": "path"}


def test_aliases_and_case_are_normalised(clean_aws_env: Path) -> None:
    location = TableLocation.of(
        "s3a://b/t",
        {
            "endpoint_url": "https://s3.example.com",
            "aws_access_key_id": "K",
            "secret_access_key": "S",
            "region": "us-west-2",
            "timeout": "10s",
            "max_retries": 2,
            "connect_timeout": "750ms",
        },
    )
    assert location.scheme == "s3a" and location.is_s3
    assert dict(location.storage_options) == {
        "AWS_ENDPOINT_URL": "https://s3.example.com",
        "AWS_ACCESS_KEY_ID": "K",
        "AWS_SECRET_ACCESS_KEY": "S",
        "AWS_REGION": "us-west-2",
        "timeout": "10s",
        "max_retries": "2",
        "connect_timeout": "750ms",
    }
    config = location.fsspec_options()["config_kwargs"]
    assert config["read_timeout"] == 10.0
    assert config["connect_timeout"] == 0.75
    assert config["retries"]["total_max_attempts"] == 3  # the first try and 2 retries


def test_two_spellings_with_different_values_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="both set AWS_ENDPOINT_URL"):
        TableLocation.of("s3://b/t", {"AWS_ENDPOINT_URL": "http://a", "endpoint": "http://b"})


def test_plain_http_needs_allow_http(clean_aws_env: Path) -> None:
    with pytest.raises(ConfigurationError, match="AWS_ALLOW_HTTP"):
        TableLocation.of("s3://b/t", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"})
    with pytest.raises(ConfigurationError, match="http:// or https://"):
        TableLocation.of("s3://b/t", {"AWS_ENDPOINT_URL": "127.0.0.1:9000"})


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"connect_timeout": "soon"}, "duration"),
        ({"max_retries": "-1"}, "non-negative"),
        ({"AWS_ALLOW_HTTP": "maybe"}, "'true' or 'false'"),
        ({"AWS_REGION": ["eu-west-1"]}, "must be a string"),
    ],
)
def test_malformed_options(clean_aws_env: Path, options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        TableLocation.of("s3://b/t", options)


def test_s3_uri_needs_a_bucket() -> None:
    with pytest.raises(ConfigurationError, match="names no bucket"):
        TableLocation.of("s3:///t", {})


def test_durations() -> None:
    assert [parse_duration("x", v) for v in ("5s", "250ms", "1m", "3", "1.5 s")] == [
        5.0,
        0.25,
        60.0,
        3.0,
        1.5,
    ]


def test_non_secret_settings_come_from_the_environment(
    clean_aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9999")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "ap-south-1")
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    location = TableLocation.of("s3://b/t")
    # resolved once, and carried with the location (so executors use the same endpoint) ...
    assert dict(location.storage_options) == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9999",
        "AWS_REGION": "ap-south-1",
        "AWS_ALLOW_HTTP": "true",
    }
    # ... but credentials are never copied out of the environment into the location
    assert SECRET not in repr(pickle.loads(pickle.dumps(location)).storage_options._data)
    # delta-rs is handed what botocore resolves in this process: the same identity as s3fs
    delta = location.delta_storage_options()
    assert (delta["AWS_ACCESS_KEY_ID"], delta["AWS_SECRET_ACCESS_KEY"]) == ("ENVKEY", SECRET)
    assert "key" not in location.fsspec_options()  # s3fs resolves the same chain itself


def test_s3_specific_endpoint_variable_wins(
    clean_aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://general.example.com")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "https://s3.example.com")
    assert TableLocation.of("s3://b/t").endpoint == "https://s3.example.com"
    explicit = TableLocation.of("s3://b/t", {"AWS_ENDPOINT_URL": "https://mine.example.com"})
    assert explicit.endpoint == "https://mine.example.com"


def _write_profile(directory: Path, name: str, key: str, secret: str, region: str) -> None:
    (directory / "credentials").write_text(
        f"[{name}]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n"
    )
    (directory / "config").write_text(f"[profile {name}]\nregion = {region}\n")


def test_profile_is_resolved_for_delta_rs(
    clean_aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_profile(clean_aws_env, "lake", "PROFILEKEY", SECRET, "eu-north-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(clean_aws_env / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(clean_aws_env / "config"))
    location = TableLocation.of("s3://b/t", {"AWS_PROFILE": "lake"})
    assert location.storage_options["AWS_REGION"] == "eu-north-1"
    delta = location.delta_storage_options()
    assert "AWS_PROFILE" not in delta  # delta-rs does not read profiles: it gets the keys
    assert (delta["AWS_ACCESS_KEY_ID"], delta["AWS_SECRET_ACCESS_KEY"]) == ("PROFILEKEY", SECRET)
    assert location.fsspec_options()["profile"] == "lake"


def test_unknown_profile_is_a_configuration_error(clean_aws_env: Path) -> None:
    location = TableLocation.of("s3://b/t", {"AWS_PROFILE": "nope", "AWS_REGION": "us-east-1"})
    with pytest.raises(ConfigurationError, match="cannot resolve AWS credentials"):
        location.delta_storage_options()


def test_expiring_credentials_say_when_to_renew(clean_aws_env: Path) -> None:
    """A credential_process key with an Expiration is resolved with it, and renewed after half
    its lifetime, or CREDENTIAL_RENEW_MARGIN before it expires, whichever is first."""
    from integration_tests._rotating_credentials import PROFILE, RotatingCredentials

    rotating = RotatingCredentials((("AKIATEMPORARY0001", "secret-1"),), 3600.0, clean_aws_env)
    location = TableLocation.of(
        "s3://b/t",
        {"AWS_PROFILE": PROFILE, "AWS_REGION": "us-east-1"},
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_CONFIG_FILE", str(rotating.config))
        resolved = location.resolve_credentials()
    assert resolved.method == "custom-process"
    assert resolved.identity == CredentialIdentity("custom-process", "AKIATEMPORARY0001")
    assert resolved.expires_at == pytest.approx(rotating.start + 7200.0, abs=1.0)
    assert resolved.renew_at == pytest.approx(resolved.expires_at - CREDENTIAL_RENEW_MARGIN)
    assert "secret-1" not in repr(resolved)
    short = ResolvedCredentials({}, method="sso", expires_at=1010.0, resolved_at=1000.0)
    assert short.renew_at == 1005.0
    assert ResolvedCredentials({}, method="env").renew_at is None


@pytest.mark.parametrize(
    ("driver", "task", "accepted"),
    [
        (("env", "AKIADRIVERKEY0001"), ("env", "AKIADRIVERKEY0001"), True),
        (("env", "AKIADRIVERKEY0001"), (None, None), False),
        (("env", "AKIADRIVERKEY0001"), ("shared-credentials-file", "AKIAOTHERKEY00002"), False),
        (("iam-role", "ASIADRIVER000001"), ("iam-role", "ASIATASK00000002"), True),
        (("custom-process", "ASIADRIVER000001"), (None, None), False),
        (("explicit", "AKIADRIVERKEY0001"), (None, None), True),
        ((None, None), (None, None), True),
    ],
)
def test_executors_must_stage_as_the_driver_commits(driver, task, accepted) -> None:
    check = lambda: CredentialIdentity(*task).check_same_principal(  # noqa: E731
        CredentialIdentity(*driver), "s3://b/t"
    )
    if accepted:
        check()
    else:
        with pytest.raises(ConfigurationError, match="after the SparkSession started"):
            check()


def test_no_credentials_anywhere_leaves_them_out(clean_aws_env: Path) -> None:
    location = TableLocation.of("s3://b/t", {"AWS_REGION": "us-east-1"})
    assert "AWS_ACCESS_KEY_ID" not in location.delta_storage_options()


def test_secrets_never_in_repr_str_or_logs(
    clean_aws_env: Path, caplog: pytest.LogCaptureFixture
) -> None:
    location = TableLocation.of("s3://b/t", FULL)
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("test").info("location %s %r", location, location.storage_options)
    for text in (repr(location), str(location), repr(location.storage_options), caplog.text):
        assert SECRET not in text and TOKEN not in text
        assert "AKIAEXAMPLEKEY" not in text
    assert location.redacted_options()["AWS_SECRET_ACCESS_KEY"] == "***"
    assert location.redacted_options()["AWS_ACCESS_KEY_ID"] == "AKIA***"
    assert location.redacted_options()["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"


def test_location_pickles_as_plain_values(clean_aws_env: Path) -> None:
    location = TableLocation.of("s3://b/t", FULL)
    restored = pickle.loads(pickle.dumps(location))
    assert restored == location and hash(restored) == hash(location)
    assert isinstance(restored.storage_options, StorageOptions)
    assert restored.delta_storage_options() == location.delta_storage_options()


def test_local_locations_take_no_options(tmp_path: Path) -> None:
    location = TableLocation.of(str(tmp_path / "t"))
    assert location.is_local and not location.is_s3
    assert location.delta_storage_options() == {}
    assert location.fsspec_options() == {}
    assert location.endpoint == "file"
    with pytest.raises(ConfigurationError, match="local paths take no storage options"):
        TableLocation.of(str(tmp_path / "t"), {"anything": "x"})


@pytest.mark.parametrize(
    ("name", "equivalent"),
    [
        ("fs.s3a.endpoint", "AWS_ENDPOINT_URL"),
        ("spark.hadoop.fs.s3a.access.key", "AWS_ACCESS_KEY_ID"),
        ("fs.s3a.secret.key", "AWS_SECRET_ACCESS_KEY"),
        ("fs.s3a.path.style.access", "AWS_VIRTUAL_HOSTED_STYLE_REQUEST"),
        ("fs.s3a.fast.upload", "options this sink understands are AWS_ENDPOINT_URL"),
    ],
)
def test_hadoop_option_names_are_refused_with_their_equivalent(
    clean_aws_env: Path, name: str, equivalent: str
) -> None:
    with pytest.raises(ConfigurationError, match="Hadoop file system setting") as caught:
        TableLocation.of("s3a://b/t", {name: "x", "AWS_REGION": "eu-west-1"})
    assert equivalent in str(caught.value)


def test_unknown_s3_option_is_refused(clean_aws_env: Path) -> None:
    with pytest.raises(ConfigurationError, match="unknown storage option 'AWS_ENDPONT_URL'"):
        TableLocation.of("s3://b/t", {"AWS_ENDPONT_URL": "https://s3.example.com"})


def test_options_of_other_schemes_pass_through() -> None:
    location = TableLocation.of("gs://bucket/t", {"google_service_account": "x"})
    assert location.delta_storage_options() == {"google_service_account": "x"}


# -- both sides against the session's S3 server (root conftest.py) ----------------------------


def _roundtrip(location: TableLocation) -> list[int]:
    """Stage a file through s3fs and commit a Delta table through delta-rs at ``location``."""
    fs = location.filesystem()
    fs.pipe_file(location.path("_sink_staging/hello.txt"), b"hello")
    assert fs.cat_file(location.path("_sink_staging/hello.txt")) == b"hello"
    options = location.delta_storage_options()
    write_deltalake(location.uri, pa.table({"id": [1, 2, 3]}), storage_options=options)
    table = DeltaTable(location.uri, storage_options=options).to_pyarrow_dataset().to_table()
    return sorted(table["id"].to_pylist())


@pytest.mark.integration
def test_explicit_options_on_both_sides(s3: S3Server, bucket: str) -> None:
    location = TableLocation.of(f"s3://{bucket}/{uuid.uuid4().hex}", s3.storage_options())
    assert _roundtrip(location) == [1, 2, 3]


@pytest.mark.integration
def test_environment_only_on_both_sides(
    s3: S3Server, bucket: str, clean_aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_ALLOW_HTTP", "true")
    monkeypatch.setenv("AWS_REGION", s3.region)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    location = TableLocation.of(f"s3://{bucket}/{uuid.uuid4().hex}")
    assert _roundtrip(location) == [1, 2, 3]


@pytest.mark.integration
def test_profile_on_both_sides(
    s3: S3Server, bucket: str, clean_aws_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write_profile(clean_aws_env, "it", s3.access_key, s3.secret_key, s3.region)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(clean_aws_env / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(clean_aws_env / "config"))
    location = TableLocation.of(
        f"s3://{bucket}/{uuid.uuid4().hex}",
        {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_PROFILE": "it"},
    )
    assert _roundtrip(location) == [1, 2, 3]


def test_raw_delta_rs_error_text_is_made_plain():
    from committers.delta.table._table import plain_error_text

    raw = OSError(
        "\x1b[31mGeneric S3 error\x1b[0m: Error performing GET: response error "
        '"<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
        '<Message>Access Denied.</Message><Resource>/b/t</Resource></Error>"'
    )
    assert plain_error_text(raw) == (
        "Generic S3 error: Error performing GET: response error: AccessDenied: Access Denied."
    )
