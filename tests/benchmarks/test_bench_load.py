"""bench/load/bench_load.py's statistics, sweep and open-loop sending, on known samples, fake measurements and a real
aiohttp server on loopback: deterministic, nothing asserted about time."""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import generate_latest
from scorekeeper_worker.base.metrics import WorkerMetrics

from bench.load.load_metrics import parse, startup_note, view
from bench.load.load_runner import send_schedule
from bench.load.load_stats import (
    REJECTED,
    TRANSPORT_ERROR,
    UNFINISHED,
    Outcome,
    Step,
    SweepRule,
    best_at_slo,
    next_qps,
    percentile,
    poisson_arrivals,
    summarize,
)
from bench.load.load_workload import PRESETS, Shape


def test_percentiles_are_nearest_rank() -> None:
    samples = [float(v) for v in range(100, 0, -1)]  # 1..100, unordered
    assert (percentile(samples, 50), percentile(samples, 99), percentile(samples, 99.9)) == (50, 99, 100)
    assert percentile([float(v) for v in range(1, 51)], 99) == 50  # 50 samples: the P99 is the largest
    assert percentile([3.0], 0) == 3.0
    assert math.isnan(percentile([], 99))
    assert percentile([1.0] * 98 + [math.inf] * 2, 99) == math.inf  # 2 % unanswered: the P99 is infinite
    assert percentile([1.0] * 99 + [math.inf], 99) == 1.0


def test_poisson_schedule_is_seeded_and_bounded() -> None:
    schedule = poisson_arrivals(100.0, 100.0, 1_000_000, seed=7)
    assert schedule == poisson_arrivals(100.0, 100.0, 1_000_000, seed=7)
    assert schedule != poisson_arrivals(100.0, 100.0, 1_000_000, seed=8)
    assert all(a < b for a, b in itertools.pairwise(schedule)) and schedule[-1] <= 100.0
    assert abs(len(schedule) - 10_000) < 300  # 3 standard deviations of a Poisson count of 10,000
    gaps = [b - a for a, b in itertools.pairwise([0.0, *schedule])]
    assert abs(sum(gaps) / len(gaps) - 0.01) < 0.0005
    assert len(poisson_arrivals(100.0, 100.0, 50, seed=7)) == 50  # the count bound
    assert poisson_arrivals(100.0, 100.0, 50, seed=7) == schedule[:50]
    slow = poisson_arrivals(0.1, 10.0, 50, seed=7, min_count=20)  # ~1 arrival in 10 s: the step runs longer
    assert len(slow) == 20 and slow[-1] > 10.0 and slow == poisson_arrivals(0.1, 1e9, 20, seed=7)


def _outcome(latency_s: float, status: int = 200, items: int = 10) -> Outcome:
    return Outcome(scheduled_s=0.0, send_lag_s=0.001, status=status, latency_s=latency_s, items=items)


def test_summary_counts_every_fate_and_unanswered_requests_are_infinitely_slow() -> None:
    outcomes = [_outcome(0.1 * (i + 1)) for i in range(96)] + [
        _outcome(math.inf, REJECTED), _outcome(math.inf, TRANSPORT_ERROR), _outcome(math.inf, 500),
        _outcome(math.inf, UNFINISHED)]
    step = summarize("arm", 5.0, outcomes, wall_s=20.0)
    assert (step.sent, step.ok, step.rejected, step.errors, step.unfinished) == (100, 96, 1, 2, 1)
    assert step.items_per_s == 96 * 10 / 20.0
    assert step.p50_ms == pytest.approx(5000.0)
    assert step.p99_ms == math.inf and not step.meets(1e9)  # 4 % unanswered
    assert step.send_lag_max_ms == pytest.approx(1.0)
    served = summarize("arm", 5.0, [_outcome(0.1 * (i + 1)) for i in range(100)], wall_s=20.0)
    assert served.p99_ms == pytest.approx(9900.0) and served.meets(9900.0) and not served.meets(9899.0)


