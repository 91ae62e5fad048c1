"""The public surface of framework.asyncsink is pinned, and it needs neither Spark nor Delta."""

from __future__ import annotations

import subprocess
import sys

import framework.asyncsink
from framework import errors


def test_public_surface_is_pinned():
    assert sorted(framework.asyncsink.__all__) == [
        "AIMDScalingStrategy",
        "AsyncSink",
        "AsyncSinkDeadLetterQueue",
        "AsyncSinkTaskWriter",
        "AsyncSinkWriter",
        "AsyncSinkWriterConfig",
        "BufferedRequestState",
        "BufferedRequestStateSerializer",
        "BytesEntrySerializer",
        "CongestionControlRateLimitingStrategy",
        "DEFAULT_ERROR_CLASSIFIER",
        "DEFAULT_KEY_FIELD",
        "DeadLetter",
        "DeadLetterQueue",
        "DeadLetterWriter",
        "ElementConverter",
        "EntrySerializer",
        "ErrorClassification",
        "ErrorClassifier",
        "IdempotencyKeys",
        "JsonLinesDeadLetterQueue",
        "PacingRateLimitingStrategy",
        "PartialFailure",
        "RateLimitingStrategy",
        "RateLimitingStrategyFactory",
        "RequestEntryWrapper",
        "RequestInfo",
        "ResultInfo",
        "RetryPolicy",
        "Row",
        "ScalingStrategy",
        "SupportsInFlightLimit",
        "SupportsUnblockTime",
        "TypeErrorClassifier",
        "WriterMetrics",
        "json_default",
    ]
    for name in framework.asyncsink.__all__:
        assert getattr(framework.asyncsink, name) is not None, name


def test_asyncsink_imports_without_pyspark_or_deltalake():
    code = (
        "import sys\n"
        "sys.modules['pyspark'] = None\n"
        "sys.modules['deltalake'] = None\n"
        "import framework.asyncsink\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_delivery_errors_separate_signals_from_job_failures():
    assert issubclass(errors.ThrottledError, errors.RetryableDeliveryError)
    assert issubclass(errors.RetryableDeliveryError, errors.DeliveryError)
    assert not issubclass(errors.FatalDeliveryError, errors.RetryableDeliveryError)
    assert not issubclass(errors.RetriesExhaustedError, errors.RetryableDeliveryError)
    assert errors.ThrottledError("x", retry_after_s=1.5).retry_after_s == 1.5
    assert errors.FatalDeliveryError("x").caused_by_entries is True
