"""AsyncSinkWriter: buffering, flushing, back-pressure, retries, dead letters, state, metrics.

No Spark and no network: the destination is a scripted in-memory writer. Every test runs its
own event loop on a virtual clock (``_virtual_clock``): timers fire in their real order but
without waiting, so timing assertions are exact and a loaded machine cannot break them.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from framework.asyncsink import (
    AsyncSinkWriter,
    AsyncSinkWriterConfig,
    BufferedRequestState,
    BufferedRequestStateSerializer,
    BytesEntrySerializer,
    DeadLetter,
    ErrorClassification,
    PacingRateLimitingStrategy,
    PartialFailure,
    RequestEntryWrapper,
    RequestInfo,
    ResultInfo,
    RetryPolicy,
)
from framework.errors import (
    DeliveryError,
    FatalDeliveryError,
    RecordTooLargeError,
    RetriesExhaustedError,
    RetryableDeliveryError,
    SinkError,
    ThrottledError,
)
from framework.sink import deserialize_versioned, serialize_versioned
from framework.tests._virtual_clock import run_on_virtual_clock

FAST_RETRIES = RetryPolicy(max_attempts=5, initial_backoff_ms=1, max_backoff_ms=5, jitter=0)

Behaviour = Callable[[list[bytes], int], Any]
"""(entries, request number) -> entries to retry (or a PartialFailure), or raise."""


class Identity:
    """Entries are the input elements themselves."""

    def apply(self, element: bytes, context: object) -> bytes:
        return element


class Unlimited:
    """A strategy that never blocks nor shrinks batches: only the config's caps apply."""

    def register_in_flight_request(self, request: RequestInfo) -> None:
        pass

    def register_completed_request(self, result: ResultInfo) -> None:
        pass

    def should_block(self, request: RequestInfo) -> bool:
        return False

    def get_max_batch_size(self) -> int:
        return 1_000_000