def _fake_step(qps: float, capacity: float) -> Step:
    """A server that meets a 1 s P99 up to `capacity` QPS."""
    return summarize("fake", qps, [_outcome(0.5 if qps <= capacity else 5.0)] * 10, wall_s=10.0 / qps)


def _sweep(rule: SweepRule, capacity: float) -> list[Step]:
    steps: list[Step] = []
    while (qps := next_qps(steps, rule, slo_ms=1000.0)) is not None:
        steps.append(_fake_step(qps, capacity))
    return steps


def test_sweep_rises_then_bisects_to_the_resolution() -> None:
    rule = SweepRule(start_qps=1.0, growth=2.0, resolution=1.1, max_steps=20)
    steps = _sweep(rule, capacity=7.3)
    assert [s.qps for s in steps[:4]] == [1.0, 2.0, 4.0, 8.0]  # doubling until the first miss
    best = best_at_slo(steps, 1000.0)
    assert best is not None and 7.3 / 1.1 <= best.qps <= 7.3
    lowest_miss = min(s.qps for s in steps if not s.meets(1000.0))
    assert lowest_miss / best.qps <= 1.1 and lowest_miss > 7.3


def test_sweep_goes_down_when_the_first_step_misses_and_stops_at_its_bounds() -> None:
    steps = _sweep(SweepRule(start_qps=10.0, growth=2.0, resolution=1.1, max_steps=20), capacity=3.0)
    assert [s.qps for s in steps[:3]] == [10.0, 5.0, 2.5]
    assert best_at_slo(steps, 1000.0) is not None
    never = _sweep(SweepRule(start_qps=1.0, growth=2.0, max_steps=20, min_qps=0.2), capacity=0.0)
    assert [s.qps for s in never] == [1.0, 0.5, 0.25] and best_at_slo(never, 1000.0) is None
    capped = _sweep(SweepRule(start_qps=1.0, growth=1.01, max_steps=5), capacity=1e9)
    assert len(capped) == 5


def test_best_is_the_highest_items_per_s_among_steps_that_meet_the_slo() -> None:
    fast_miss = summarize("a", 9.0, [_outcome(2.0)] * 10, wall_s=1.0)
    slow_meet = summarize("a", 1.0, [_outcome(0.5)] * 10, wall_s=10.0)
    meet = summarize("a", 2.0, [_outcome(0.9)] * 10, wall_s=5.0)
    assert best_at_slo([fast_miss, slow_meet, meet], 1000.0) is meet


