"""Rate limiting strategies follow their functions exactly (FLIP-242's test plan)."""

from __future__ import annotations

import math

import pytest

from framework.asyncsink import (
    AIMDScalingStrategy,
    AsyncSinkWriterConfig,
    CongestionControlRateLimitingStrategy,
    PacingRateLimitingStrategy,
    RateLimitingStrategy,
    RequestInfo,
    ResultInfo,
    SupportsInFlightLimit,
    SupportsUnblockTime,
)


def test_aimd_adds_up_to_the_threshold_and_halves_rounding_half_up_never_below_one():
    aimd = AIMDScalingStrategy(rate_threshold=25)
    assert [aimd.scale_up(x) for x in (1, 10, 15, 20, 25)] == [11, 20, 25, 25, 25]
    assert [aimd.scale_down(x) for x in (25, 5, 3, 2, 1)] == [13, 3, 2, 1, 1]
    gentle = AIMDScalingStrategy(rate_threshold=100, increase_rate=1, decrease_factor=0.9)
    assert (gentle.scale_up(50), gentle.scale_down(50)) == (51, 45)


def test_congestion_control_blocks_on_requests_or_messages_and_scales_the_window():
    strategy = CongestionControlRateLimitingStrategy(
        max_in_flight_requests=2,
        initial_max_in_flight_messages=10,
        scaling_strategy=AIMDScalingStrategy(rate_threshold=30),
    )
    assert strategy.get_max_batch_size() == 10
    assert not strategy.should_block(RequestInfo(10, 0.0))
    assert strategy.should_block(RequestInfo(11, 0.0))  # more than the window
    strategy.register_in_flight_request(RequestInfo(6, 0.0))
    assert strategy.should_block(RequestInfo(5, 0.0))  # 6 + 5 > 10
    assert not strategy.should_block(RequestInfo(4, 0.0))
    strategy.register_in_flight_request(RequestInfo(4, 0.0))
    assert strategy.should_block(RequestInfo(0, 0.0))  # two requests in flight
    strategy.register_completed_request(ResultInfo(6, 0, 0.0, 0.01))
    assert strategy.in_flight_limit == 20.0  # success: +10
    strategy.register_completed_request(ResultInfo(4, 1, 0.0, 0.01))
    assert strategy.get_max_batch_size() == 10  # failure: halved
    assert not strategy.should_block(RequestInfo(10, 0.0))


def test_flink_defaults_from_config():
    config = AsyncSinkWriterConfig(max_batch_size=100, max_in_flight_requests=5)
    strategy = CongestionControlRateLimitingStrategy.from_config(config)
    assert strategy.get_max_batch_size() == 100
    for _ in range(100):
        strategy.register_in_flight_request(RequestInfo(1, 0.0))
        strategy.register_completed_request(ResultInfo(1, 0, 0.0, 0.0))
    assert strategy.get_max_batch_size() == 500  # threshold = batch size * in-flight requests


def test_strategies_satisfy_the_protocol_and_declare_their_optional_capabilities():
    config = AsyncSinkWriterConfig()
    aimd: RateLimitingStrategy = CongestionControlRateLimitingStrategy.from_config(config)
    pacing: RateLimitingStrategy = PacingRateLimitingStrategy.from_config(config)
    assert isinstance(aimd, SupportsInFlightLimit)
    assert not isinstance(aimd, SupportsUnblockTime)
    assert isinstance(pacing, SupportsInFlightLimit)
    assert isinstance(pacing, SupportsUnblockTime)


def paced_history(strategy: PacingRateLimitingStrategy, until: float, step: float) -> None:
    """Send a request every ``step`` seconds from 0 to ``until``, each accepted after 5 ms."""
    for index in range(round(until / step)):
        start = index * step
        strategy.register_in_flight_request(RequestInfo(100, start))
        strategy.register_completed_request(ResultInfo(100, 0, start, 0.005))


def test_pacing_is_unpaced_until_congestion_then_paces_just_under_the_accepted_rate():
    strategy = PacingRateLimitingStrategy(
        max_in_flight_requests=10, max_batch_size=100, headroom=0.1
    )
    assert math.isinf(strategy.rate)
    assert strategy.get_max_batch_size() == 100
    paced_history(strategy, until=1.0, step=0.01)  # 100 accepted requests in 1 s
    assert math.isinf(strategy.rate)  # no congestion yet, no pace
    strategy.register_in_flight_request(RequestInfo(100, 1.0))
    strategy.register_completed_request(ResultInfo(100, 100, 1.0, 0.001, throttled=True))
    assert strategy.rate == pytest.approx(90.0, rel=0.02)  # 100/s accepted, 10% headroom


def test_pacing_reacts_once_per_round_trip():
    strategy = PacingRateLimitingStrategy(
        max_in_flight_requests=10, max_batch_size=100, headroom=0.1
    )
    paced_history(strategy, until=1.0, step=0.01)
    for start in (0.990, 0.995):  # both in flight when the first throttle arrives
        strategy.register_in_flight_request(RequestInfo(100, start))
    strategy.register_completed_request(ResultInfo(100, 100, 0.990, 0.011, throttled=True))
    reduced = strategy.rate
    # Sent before the reduction: it reports on the old rate and must not cut again.
    strategy.register_completed_request(ResultInfo(100, 100, 0.995, 0.010, throttled=True))
    assert strategy.rate == reduced


