"""Every bad buffering hint, retry policy or strategy parameter is rejected at construction."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from framework.asyncsink import (
    AIMDScalingStrategy,
    AsyncSinkWriterConfig,
    CongestionControlRateLimitingStrategy,
    JsonLinesDeadLetterQueue,
    PacingRateLimitingStrategy,
    RetryPolicy,
)
from framework.asyncsink._config import (
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_BUFFERED_REQUESTS,
    DEFAULT_MAX_IN_FLIGHT_REQUESTS,
)
from framework.errors import ConfigurationError


def test_defaults_are_the_named_constants_and_valid():
    config = AsyncSinkWriterConfig()
    assert config.max_batch_size == DEFAULT_MAX_BATCH_SIZE
    assert config.max_in_flight_requests == DEFAULT_MAX_IN_FLIGHT_REQUESTS
    assert config.max_buffered_requests == DEFAULT_MAX_BUFFERED_REQUESTS
    RetryPolicy()


def test_config_is_frozen_and_keyword_only():
    config = AsyncSinkWriterConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_batch_size = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        AsyncSinkWriterConfig(10)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be a positive integer, got 0"),
        ({"max_batch_size": True}, "max_batch_size must be a positive integer, got True"),
        ({"max_batch_size": 2.5}, "max_batch_size must be a positive integer"),
        ({"max_in_flight_requests": -1}, "max_in_flight_requests must be a positive integer"),
        ({"max_buffered_requests": 0}, "max_buffered_requests must be a positive integer"),
        ({"max_batch_size_in_bytes": 0}, "max_batch_size_in_bytes must be a positive integer"),
        ({"max_time_in_buffer_ms": 0}, "max_time_in_buffer_ms must be a positive integer"),
        ({"max_record_size_in_bytes": 0}, "max_record_size_in_bytes must be a positive integer"),
        ({"request_timeout_ms": 0}, "request_timeout_ms must be a positive integer"),
        (
            {"max_batch_size": 100, "max_buffered_requests": 100},
            r"max_buffered_requests \(100\) must be greater than max_batch_size \(100\).*raise "
            r"max_buffered_requests or lower max_batch_size",
        ),
        (
            {"max_batch_size_in_bytes": 1000, "max_record_size_in_bytes": 1001},
            r"max_record_size_in_bytes \(1001\) must not exceed max_batch_size_in_bytes \(1000\)",
        ),
    ],
)
def test_each_bad_writer_config_is_rejected_with_what_to_fix(overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        AsyncSinkWriterConfig(**overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be a positive integer.*never retry"),
        ({"initial_backoff_ms": 0}, "initial_backoff_ms must be a positive finite number"),
        ({"initial_backoff_ms": math.inf}, "initial_backoff_ms must be a positive finite"),
        ({"max_backoff_ms": -5}, "max_backoff_ms must be a positive finite number"),
        (
            {"initial_backoff_ms": 500, "max_backoff_ms": 100},
            r"max_backoff_ms \(100\) must be at least initial_backoff_ms \(500\)",
        ),
        ({"backoff_multiplier": 0.5}, "backoff_multiplier must be >= 1"),
        ({"jitter": 1.5}, r"jitter must be a fraction between 0 \(no jitter\) and 1"),
        ({"jitter": -0.1}, "jitter must be a fraction"),
        ({"max_retry_after_ms": 0}, "max_retry_after_ms must be a positive finite number"),
    ],
)
def test_each_bad_retry_policy_is_rejected(overrides, message):
    with pytest.raises(ConfigurationError, match=message):
        RetryPolicy(**overrides)


def test_backoff_without_jitter_is_exact_and_capped():
    policy = RetryPolicy(initial_backoff_ms=100, max_backoff_ms=1_000, jitter=0)
    rng = random.Random(0)
    assert [policy.backoff_s(n, rng) for n in range(1, 7)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert policy.backoff_s(10_000, rng) == 1.0  # no overflow on absurd attempt counts


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rate_threshold": 0}, "rate_threshold must be positive"),
        ({"rate_threshold": 10, "increase_rate": 0}, "increase_rate must be positive"),
        ({"rate_threshold": 10, "decrease_factor": 1.0}, "decrease_factor must lie strictly"),
        ({"rate_threshold": 10, "decrease_factor": 0.0}, "decrease_factor must lie strictly"),
        ({"rate_threshold": 1.5}, "rate_threshold must be an int"),
    ],
)
def test_bad_aimd_parameters_are_rejected(kwargs, message):
    with pytest.raises(ConfigurationError, match=message):
        AIMDScalingStrategy(**kwargs)


def test_bad_congestion_control_parameters_are_rejected():
    scaling = AIMDScalingStrategy(rate_threshold=10)
    with pytest.raises(ConfigurationError, match="max_in_flight_requests must be positive"):
        CongestionControlRateLimitingStrategy(
            max_in_flight_requests=0, initial_max_in_flight_messages=1, scaling_strategy=scaling
        )
    with pytest.raises(ConfigurationError, match="initial_max_in_flight_messages must be"):
        CongestionControlRateLimitingStrategy(
            max_in_flight_requests=1, initial_max_in_flight_messages=0, scaling_strategy=scaling
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_in_flight_requests": 0}, "max_in_flight_requests must be positive"),
        ({"max_batch_size": 0}, "max_batch_size must be positive"),
        ({"initial_rate": 0.0}, "initial_rate must be a positive number"),
        ({"headroom": 1.0}, r"headroom must be in \[0, 1\)"),
        ({"max_decrease": 1.0}, r"max_decrease must be in \(0, 1\)"),
        ({"probe_gain": 0.0}, r"probe_gain must be in \(0, 1\]"),
        ({"estimation_window_s": 0.0}, "estimation_window_s must be a positive number"),
        ({"min_rate": -1.0}, "min_rate must be positive"),
        ({"latency_factor": 1.0}, "latency_factor must be greater than 1"),
    ],
)
def test_bad_pacing_parameters_are_rejected(kwargs, message):
    values = {"max_in_flight_requests": 4, "max_batch_size": 10, **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        PacingRateLimitingStrategy(**values)


def test_bad_dead_letter_queue_settings_are_rejected():
    with pytest.raises(ConfigurationError, match="non-empty fsspec URL"):
        JsonLinesDeadLetterQueue("  ")
    with pytest.raises(ConfigurationError, match="max_letters_per_file must be positive"):
        JsonLinesDeadLetterQueue("memory://dlq", max_letters_per_file=0)