def _bodies(index: int) -> tuple[bytes, int]:
    return f'{{"n": {index}}}'.encode(), 3


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def _send_to(handler: Handler, count: int, drain_s: float) -> tuple[list[Outcome], float]:
    """send_schedule's `count` requests, all due at once, to a real aiohttp server on loopback."""
    app = web.Application()
    app.router.add_post("/v1/score", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as client:
            return await send_schedule(client, f"http://127.0.0.1:{port}/v1/score", [0.0] * count, _bodies, 0,
                                       drain_s=drain_s)
    finally:
        await runner.cleanup()


def test_sending_is_open_loop_every_request_is_in_flight_at_once() -> None:
    """The server answers nothing until all 20 requests have arrived: a generator that waited for answers before
    sending more would leave 19 unsent and abandon them at the deadline."""
    count = 20

    async def main() -> list[Outcome]:
        arrived = 0
        everyone = asyncio.Event()

        async def handler(request: web.Request) -> web.Response:
            nonlocal arrived
            arrived += 1
            if arrived == count:
                everyone.set()
            await everyone.wait()
            return web.json_response({"scores": []})

        return (await _send_to(handler, count, drain_s=300))[0]

    outcomes = asyncio.run(main())
    assert [o.status for o in outcomes] == [200] * count
    assert sum(o.items for o in outcomes) == 3 * count


def test_sending_records_refusals_failures_and_abandoned_requests() -> None:
    async def main() -> list[Outcome]:
        async def handler(request: web.Request) -> web.StreamResponse:
            n = int((await request.read()).decode().split()[-1].rstrip("}"))
            if n == 1:
                return web.Response(status=429)
            if n == 2:  # the connection dropped without an answer
                assert request.transport is not None
                request.transport.abort()
                await asyncio.Event().wait()
            if n == 3:
                await asyncio.Event().wait()  # never answers: abandoned at the deadline
            return web.Response(status=200)

        outcomes, wall = await _send_to(handler, 5, drain_s=5.0)  # ample for the 200s on a loaded machine
        assert wall > 0
        return outcomes

    statuses = [o.status for o in asyncio.run(main())]
    assert statuses == [200, REJECTED, TRANSPORT_ERROR, UNFINISHED, 200]


def test_server_view_from_two_scrapes_of_the_real_metrics() -> None:
    metrics = WorkerMetrics()
    before = parse(generate_latest(metrics.registry).decode())
    for stage, seconds in (("end_to_end", 8.0), ("queue", 2.0), ("tokenize", 0.4), ("forward", 5.0),
                           ("scoring", 1.0)):
        metrics.stage_seconds.labels(stage).observe(seconds)
    metrics.gc_pauses.labels("0").observe(0.0003)
    metrics.gc_pauses.labels("2").observe(0.2)
    metrics.prompt_tokens.inc(1000)
    metrics.device_busy_seconds.inc(9.0)
    for pack_ms in (1.0, 3.0):
        metrics.batch_step_seconds.labels("pack").observe(pack_ms / 1000)
    metrics.graph_runs.labels("graph", "256").inc(3)
    metrics.graph_runs.labels("eager", "none").inc()
    server = view(before, parse(generate_latest(metrics.registry).decode()), wall_s=10.0)
    assert server.queue_share == pytest.approx(0.25) and server.tokenize_share == pytest.approx(0.05)
    assert server.tokenize_busy == pytest.approx(0.04) and server.device_busy == pytest.approx(0.9)
    assert server.steps_ms["pack"] == pytest.approx(2.0) and server.steps_ms["heads"] == 0.0  # no heads observed
    assert (server.gc_collections, server.gc_full_collections) == (2, 1)
    assert server.gc_pause_total_ms == pytest.approx(200.3)
    assert server.gc_pause_max_ms == pytest.approx(250.0)  # the 0.25 s bucket holds the largest pause
    assert server.tokens_per_s == pytest.approx(100.0)
    assert server.graph_share == pytest.approx(0.75)  # 3 of 4 batches replayed a graph
    idle = view(before, before, wall_s=0.0)  # a step with no request
    assert (idle.device_busy, idle.tokenize_share, idle.gc_collections, idle.graph_share) == (0.0, 0.0, 0, 0.0)


def test_startup_note_names_the_buckets_the_compiled_targets_and_the_failures() -> None:
    metrics = WorkerMetrics()
    assert startup_note(parse(generate_latest(metrics.registry).decode())) == \
        "graph buckets none; compiled nothing; compile failures 0, capture failures 0"
    for bucket in (8192, 2048, 4096):
        metrics.graph_runs.labels("graph", str(bucket))
    metrics.compile_seconds.labels("8192").set(31.25)
    metrics.compile_seconds.labels("4096").set(12.0)
    metrics.compile_failures.inc()
    note = startup_note(parse(generate_latest(metrics.registry).decode()))
    assert note == ("graph buckets 2048, 4096, 8192; compiled 4096 (12.0 s), 8192 (31.2 s); compile failures 1, "
                    "capture failures 0")


def test_preset_shapes_and_token_ratio() -> None:
    sglang = PRESETS["sglang-mis"]
    assert sglang.shapes == ((1.0, Shape(120, 10, 180)),)  # 300-token prompts, 10 items
    assert sglang.token_ratio() == pytest.approx(10 * 300 / (120 + 10 * 180))
    tail = PRESETS["long-tail"]
    assert max(shape.items for _, shape in tail.shapes) >= 100
    assert sum(weight for weight, shape in tail.shapes if shape.items <= 8) >= 0.8