class ScriptedWriter(AsyncSinkWriter[bytes, bytes]):
    """Records every request; its outcome comes from ``behaviour`` (accept all by default).

    Unless a test passes a rate limiting strategy, none limits it (AIMD would shrink batches
    after a failure and blur what the test checks)."""

    def __init__(self, behaviour: Behaviour | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("element_converter", Identity())
        kwargs.setdefault("rate_limiting_strategy", Unlimited())
        kwargs.setdefault("retry_policy", FAST_RETRIES)
        kwargs.setdefault("rng", random.Random(7))
        super().__init__(**kwargs)
        self.behaviour = behaviour
        self.requests: list[list[bytes]] = []
        self.request_times: list[float] = []
        self.delivered: list[bytes] = []
        self.gate: asyncio.Event | None = None
        self.concurrent = 0
        self.max_concurrent = 0
        self.released = False

    async def submit_request_entries(
        self, entries: list[bytes]
    ) -> Sequence[bytes] | PartialFailure[bytes]:
        number = len(self.requests)
        self.requests.append(list(entries))
        self.request_times.append(asyncio.get_running_loop().time())
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            if self.gate is not None:
                await self.gate.wait()
            result = self.behaviour(entries, number) if self.behaviour else ()
            if asyncio.iscoroutine(result):
                result = await result
        finally:
            self.concurrent -= 1
        failed = result.entries if isinstance(result, PartialFailure) else result
        failed_ids = {id(entry) for entry in failed}
        self.delivered.extend(entry for entry in entries if id(entry) not in failed_ids)
        return result

    def size_in_bytes(self, entry: bytes) -> int:
        return len(entry)

    async def release_resources(self) -> None:
        self.released = True


class ListDeadLetterQueue:
    """Collects dead letters in memory (this process only)."""

    def __init__(self) -> None:
        self.letters: list[DeadLetter] = []
        self.flushes = 0

    def open(self, context: object) -> ListDeadLetterQueue:
        return self

    async def write(self, letters: Sequence[DeadLetter]) -> None:
        self.letters.extend(letters)

    async def flush(self) -> None:
        self.flushes += 1

    async def close(self) -> None:
        pass


def records(count: int, start: int = 0) -> list[bytes]:
    return [b"r%03d" % i for i in range(start, start + count)]


def config(**overrides: Any) -> AsyncSinkWriterConfig:
    values: dict[str, Any] = {
        "max_batch_size": 3,
        "max_in_flight_requests": 4,
        "max_buffered_requests": 100,
        "max_batch_size_in_bytes": 1_000,
        "max_time_in_buffer_ms": 10_000,
        "max_record_size_in_bytes": 100,
        "request_timeout_ms": 1_000,
    }
    values.update(overrides)
    return AsyncSinkWriterConfig(**values)


async def settle() -> None:
    """Let the event loop run every ready callback and task (several hops deep)."""
    for _ in range(20):
        await asyncio.sleep(0)


def run(coroutine: Any) -> Any:
    return run_on_virtual_clock(coroutine, timeout=20)


# --------------------------------------------------------------------------- flushing


def test_full_batches_are_sent_as_soon_as_they_form_and_flush_sends_the_rest():
    async def scenario() -> None:
        writer = ScriptedWriter(config=config())
        await writer.write_many(records(7))
        await settle()
        assert writer.requests == [records(3), records(3, 3)]
        await writer.flush()
        assert writer.requests[2] == records(1, 6)
        assert writer.delivered == records(7)
        await writer.close()

    run(scenario())


def test_byte_threshold_flushes_and_caps_the_request_size():
    async def scenario() -> None:
        # Entries of 4 bytes, threshold 10 bytes: the third entry crosses it, two fit.
        writer = ScriptedWriter(
            config=config(
                max_batch_size=50, max_batch_size_in_bytes=10, max_record_size_in_bytes=10
            )
        )
        await writer.write_many(records(3))
        await settle()
        assert writer.requests == [records(2)]
        await writer.flush()
        assert writer.requests == [records(2), records(1, 2)]
        await writer.close()

    run(scenario())


def test_time_threshold_sends_a_partial_batch_without_flush():
    async def scenario() -> None:
        writer = ScriptedWriter(config=config(max_batch_size=50, max_time_in_buffer_ms=20))
        start = asyncio.get_running_loop().time()
        await writer.write_many(records(2))
        await settle()
        assert writer.requests == []
        await asyncio.sleep(0.019)
        assert writer.requests == []  # not before the 20 ms are up
        await asyncio.sleep(0.002)
        assert writer.requests == [records(2)]
        assert writer.request_times[0] - start == pytest.approx(0.020)
        await writer.close()

    run(scenario())


def test_write_blocks_while_the_buffer_is_full_and_resumes_when_requests_complete():
    async def scenario() -> None:
        writer = ScriptedWriter(
            config=config(max_batch_size=2, max_in_flight_requests=1, max_buffered_requests=4)
        )
        writer.gate = asyncio.Event()
        pending = asyncio.ensure_future(writer.write_many(records(10)))
        await settle()
        # One request of 2 in flight and a full buffer of 4: the write is blocked.
        assert not pending.done()
        assert writer.metrics.buffered_entries == 4
        assert writer.metrics.in_flight_requests == 1
        writer.gate.set()
        await pending
        await writer.flush()
        assert writer.delivered == records(10)
        assert writer.max_concurrent == 1
        await writer.close()

    run(scenario())


def test_single_element_write_converts_through_the_element_converter():
    class Upper:
        def apply(self, element: str, context: object) -> bytes:
            return element.upper().encode()

    async def scenario() -> None:
        writer = ScriptedWriter(config=config(), element_converter=Upper())
        await writer.write("a")
        await writer.write_many(["b", "c"])
        await writer.flush()
        assert writer.delivered == [b"A", b"B", b"C"]
        await writer.close()

    run(scenario())


# ------------------------------------------------------------------------ record size


def test_a_record_over_the_size_limit_is_a_clear_error_and_nothing_of_the_write_is_kept():
    async def scenario() -> None:
        writer = ScriptedWriter(config=config(max_record_size_in_bytes=5))
        with pytest.raises(RecordTooLargeError, match=r"entry 1 .* 6 bytes.*max_record_size"):
            await writer.write_many([b"ok", b"toobig", b"ok2"])
        assert writer.metrics.buffered_entries == 0
        await writer.write_many([b"fine"])
        await writer.flush()
        assert writer.delivered == [b"fine"]
        await writer.close()

    run(scenario())


def test_a_record_over_the_size_limit_is_dead_lettered_when_a_queue_is_configured():
    async def scenario() -> None:
        queue = ListDeadLetterQueue()
        writer = ScriptedWriter(config=config(max_record_size_in_bytes=5), dead_letter_queue=queue)
        await writer.write_many([b"ok", b"toobig", b"ok2"])
        await writer.flush()
        assert writer.delivered == [b"ok", b"ok2"]
        assert [(letter.entry, letter.reason) for letter in queue.letters] == [
            (b"toobig", "record_too_large")
        ]
        assert writer.metrics.num_dead_lettered == 1
        await writer.close()

    run(scenario())


# ------------------------------------------------------------------------------ retries


def test_failed_entries_go_back_to_the_head_of_the_buffer_in_their_original_order():
    def behaviour(entries: list[bytes], number: int) -> list[bytes]:
        return [entries[1], entries[3]] if number == 0 else []

    async def scenario() -> None:
        writer = ScriptedWriter(behaviour, config=config(max_batch_size=5))
        await writer.write_many(records(5))
        await settle()
        await asyncio.sleep(0.02)  # past the 1 ms backoff
        await writer.write_many(records(3, 5))
        await writer.flush()
        assert writer.requests[1] == [b"r001", b"r003", b"r005", b"r006", b"r007"]
        assert sorted(writer.delivered) == records(8)
        assert writer.metrics.num_retries == 2
        await writer.close()

    run(scenario())


def test_backoff_grows_exponentially_and_is_capped():
    def always_fail(entries: list[bytes], number: int) -> list[bytes]:
        if number < 4:
            raise RetryableDeliveryError("try again")
        return []

    async def scenario() -> None:
        policy = RetryPolicy(
            max_attempts=10,
            initial_backoff_ms=20,
            max_backoff_ms=50,
            backoff_multiplier=2,
            jitter=0,
        )
        writer = ScriptedWriter(always_fail, config=config(), retry_policy=policy)
        await writer.write_many(records(1))
        await writer.flush()
        gaps = [b - a for a, b in itertools.pairwise(writer.request_times)]
        # 20, 40, then capped at 50 and 50 ms (uncapped would be 80, 160 ms).
        assert gaps == pytest.approx([0.020, 0.040, 0.050, 0.050])
        assert len(writer.requests) == 5
        await writer.close()

    run(scenario())


def test_backoff_jitter_stays_within_its_fraction():
    policy = RetryPolicy(initial_backoff_ms=100, max_backoff_ms=1_000, jitter=0.5)
    rng = random.Random(1)
    delays = [policy.backoff_s(3, rng) for _ in range(200)]
    assert all(0.2 <= delay <= 0.4 for delay in delays)
    assert max(delays) - min(delays) > 0.1  # really randomised
    assert policy.backoff_s(1, rng, retry_after_s=2.5) == 2.5
    capped = RetryPolicy(max_retry_after_ms=1_000, jitter=0)
    assert capped.backoff_s(1, rng, retry_after_s=3600) == 1.0


def test_an_entry_gets_exactly_max_attempts_and_then_fails_the_job_without_a_queue():
    def fail(entries: list[bytes], number: int) -> list[bytes]:
        raise RetryableDeliveryError("unavailable")

    async def scenario() -> None:
        policy = RetryPolicy(max_attempts=3, initial_backoff_ms=1, max_backoff_ms=2, jitter=0)
        writer = ScriptedWriter(fail, config=config(), retry_policy=policy)
        await writer.write_many(records(2))
        with pytest.raises(RetriesExhaustedError, match="after 3 attempts") as raised:
            await writer.flush()
        assert isinstance(raised.value.__cause__, RetryableDeliveryError)
        assert len(writer.requests) == 3
        with pytest.raises(RetriesExhaustedError):
            await writer.write_many(records(1))
        await writer.close()

    run(scenario())


def test_an_entry_that_exhausts_its_budget_is_dead_lettered_with_its_error():
    def fail_first(entries: list[bytes], number: int) -> list[bytes]:
        return [entry for entry in entries if entry == b"r000"]

    async def scenario() -> None:
        queue = ListDeadLetterQueue()
        policy = RetryPolicy(max_attempts=4, initial_backoff_ms=1, max_backoff_ms=2, jitter=0)
        writer = ScriptedWriter(
            fail_first, config=config(), retry_policy=policy, dead_letter_queue=queue
        )
        await writer.write_many(records(3))
        await writer.flush()
        assert writer.delivered == [b"r001", b"r002"]
        assert sum(request.count(b"r000") for request in writer.requests) == 4
        [letter] = queue.letters
        assert (letter.entry, letter.reason, letter.failed_attempts) == (
            b"r000",
            "retries_exhausted",
            4,
        )
        assert letter.error_type == "framework.errors.RetryableDeliveryError"
        assert queue.flushes == 1
        metrics = writer.metrics
        assert (metrics.num_records_out, metrics.num_retries, metrics.num_dead_lettered) == (
            2,
            3,
            1,
        )
        await writer.close()

    run(scenario())


def test_throttling_does_not_spend_the_retry_budget():
    def busy_five_times(entries: list[bytes], number: int) -> list[bytes]:
        if number < 5:
            raise ThrottledError("busy")
        return []

    async def scenario() -> None:
        policy = RetryPolicy(max_attempts=2, initial_backoff_ms=1, max_backoff_ms=2, jitter=0)
        writer = ScriptedWriter(busy_five_times, config=config(), retry_policy=policy)
        await writer.write_many(records(2))
        await writer.flush()
        assert writer.delivered == records(2)
        assert len(writer.requests) == 6
        assert writer.metrics.num_throttled_requests == 5
        assert writer.snapshot_state().entries == ()
        await writer.close()

    run(scenario())


def test_the_classifier_is_a_value_that_decides_what_is_retried():
    def flaky(entries: list[bytes], number: int) -> list[bytes]:
        if number == 0:
            raise KeyError("transient in this destination")
        return []

    class RetryKeyErrors:
        def classify(self, error: BaseException) -> ErrorClassification:
            return ErrorClassification(retryable=isinstance(error, KeyError))

    async def scenario() -> None:
        retried = ScriptedWriter(flaky, config=config(), error_classifier=RetryKeyErrors())
        await retried.write_many(records(2))
        await retried.flush()
        assert retried.delivered == records(2)
        await retried.close()

        default = ScriptedWriter(flaky, config=config())
        await default.write_many(records(2))
        with pytest.raises(FatalDeliveryError, match=r"KeyError.*dead_letter_queue") as raised:
            await default.flush()
        assert isinstance(raised.value.__cause__, KeyError)
        assert len(default.requests) == 1
        await default.close()

    run(scenario())


def test_retry_after_delays_the_retry_and_every_other_request():
    retry_after_s = 1.0

    def throttle_first(entries: list[bytes], number: int) -> list[bytes]:
        if number == 0:
            raise ThrottledError("slow down", retry_after_s=retry_after_s)
        return []

    async def scenario() -> None:
        writer = ScriptedWriter(throttle_first, config=config(max_batch_size=2))
        await writer.write_many(records(2))
        await settle()
        await writer.write_many(records(2, 2))  # a full batch, held back by the pause
        await settle()
        assert len(writer.requests) == 1
        await writer.flush()
        start = writer.request_times[0]
        assert len(writer.request_times) == 3  # the retry and the held-back batch
        assert all(when - start >= retry_after_s - 1e-9 for when in writer.request_times[1:])
        assert sorted(writer.delivered) == records(4)
        assert writer.metrics.num_throttled_requests == 1
        await writer.close()

    run(scenario())


def test_a_request_that_times_out_is_retried():
    async def slow_first(entries: list[bytes], number: int) -> list[bytes]:
        if number == 0:
            await asyncio.sleep(5)
        return []

    async def scenario() -> None:
        writer = ScriptedWriter(slow_first, config=config(request_timeout_ms=30))
        await writer.write_many(records(2))
        await writer.flush()
        assert writer.requests == [records(2), records(2)]
        assert writer.delivered == records(2)
        assert writer.metrics.num_failed_requests == 1
        await writer.close()

    run(scenario())


# ---------------------------------------------------------------------- dead letters


def poison_aware(entries: list[bytes], number: int) -> list[bytes]:
    if any(entry.startswith(b"poison") for entry in entries):
        raise FatalDeliveryError("400: invalid record")
    return []


def test_a_poison_record_is_isolated_by_splitting_and_dead_lettered():
    async def scenario() -> None:
        queue = ListDeadLetterQueue()
        writer = ScriptedWriter(
            poison_aware, config=config(max_batch_size=8), dead_letter_queue=queue
        )
        batch = [*records(5), b"poison", *records(2, 5)]
        await writer.write_many(batch)
        await writer.flush()
        assert sorted(writer.delivered) == records(7)
        assert [(letter.entry, letter.reason) for letter in queue.letters] == [(b"poison", "fatal")]
        assert queue.letters[0].error_message == "400: invalid record"
        # Depth first: 8 fails; 4 ok; 4 fails -> 2 fails -> 1 ok, 1 dead-lettered; 2 ok.
        assert [len(request) for request in writer.requests] == [8, 4, 4, 2, 1, 1, 2]
        assert writer.metrics.num_retries == 0
        await writer.close()

    run(scenario())


def test_a_fatal_error_without_a_queue_fails_the_job_with_a_clear_message():
    async def scenario() -> None:
        writer = ScriptedWriter(poison_aware, config=config())
        await writer.write_many([b"poison", b"r001"])
        with pytest.raises(FatalDeliveryError, match="configure a dead_letter_queue") as raised:
            await writer.flush()
        assert str(raised.value.__cause__) == "400: invalid record"
        await writer.close()

    run(scenario())


def test_a_fatal_error_about_the_whole_request_fails_the_job_even_with_a_queue():
    def unauthorized(entries: list[bytes], number: int) -> list[bytes]:
        raise FatalDeliveryError("401 unauthorized", caused_by_entries=False)

    async def scenario() -> None:
        queue = ListDeadLetterQueue()
        writer = ScriptedWriter(unauthorized, config=config(), dead_letter_queue=queue)
        await writer.write_many(records(3))
        with pytest.raises(FatalDeliveryError, match="as a whole"):
            await writer.flush()
        assert queue.letters == []
        assert len(writer.requests) == 1
        await writer.close()

    run(scenario())


# ------------------------------------------------------------------- partial failures


def test_partial_failures_are_matched_by_equality_when_the_destination_copies_entries():
    def copies(entries: list[bytes], number: int) -> list[bytes]:
        return [bytes(bytearray(entries[0]))] if number == 0 else []

    async def scenario() -> None:
        writer = ScriptedWriter(copies, config=config())
        await writer.write_many(records(3))
        await writer.flush()
        assert writer.requests[1] == [b"r000"]
        assert writer.metrics.num_records_out == 3
        await writer.close()

    run(scenario())


def test_returning_entries_that_were_not_in_the_request_fails_the_writer():
    async def scenario() -> None:
        writer = ScriptedWriter(lambda entries, number: [b"stranger"], config=config())
        await writer.write_many(records(3))
        with pytest.raises(DeliveryError, match="must return the entry objects"):
            await writer.flush()
        await writer.close()

    run(scenario())


def test_metrics_count_each_record_once_however_often_it_is_retried():
    def fail_twice(entries: list[bytes], number: int) -> list[bytes]:
        return [entries[0]] if number < 2 else []

    async def scenario() -> None:
        writer = ScriptedWriter(fail_twice, config=config())
        await writer.write_many(records(3))
        await writer.flush()
        metrics = writer.metrics
        assert metrics.num_records_out == 3
        assert metrics.num_bytes_out == 12
        assert metrics.num_retries == 2
        assert metrics.num_requests == 3
        assert metrics.num_failed_requests == 2
        assert metrics.current_send_time_ms >= 0
        await writer.close()

    run(scenario())


def test_partial_failure_can_report_throttling_to_the_strategy():
    seen: list[ResultInfo] = []

    class Recording:
        def register_in_flight_request(self, request: RequestInfo) -> None:
            pass

        def register_completed_request(self, result: ResultInfo) -> None:
            seen.append(result)

        def should_block(self, request: RequestInfo) -> bool:
            return False

        def get_max_batch_size(self) -> int:
            return 10

    def throttle_one(entries: list[bytes], number: int) -> PartialFailure[bytes]:
        return PartialFailure([entries[0]] if number == 0 else [], throttled=True)

    async def scenario() -> None:
        writer = ScriptedWriter(throttle_one, config=config(), rate_limiting_strategy=Recording())
        await writer.write_many(records(3))
        await writer.flush()
        assert [(r.batch_size, r.failed_messages, r.throttled) for r in seen] == [
            (3, 1, True),
            (1, 0, False),
        ]
        assert writer.metrics.current_in_flight_limit is None
        await writer.close()

    run(scenario())


# --------------------------------------------------------------------- rate limiting


def test_the_writer_never_exceeds_what_the_strategy_allows():
    class OneAtATime:
        def __init__(self) -> None:
            self.in_flight = 0
            self.calls: list[str] = []

        def register_in_flight_request(self, request: RequestInfo) -> None:
            self.in_flight += 1
            self.calls.append(f"send {request.batch_size}")

        def register_completed_request(self, result: ResultInfo) -> None:
            self.in_flight -= 1
            self.calls.append(f"done {result.batch_size}")

        def should_block(self, request: RequestInfo) -> bool:
            return self.in_flight >= 1

        def get_max_batch_size(self) -> int:
            return 2

    async def scenario() -> None:
        strategy = OneAtATime()
        writer = ScriptedWriter(config=config(max_batch_size=5), rate_limiting_strategy=strategy)
        await writer.write_many(records(5))
        await writer.flush()
        assert writer.max_concurrent == 1
        assert [len(request) for request in writer.requests] == [2, 2, 1]
        assert strategy.calls == ["send 2", "done 2", "send 2", "done 2", "send 1", "done 1"]
        await writer.close()

    run(scenario())


def test_flinks_default_aimd_window_caps_the_batch_size_after_a_failure():
    def fail_once(entries: list[bytes], number: int) -> list[bytes]:
        return list(entries) if number == 0 else []

    async def scenario() -> None:
        # None: the writer builds Flink's default, AIMD congestion control.
        writer = ScriptedWriter(
            fail_once, config=config(max_batch_size=4), rate_limiting_strategy=None
        )
        await writer.write_many(records(4))
        await writer.flush()
        # Window 4 -> failure -> 2: the retry goes out as two requests of 2, one at a time.
        assert [len(request) for request in writer.requests] == [4, 2, 2]
        assert writer.max_concurrent == 1
        # Two successes: 2 + 10 + 10, capped at max_batch_size * max_in_flight_requests = 16.
        assert writer.metrics.current_in_flight_limit == 16.0
        await writer.close()

    run(scenario())


def test_a_time_based_strategy_wakes_the_writer_when_nothing_is_in_flight():
    async def scenario() -> None:
        pacing = PacingRateLimitingStrategy(
            max_in_flight_requests=4, max_batch_size=2, initial_rate=50.0
        )
        writer = ScriptedWriter(config=config(max_batch_size=2), rate_limiting_strategy=pacing)
        await writer.write_many(records(8))
        await writer.flush()
        gaps = [b - a for a, b in itertools.pairwise(writer.request_times)]
        assert len(writer.requests) == 4
        # 50 requests/s: 20 ms apart (one interval of catch-up is allowed after a late timer).
        assert sum(gaps) >= 0.035
        await writer.close()

    run(scenario())


# ------------------------------------------------------------------- state and lifecycle


def test_snapshot_and_restore_keep_order_and_retry_budgets():
    serializer = BufferedRequestStateSerializer(BytesEntrySerializer())

    async def first_life() -> bytes:
        writer = ScriptedWriter(config=config(max_batch_size=10))
        await writer.write_many(records(4))
        state = writer.snapshot_state()
        assert [wrapper.entry for wrapper in state.entries] == records(4)
        await writer.close()
        return serialize_versioned(serializer, state)

    def always_fail(entries: list[bytes], number: int) -> list[bytes]:
        raise RetryableDeliveryError("down")

    async def second_life(stored: bytes) -> None:
        state = deserialize_versioned(serializer, stored)
        assert state.size_in_bytes == 16
        tired = BufferedRequestState((RequestEntryWrapper(b"tired", 5, failed_attempts=4),))
        queue = ListDeadLetterQueue()
        writer = ScriptedWriter(
            always_fail,
            config=config(max_batch_size=10),
            initial_state=[tired, state],
            dead_letter_queue=queue,
        )
        await writer.write_many([b"new"])
        await writer.flush()
        assert writer.requests[0] == [b"tired", *records(4), b"new"]
        # "tired" had 4 of its 5 attempts already: dead-lettered after one more.
        assert [(letter.entry, letter.failed_attempts) for letter in queue.letters] == [
            (b"tired", 5),
            *((entry, 5) for entry in [*records(4), b"new"]),
        ]
        assert sum(request.count(b"tired") for request in writer.requests) == 1
        assert sum(request.count(b"new") for request in writer.requests) == 5
        await writer.close()

    stored = run(first_life())
    run(second_life(stored))


def test_restored_entries_are_held_to_the_record_size_limit():
    """An entry saved by a writer with a higher limit is validated like a new one."""
    big = BufferedRequestState(
        (RequestEntryWrapper(b"x" * 100, 100), RequestEntryWrapper(b"ok", 2))
    )
    limited = config(max_batch_size=10, max_record_size_in_bytes=15)
    with pytest.raises(RecordTooLargeError, match=r"restored entries .* max_record_size"):
        ScriptedWriter(config=limited, initial_state=[big])

    async def with_queue() -> None:
        queue = ListDeadLetterQueue()
        writer = ScriptedWriter(config=limited, initial_state=[big], dead_letter_queue=queue)
        assert [w.entry for w in writer.snapshot_state().entries] == [b"ok", b"x" * 100]
        await writer.flush()
        assert writer.requests == [[b"ok"]]
        assert [(letter.entry, letter.reason) for letter in queue.letters] == [
            (b"x" * 100, "record_too_large")
        ]
        assert writer.metrics.num_dead_lettered == 1
        await writer.close()

    run(with_queue())


def test_state_serializer_rejects_damaged_data():
    serializer = BufferedRequestStateSerializer(BytesEntrySerializer())
    data = serializer.serialize(BufferedRequestState((RequestEntryWrapper(b"abc", 3),)))
    assert serializer.deserialize(1, data).entries[0].entry == b"abc"
    with pytest.raises(SinkError, match="truncated"):
        serializer.deserialize(1, data[:-1])
    with pytest.raises(SinkError, match="trailing"):
        serializer.deserialize(1, data + b"x")
    with pytest.raises(SinkError, match="version 2"):
        serializer.deserialize(2, data)


def test_abort_drops_everything_and_close_is_idempotent():
    async def scenario() -> None:
        writer = ScriptedWriter(config=config(max_batch_size=2))
        writer.gate = asyncio.Event()
        await writer.write_many(records(5))
        await settle()
        assert writer.metrics.in_flight_requests == 2
        await writer.abort()
        assert writer.metrics.buffered_entries == 0
        assert writer.metrics.in_flight_requests == 0
        with pytest.raises(SinkError, match="closed or aborted"):
            await writer.write_many(records(1))
        await writer.close()
        await writer.close()
        assert writer.released
        assert writer.delivered == []

    run(scenario())


def test_flush_on_an_empty_writer_returns_at_once():
    async def scenario() -> None:
        writer = ScriptedWriter(config=config())
        await writer.flush()
        assert writer.requests == []
        await writer.close()

    run(scenario())
