"""The simulated device (engine/runner/device_stream.py) models one CUDA stream: enqueueing returns at once, work
runs in order, each forward completes its cost after the later of its enqueue and the previous completion, a wait
sleeps until then; and it never runs the model. Checked on a fake clock, so nothing here depends on timing."""

from __future__ import annotations

import pytest
import torch
from scorekeeper_worker.engine.runner.device_stream import HostStream, SimulatedStream


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _never_run() -> torch.Tensor:
    raise AssertionError("the simulated device must not run the forward")


def test_work_queues_behind_the_work_before_it() -> None:
    clock = FakeClock()
    device = SimulatedStream(20.0, hidden=8, clock=clock, sleep=clock.sleep)  # 20 ms per 8,192 tokens
    out = device.forward(_never_run, tokens=8192, rows=5)
    first = device.completion()
    assert out.shape == (5, 8) and out.dtype == torch.float32
    clock.now += 0.005  # the host packs the next batch for 5 ms: the device is still busy with the first
    device.forward(_never_run, tokens=4096, rows=3)
    second = device.completion()
    assert (first.device_seconds(), second.device_seconds()) == pytest.approx((0.020, 0.010))
    assert not first.done() and not second.done()  # two batches in flight
    first.wait()
    assert clock.now == pytest.approx(100.020) and first.done() and not second.done()  # the second starts then
    second.wait()
    assert clock.now == pytest.approx(100.030) and second.done()
    assert clock.slept == pytest.approx([0.015, 0.010])


def test_an_idle_device_starts_at_once_and_waiting_on_finished_work_is_free() -> None:
    clock = FakeClock()
    device = SimulatedStream(16.0, hidden=4, clock=clock, sleep=clock.sleep)
    device.forward(_never_run, tokens=512, rows=1)
    done = device.completion()
    clock.now += 1.0  # the device has been idle for most of a second when the next batch comes
    device.forward(_never_run, tokens=8192, rows=1)
    later = device.completion()
    done.wait()
    assert clock.slept == []  # long finished: no sleep
    later.wait()
    assert clock.slept == pytest.approx([0.016])  # from its enqueue, not from the earlier batch's completion


def test_the_simulated_output_is_fixed_per_shape() -> None:
    device = SimulatedStream(10.0, hidden=6)
    a = device.forward(_never_run, tokens=100, rows=4)
    b = device.forward(_never_run, tokens=200, rows=4)
    assert torch.equal(a, b) and device.forward(_never_run, tokens=100, rows=2).shape == (2, 6)


def test_the_host_runs_the_forward_when_launched() -> None:
    host = HostStream()
    ran: list[int] = []
    out = host.forward(lambda: (ran.append(1), torch.ones(2, 3))[1], tokens=10, rows=2)
    done = host.completion()
    assert ran == [1] and torch.equal(out, torch.ones(2, 3)) and done.done() and done.device_seconds() >= 0
