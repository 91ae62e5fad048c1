"""Backoff, classification and commit reconciliation (no server needed): the framework's
toolkit (``framework.retry``) with the Delta connector's classifiers."""

from __future__ import annotations

import random
from collections.abc import Callable

import aiohttp
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from s3fs.errors import translate_boto_error

from committers.delta.commit._sequence import classify_delta_commit_error
from committers.delta.storage._s3errors import STAGING_ERRORS, S3ErrorClassifier
from framework.errors import CommitStateUnknownError, ConcurrentWriterError
from framework.retry import Backoff, CommitResult, Verdict, retry_call
from framework.retry import commit_with_reconciliation as reconciling


def commit_with_reconciliation(
    commit: Callable[[], object], **kwargs: object
) -> CommitResult[object]:
    """The toolkit's reconciliation with what the Delta commit sequence gives it: delta-rs's
    commit errors, and S3's for the reads that reconcile."""
    kwargs.setdefault("classify", classify_delta_commit_error)
    kwargs.setdefault("read_classify", STAGING_ERRORS)
    return reconciling(commit, **kwargs)  # type: ignore[arg-type]


def client_error(status: int, code: str, operation: str = "PutObject") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )


class FakeTime:
    """Deterministic clock + sleep: sleeping advances the clock."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(errors: list[BaseException], result: object = "ok") -> Callable[[], object]:
    calls = iter(errors)

    def fn() -> object:
        err = next(calls, None)
        if err is not None:
            raise err
        return result

    return fn


# -- Backoff -----------------------------------------------------------------------------------


def test_backoff_caps_are_exponential_and_capped() -> None:
    backoff = Backoff(max_attempts=8, initial_delay=0.1, max_delay=1.0, multiplier=2.0)
    assert [backoff.cap(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.cap(10_000) == 1.0


def test_backoff_delays_are_full_jitter_within_caps_and_deterministic_per_seed() -> None:
    backoff = Backoff(max_attempts=6, initial_delay=0.1, max_delay=0.5)
    delays = list(backoff.delays(random.Random(42)))
    assert len(delays) == 5
    assert all(0 <= d <= backoff.cap(n) for n, d in enumerate(delays))
    assert delays == list(backoff.delays(random.Random(42)))
    assert delays != list(backoff.delays(random.Random(43)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"initial_delay": -1},
        {"initial_delay": 2.0, "max_delay": 1.0},
        {"multiplier": 0.5},
        {"deadline": 0},
    ],
)
def test_backoff_rejects_bad_values(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)  # type: ignore[arg-type]


# -- classification ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("err", "verdict"),
    [
        (client_error(503, "SlowDown"), Verdict.RETRY),
        (client_error(500, "InternalError"), Verdict.RETRY),
        (client_error(503, "ServiceUnavailable"), Verdict.RETRY),
        (client_error(429, "TooManyRequests"), Verdict.RETRY),
        (client_error(400, "RequestTimeout"), Verdict.RETRY),
        (client_error(403, "AccessDenied"), Verdict.FAIL),
        (client_error(403, "SignatureDoesNotMatch"), Verdict.FAIL),
        (client_error(404, "NoSuchBucket"), Verdict.FAIL),
        (client_error(412, "PreconditionFailed"), Verdict.FAIL),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), Verdict.RETRY),
        (ConnectionClosedError(endpoint_url="http://x"), Verdict.RETRY),
        (ReadTimeoutError(endpoint_url="http://x"), Verdict.RETRY),
        (aiohttp.ServerDisconnectedError(), Verdict.RETRY),
        (ConnectionResetError(), Verdict.RETRY),
        (TimeoutError(), Verdict.RETRY),
        (ValueError("bad input"), Verdict.FAIL),
        (FileNotFoundError("x"), Verdict.FAIL),
    ],
)
def test_staging_classifier(err: BaseException, verdict: Verdict) -> None:
    assert STAGING_ERRORS(err) is verdict


def test_classifier_sees_through_s3fs_translated_errors() -> None:
    for status, code, verdict in [
        (503, "SlowDown", Verdict.RETRY),
        (500, "InternalError", Verdict.RETRY),
        (403, "AccessDenied", Verdict.FAIL),
    ]:
        original = client_error(status, code)
        try:
            raise translate_boto_error(original) from original
        except OSError as translated:
            assert STAGING_ERRORS(translated) is verdict
            assert STAGING_ERRORS.response_of(translated) == (status, code)


def test_transport_verdict_is_a_value() -> None:
    conditional = S3ErrorClassifier(transport=Verdict.UNKNOWN)
    dropped = ConnectionClosedError(endpoint_url="http://x")
    refused = EndpointConnectionError(endpoint_url="http://x")
    assert conditional(dropped) is Verdict.UNKNOWN
    assert conditional(refused) is Verdict.RETRY  # never sent: always safe to repeat
    assert conditional.never_sent(refused)
    assert not conditional.never_sent(dropped)
    assert STAGING_ERRORS(dropped) is Verdict.RETRY


def test_custom_retryable_sets() -> None:
    strict = S3ErrorClassifier(retryable_status=frozenset(), retryable_codes=frozenset())
    assert strict(client_error(503, "SlowDown")) is Verdict.FAIL


def test_delta_commit_classifier() -> None:
    from deltalake.exceptions import (
        CommitFailedError,
        DeltaError,
        DeltaProtocolError,
        SchemaMismatchError,
    )

    assert classify_delta_commit_error(CommitFailedError("Concurrent transaction")) is (
        Verdict.UNKNOWN
    )
    assert classify_delta_commit_error(OSError("Generic S3 error")) is Verdict.UNKNOWN
    assert classify_delta_commit_error(DeltaProtocolError("x")) is Verdict.FAIL
    assert classify_delta_commit_error(SchemaMismatchError("x")) is Verdict.FAIL
    # e.g. "Invalid table version" from a handle older than cleaned-up log files: the txn
    # decides whether the commit landed, so it is reconciled, not failed or blindly repeated.
    assert classify_delta_commit_error(DeltaError("x")) is Verdict.UNKNOWN
    assert classify_delta_commit_error(ValueError("x")) is Verdict.FAIL


# -- retry_call --------------------------------------------------------------------------------


def test_retry_call_retries_then_succeeds() -> None:
    t = FakeTime()
    fn = failing([client_error(503, "SlowDown"), ConnectionResetError()])
    result = retry_call(
        fn,
        classify=STAGING_ERRORS,
        backoff=Backoff(max_attempts=3, initial_delay=0.1, max_delay=1.0),
        rng=random.Random(1),
        sleep=t.sleep,
        clock=t.clock,
    )
    assert result == "ok"
    assert len(t.sleeps) == 2
    assert 0 <= t.sleeps[0] <= 0.1 and 0 <= t.sleeps[1] <= 0.2


def test_retry_call_gives_up_after_max_attempts_with_the_last_error() -> None:
    t = FakeTime()
    errors: list[BaseException] = [client_error(503, "SlowDown") for _ in range(3)]
    last = client_error(500, "InternalError")
    with pytest.raises(ClientError) as caught:
        retry_call(
            failing([*errors, last]),
            classify=STAGING_ERRORS,
            backoff=Backoff(max_attempts=4),
            sleep=t.sleep,
            clock=t.clock,
        )
    assert caught.value is last
    assert len(t.sleeps) == 3


def test_retry_call_fails_fast_on_permanent_errors() -> None:
    t = FakeTime()
    denied = client_error(403, "AccessDenied")
    with pytest.raises(ClientError) as caught:
        retry_call(failing([denied]), classify=STAGING_ERRORS, sleep=t.sleep, clock=t.clock)
    assert caught.value is denied
    assert t.sleeps == []


def test_retry_call_respects_the_deadline() -> None:
    t = FakeTime()
    errors: list[BaseException] = [client_error(503, "SlowDown") for _ in range(100)]
    with pytest.raises(ClientError):
        retry_call(
            failing(errors),
            classify=STAGING_ERRORS,
            backoff=Backoff(max_attempts=100, initial_delay=1.0, max_delay=1.0, deadline=5.0),
            rng=random.Random(0),
            sleep=t.sleep,
            clock=t.clock,
        )
    assert t.now <= 5.0
    assert len(t.sleeps) < 99


def test_retry_call_never_retries_unknown_outcomes() -> None:
    t = FakeTime()
    dropped = ConnectionClosedError(endpoint_url="http://x")
    with pytest.raises(ConnectionClosedError):
        retry_call(
            failing([dropped]),
            classify=S3ErrorClassifier(transport=Verdict.UNKNOWN),
            sleep=t.sleep,
            clock=t.clock,
        )
    assert t.sleeps == []


def test_retry_call_does_not_swallow_keyboard_interrupt() -> None:
    def classify(_: BaseException) -> Verdict:
        return Verdict.RETRY

    with pytest.raises(KeyboardInterrupt):
        retry_call(failing([KeyboardInterrupt()]), classify=classify, sleep=lambda _: None)


# -- commit_with_reconciliation ----------------------------------------------------------------


class FakeTable:
    """A destination whose commit may land although the call fails."""

    def __init__(self, outcomes: list[tuple[bool, BaseException | None]]) -> None:
        self.outcomes = list(outcomes)  # per attempt: (lands?, error raised to the caller)
        self.commits = 0
        self.calls = 0
        self.reads = 0

    def commit(self) -> str:
        self.calls += 1
        lands, error = self.outcomes.pop(0)
        if lands:
            self.commits += 1
        if error is not None:
            raise error
        return "version-1"

    def is_committed(self) -> bool:
        self.reads += 1
        return self.commits > 0


def test_commit_succeeds_first_time() -> None:
    table = FakeTable([(True, None)])
    result = commit_with_reconciliation(table.commit, is_committed=table.is_committed)
    assert (result.value, result.attempts, result.reconciled) == ("version-1", 1, False)
    assert table.commits == 1 and table.reads == 0


def test_dropped_connection_after_landing_is_reconciled_not_repeated() -> None:
    from deltalake.exceptions import CommitFailedError

    t = FakeTime()
    table = FakeTable([(True, CommitFailedError("Concurrent transaction failed"))])
    result = commit_with_reconciliation(
        table.commit, is_committed=table.is_committed, sleep=t.sleep, clock=t.clock
    )
    assert result.reconciled and result.value is None and result.attempts == 1
    assert table.commits == 1 and table.calls == 1


def test_unknown_outcome_not_landed_is_retried_once_landed() -> None:
    t = FakeTime()
    table = FakeTable([(False, OSError("Generic S3 error")), (True, None)])
    result = commit_with_reconciliation(
        table.commit, is_committed=table.is_committed, sleep=t.sleep, clock=t.clock
    )
    assert (result.value, result.attempts, result.reconciled) == ("version-1", 2, False)
    assert table.commits == 1 and table.reads == 1


def test_permanent_commit_error_is_raised_without_reconciling() -> None:
    from deltalake.exceptions import DeltaProtocolError

    table = FakeTable([(False, DeltaProtocolError("bad"))])
    with pytest.raises(DeltaProtocolError):
        commit_with_reconciliation(table.commit, is_committed=table.is_committed)
    assert table.reads == 0


def test_unknown_outcome_until_attempts_run_out_raises_commit_state_unknown() -> None:
    t = FakeTime()
    table = FakeTable([(False, OSError("x")) for _ in range(3)])
    with pytest.raises(CommitStateUnknownError, match="may still land"):
        commit_with_reconciliation(
            table.commit,
            is_committed=table.is_committed,
            backoff=Backoff(max_attempts=3),
            sleep=t.sleep,
            clock=t.clock,
        )
    assert table.calls == 3 and table.commits == 0


def test_reconciliation_read_failure_raises_commit_state_unknown() -> None:
    t = FakeTime()
    table = FakeTable([(True, OSError("dropped"))])

    def unreadable() -> bool:
        raise client_error(403, "AccessDenied", "GetObject")

    with pytest.raises(CommitStateUnknownError, match="may or may not have landed"):
        commit_with_reconciliation(table.commit, is_committed=unreadable, sleep=t.sleep)
    assert table.calls == 1


def test_reconciliation_read_is_retried_on_transient_errors() -> None:
    t = FakeTime()
    table = FakeTable([(True, OSError("dropped"))])
    reads = failing([client_error(503, "SlowDown")], result=True)
    result = commit_with_reconciliation(
        table.commit, is_committed=reads, sleep=t.sleep, clock=t.clock
    )
    assert result.reconciled and table.calls == 1


def test_concurrent_writer_from_reconciliation_passes_through() -> None:
    table = FakeTable([(False, OSError("dropped"))])

    def other_writer() -> bool:
        raise ConcurrentWriterError("another instance of app-1 committed epoch 3")

    with pytest.raises(ConcurrentWriterError):
        commit_with_reconciliation(table.commit, is_committed=other_writer, sleep=lambda _: None)


def test_retryable_commit_error_is_retried_without_reading() -> None:
    t = FakeTime()

    def classify(err: BaseException) -> Verdict:
        return Verdict.RETRY if isinstance(err, ConnectionRefusedError) else Verdict.FAIL

    table = FakeTable([(False, ConnectionRefusedError()), (True, None)])
    result = commit_with_reconciliation(
        table.commit, is_committed=table.is_committed, classify=classify, sleep=t.sleep
    )
    assert result.attempts == 2 and table.reads == 0 and table.commits == 1


@pytest.mark.parametrize(
    ("err", "retryable", "throttled"),
    [
        (client_error(503, "SlowDown"), True, True),
        (client_error(429, "TooManyRequests"), True, True),
        (client_error(400, "Throttling"), True, True),
        (client_error(500, "InternalError"), True, False),
        (ConnectionClosedError(endpoint_url="http://x"), True, False),
        (TimeoutError(), True, False),  # the async writer's request timeout
        (client_error(403, "AccessDenied"), False, False),
        (client_error(404, "NoSuchBucket"), False, False),
        (ValueError("a bug"), False, False),
    ],
)
def test_upload_classifier_tells_throttling_to_the_rate_limiter(
    err: BaseException, retryable: bool, throttled: bool
) -> None:
    verdict = STAGING_ERRORS.classify(err)
    assert (verdict.retryable, verdict.throttled) == (retryable, throttled)
    assert not verdict.caused_by_entries  # a refused part is never the data's fault
