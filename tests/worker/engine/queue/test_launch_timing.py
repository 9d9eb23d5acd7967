"""When the scheduler forms the next batch while one is in flight (engine/queue/batching.py, `LaunchTiming`): just
before the device is expected to be done, from what the device took per token, launching early rather than late."""

from __future__ import annotations

import pytest
from scorekeeper_worker.engine.queue.batching import EARLY, MARGIN_SECONDS, LaunchTiming


def test_with_nothing_measured_yet_the_next_batch_is_formed_at_once() -> None:
    timing = LaunchTiming()
    timing.launched(now=10.0, tokens=8192, launch_seconds=0.002)
    assert timing.form_at() <= 10.0


def test_the_next_batch_is_formed_before_the_work_in_flight_is_expected_done() -> None:
    timing = LaunchTiming()
    timing.launched(now=0.0, tokens=8192, launch_seconds=0.001)
    timing.finished(now=0.021, tokens=8192, device_seconds=0.021, tokens_in_flight=0)  # 21 ms per 8,192 tokens
    timing.launched(now=0.030, tokens=4096, launch_seconds=0.001)
    expected = 0.030 + EARLY * 0.0105
    assert timing.device_free_at == pytest.approx(expected)
    assert timing.form_at() == pytest.approx(expected - 2 * 0.001 - MARGIN_SECONDS)
    timing.launched(now=0.031, tokens=4096, launch_seconds=0.001)  # queued behind: it starts when the first ends
    assert timing.device_free_at == pytest.approx(expected + EARLY * 0.0105)


def test_a_device_slower_than_expected_moves_the_estimate_later() -> None:
    timing = LaunchTiming()
    timing.launched(now=0.0, tokens=1000, launch_seconds=0.001)
    timing.finished(now=0.010, tokens=1000, device_seconds=0.010, tokens_in_flight=0)
    timing.launched(now=0.010, tokens=1000, launch_seconds=0.001)
    timing.launched(now=0.011, tokens=1000, launch_seconds=0.001)
    # The first of the two took 30 ms, not the 9 expected: the one behind it cannot be done before 0.040 + its time.
    timing.finished(now=0.040, tokens=1000, device_seconds=0.030, tokens_in_flight=1000)
    assert timing.device_free_at >= 0.040 + EARLY * timing.seconds_per_token * 1000
    assert 0.010 / 1000 < timing.seconds_per_token < 0.030 / 1000  # averaged, not replaced