def test_pacing_spaces_requests_and_says_when_it_unblocks():
    strategy = PacingRateLimitingStrategy(
        max_in_flight_requests=10, max_batch_size=100, initial_rate=10.0
    )
    assert not strategy.should_block(RequestInfo(100, 5.0))
    strategy.register_in_flight_request(RequestInfo(100, 5.0))
    # One interval of catch-up is allowed (a late timer), then 100 ms spacing.
    assert not strategy.should_block(RequestInfo(100, 5.0))
    strategy.register_in_flight_request(RequestInfo(100, 5.0))
    assert strategy.should_block(RequestInfo(100, 5.0))
    assert strategy.seconds_until_unblocked(RequestInfo(100, 5.0)) == pytest.approx(0.1)
    assert strategy.seconds_until_unblocked(RequestInfo(100, 5.04)) == pytest.approx(0.06)
    assert not strategy.should_block(RequestInfo(100, 5.1))


def test_pacing_honours_retry_after_and_caps_in_flight_requests():
    strategy = PacingRateLimitingStrategy(
        max_in_flight_requests=1, max_batch_size=10, initial_rate=1000.0
    )
    strategy.register_in_flight_request(RequestInfo(10, 0.0))
    assert strategy.should_block(RequestInfo(10, 1.0))  # one in flight
    assert strategy.seconds_until_unblocked(RequestInfo(10, 1.0)) == 0.0  # only a completion
    strategy.register_completed_request(
        ResultInfo(10, 10, 0.0, 0.01, throttled=True, retry_after_s=0.5)
    )
    assert strategy.should_block(RequestInfo(10, 0.4))
    assert not strategy.should_block(RequestInfo(10, 0.52))


def test_pacing_probes_upward_after_success_and_speeds_up_the_longer_it_succeeds():
    strategy = PacingRateLimitingStrategy(
        max_in_flight_requests=10, max_batch_size=100, initial_rate=100.0, probe_gain=0.05
    )
    paced_history(strategy, until=1.0, step=0.01)
    after_one_second = strategy.rate
    # About exp(0.05 * 1): +5% in the first second.
    assert after_one_second == pytest.approx(100.0 * math.exp(0.05 * 0.995), rel=0.01)
    # Never more than twice the accepted rate (~100/s): the ceiling holds it.
    for index in range(100, 400):
        start = index * 0.01
        strategy.register_in_flight_request(RequestInfo(100, start))
        strategy.register_completed_request(ResultInfo(100, 0, start, 0.005))
    assert after_one_second < strategy.rate <= 2 * 101.0 + 1e-9  # 101 samples in the window


def test_pacing_treats_plain_entry_failures_as_no_congestion():
    strategy = PacingRateLimitingStrategy(
        max_in_flight_requests=10, max_batch_size=100, initial_rate=50.0
    )
    strategy.register_in_flight_request(RequestInfo(100, 0.0))
    strategy.register_completed_request(ResultInfo(100, 10, 0.0, 0.01))
    assert strategy.rate >= 50.0


def test_pacing_latency_signal_is_opt_in():
    def run(latency_factor: float | None) -> float:
        strategy = PacingRateLimitingStrategy(
            max_in_flight_requests=10,
            max_batch_size=100,
            initial_rate=100.0,
            latency_factor=latency_factor,
        )
        paced_history(strategy, until=0.5, step=0.01)  # 5 ms latency each
        strategy.register_in_flight_request(RequestInfo(100, 0.5))
        strategy.register_completed_request(ResultInfo(100, 0, 0.5, 0.05))  # 10x slower
        return strategy.rate

    assert run(None) >= 100.0
    assert run(3.0) < 100.0


def test_pacing_without_enough_samples_halves_the_observed_send_rate():
    strategy = PacingRateLimitingStrategy(max_in_flight_requests=50, max_batch_size=10)
    for _ in range(20):  # an unpaced burst at t=0
        strategy.register_in_flight_request(RequestInfo(10, 0.0))
    strategy.register_completed_request(ResultInfo(10, 10, 0.0, 0.1, throttled=True))
    # 20 sent over 0.1 s = 200/s observed; halved, as nothing was accepted yet.
    assert strategy.rate == pytest.approx(100.0)


def test_pacing_never_cuts_more_than_max_decrease_at_once():
    strategy = PacingRateLimitingStrategy(
        max_in_flight_requests=10, max_batch_size=100, initial_rate=100.0, max_decrease=0.2
    )
    paced_history(strategy, until=1.0, step=0.05)  # a stall: only 20 accepted in the last second
    before = strategy.rate
    strategy.register_in_flight_request(RequestInfo(100, 1.0))
    strategy.register_completed_request(ResultInfo(100, 100, 1.0, 0.01, throttled=True))
    assert strategy.rate == pytest.approx(before * 0.8)
