"""Statistics of the load benchmark (pure): arrival schedules, per-step summaries, and the QPS sweep's stopping rule.

- Arrivals are open-loop: a seeded Poisson process (exponential gaps at the offered rate) fixed before the step
  starts, so a slow server gets the same requests at the same times as a fast one (no coordinated omission).
- Latency runs from a request's *scheduled* arrival to its response: if the generator itself falls behind, that
  delay counts against the server's latency instead of hiding it (and `send_lag` says how far behind it was).
- A request that was refused (429), failed, or had no answer by the end of the step has no latency: it counts as
  infinitely slow in the percentiles, so a step whose server sheds more than 1 % of its load cannot meet a P99 SLO.
- Percentiles are nearest-rank: the P99 of 50 samples is the largest one, never an interpolation below it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from bench.load.load_metrics import ServerView

REJECTED = 429
UNFINISHED = -1  # no answer before the step's deadline
TRANSPORT_ERROR = 0  # the connection failed


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of `samples`; NaN for no samples."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def poisson_arrivals(qps: float, duration_s: float, max_count: int, seed: int | str, min_count: int = 1) -> list[float]:
    """Arrival offsets (seconds from the step's start) of a Poisson process at `qps`: those within `duration_s`, but
    at least `min_count` (a slow rate runs longer rather than judge a P99 on a handful of requests) and at most
    `max_count`. The same seed, rate and bounds give the same schedule."""
    rng = random.Random(seed)
    arrivals: list[float] = []
    t = 0.0
    while len(arrivals) < max_count:
        t += rng.expovariate(qps)
        if t > duration_s and len(arrivals) >= min_count:
            break
        arrivals.append(t)
    return arrivals


@dataclass(frozen=True)
class Outcome:
    """One request of a step: its scheduled offset, how late it was sent, its status and latency."""

    scheduled_s: float
    send_lag_s: float
    status: int  # HTTP status, or TRANSPORT_ERROR / UNFINISHED
    latency_s: float  # scheduled arrival → response (inf unless status is 200)
    items: int  # items in the request


@dataclass
class Step:
    """One offered rate, measured; `server` is the worker's own view of it (None without its metrics)."""

    arm: str
    qps: float
    sent: int
    ok: int
    rejected: int
    errors: int
    unfinished: int
    p50_ms: float
    p99_ms: float
    p999_ms: float
    items_per_s: float
    wall_s: float
    send_lag_max_ms: float
    load_avg: float = math.nan  # the machine's 1-minute load average at the end of the step
    server: ServerView | None = None

    def meets(self, slo_ms: float) -> bool:
        return self.sent > 0 and self.p99_ms <= slo_ms


def summarize(arm: str, qps: float, outcomes: list[Outcome], wall_s: float) -> Step:
    """A step from its outcomes. items/s counts the items of answered requests over the step's wall time (first
    scheduled arrival to the last answer or the deadline)."""
    latencies = [o.latency_s * 1000 if o.status == 200 else math.inf for o in outcomes]
    items = sum(o.items for o in outcomes if o.status == 200)
    return Step(arm=arm, qps=qps, sent=len(outcomes), ok=sum(o.status == 200 for o in outcomes),
                rejected=sum(o.status == REJECTED for o in outcomes),
                errors=sum(o.status not in (200, REJECTED, UNFINISHED) for o in outcomes),
                unfinished=sum(o.status == UNFINISHED for o in outcomes),
                p50_ms=percentile(latencies, 50), p99_ms=percentile(latencies, 99),
                p999_ms=percentile(latencies, 99.9), items_per_s=items / wall_s if wall_s > 0 else 0.0,
                wall_s=wall_s, send_lag_max_ms=1000 * max((o.send_lag_s for o in outcomes), default=0.0))


@dataclass(frozen=True)
class SweepRule:
    """Raise the rate by `growth` while steps meet the SLO; after the first miss, bisect (geometrically) between
    the best passing and the lowest failing rate until they are within `resolution` of each other; if the first
    step misses, lower the rate by `growth` until one passes or the rate falls below `min_qps`. At most
    `max_steps` steps in all."""

    start_qps: float
    growth: float = 1.5
    resolution: float = 1.15
    max_steps: int = 8
    min_qps: float = 1e-3


def next_qps(steps: list[Step], rule: SweepRule, slo_ms: float) -> float | None:
    """The next rate to offer after `steps` (one arm's, in order), or None when the sweep is done."""
    if not steps:
        return rule.start_qps
    if len(steps) >= rule.max_steps:
        return None
    passing = [s.qps for s in steps if s.meets(slo_ms)]
    failing = [s.qps for s in steps if not s.meets(slo_ms)]
    if not passing:
        lower = min(failing) / rule.growth
        return lower if lower >= rule.min_qps else None
    best = max(passing)
    above = [q for q in failing if q > best]
    if not above:
        return best * rule.growth
    ceiling = min(above)
    if ceiling / best <= rule.resolution:
        return None
    return math.sqrt(best * ceiling)


def best_at_slo(steps: list[Step], slo_ms: float) -> Step | None:
    """The step with the highest items/s among those that met the SLO."""
    passing = [s for s in steps if s.meets(slo_ms)]
    return max(passing, key=lambda s: s.items_per_s, default=None)
