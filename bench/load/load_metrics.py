"""The worker's own view of a load step: two scrapes of its /metrics, before and after, and what the difference says.

- queue share: Σ queue wait / Σ end-to-end latency of the step's requests (where their time went: waiting);
- tokenize share: Σ `tokenize` stage (checks, tokenization, planning, including the hop to the thread pool) over Σ
  end-to-end; `tokenize_busy` is the same sum over the step's wall time (how much of a core it took);
- device busy: the device's time (`scorekeeper_device_busy_seconds_total`: CUDA events, or the simulated device's
  time) over wall time, the share of the step the device computed (1.0 = never idle);
- batch steps: the mean milliseconds per batch of each host step (pack, copy-in, heads, copy-out, respond) and of
  the device (`scorekeeper_batch_step_seconds`);
- GC: collections, total pause, the largest pause (as the upper bound of its histogram bucket), full collections;
- tokens/s through the model (`scorekeeper_prompt_tokens_total`);
- graph share: the step's forward batches replayed through a captured CUDA graph (`path="graph"`) over all of them
  (eager and padded-without-capture included); whether graph buckets were what served the load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Sample = dict[tuple[str, tuple[tuple[str, str], ...]], float]
STEP = "scorekeeper_batch_step_seconds"
STEPS = ("pack", "copy_in", "device", "heads", "copy_out", "respond")


def parse(text: str) -> Sample:
    """Prometheus text → {(sample name, sorted labels): value}."""
    sample: Sample = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sample[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return sample


def _sum(sample: Sample, name: str, **labels: str) -> float:
    """Sum of every series of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(value for (n, series), value in sample.items() if n == name and want <= set(series))


@dataclass(frozen=True)
class ServerView:
    queue_share: float
    tokenize_share: float
    tokenize_busy: float
    device_busy: float
    batches: int
    steps_ms: dict[str, float]  # mean per batch: pack, copy_in, device, heads, copy_out, respond
    gc_collections: int
    gc_full_collections: int
    gc_pause_total_ms: float
    gc_pause_max_ms: float  # an upper bound: the smallest bucket holding every pause of the step (inf: > 1 s)
    tokens_per_s: float
    graph_share: float  # 0 when graphs are off or no batch ran


def _largest_pause_bound(before: Sample, after: Sample) -> float:
    """The smallest GC-pause bucket bound that holds every pause between the two scrapes (0 when none)."""
    within: dict[float, float] = {}  # bucket bound → pauses at or below it, summed over generations
    for key, value in after.items():
        if key[0] == "scorekeeper_gc_pause_seconds_bucket":
            bound = float(dict(key[1])["le"])
            within[bound] = within.get(bound, 0.0) + value - before.get(key, 0.0)
    total = within.get(math.inf, 0.0)
    return next((bound for bound in sorted(within) if within[bound] >= total), 0.0) if total > 0 else 0.0


def view(before: Sample, after: Sample, wall_s: float) -> ServerView:
    def delta(name: str, **labels: str) -> float:
        return _sum(after, name, **labels) - _sum(before, name, **labels)

    stage = "scorekeeper_stage_duration_seconds_sum"
    end_to_end = delta(stage, stage="end_to_end")
    tokenize = delta(stage, stage="tokenize")
    runs = "scorekeeper_cuda_graph_runs_total"
    batches = delta(runs)
    return ServerView(
        queue_share=delta(stage, stage="queue") / end_to_end if end_to_end else 0.0,
        tokenize_share=tokenize / end_to_end if end_to_end else 0.0,
        tokenize_busy=tokenize / wall_s if wall_s else 0.0,
        device_busy=delta("scorekeeper_device_busy_seconds_total") / wall_s if wall_s else 0.0,
        batches=round(batches),
        steps_ms={step: 1000 * delta(f"{STEP}_sum", step=step) / count if (count := delta(f"{STEP}_count", step=step))
                  else 0.0 for step in STEPS},
        gc_collections=round(delta("scorekeeper_gc_pause_seconds_count")),
        gc_full_collections=round(delta("scorekeeper_gc_pause_seconds_count", generation="2")),
        gc_pause_total_ms=1000 * delta("scorekeeper_gc_pause_seconds_sum"),
        gc_pause_max_ms=1000 * _largest_pause_bound(before, after),
        tokens_per_s=delta("scorekeeper_prompt_tokens_total") / wall_s if wall_s else 0.0,
        graph_share=delta(runs, path="graph") / batches if batches else 0.0,
    )


def _by_size(target: str) -> tuple[bool, int]:
    """Token buckets by size, then named targets ("eager")."""
    return (not target.isdigit(), int(target) if target.isdigit() else 0)


def startup_note(sample: Sample) -> str:
    """What the worker prepared before serving, from one scrape: the compiled targets with their compile seconds,
    failed compiles and captures, and the graph buckets that serve (a load figure means little without it)."""
    compiled = {dict(labels)["target"]: value for (name, labels), value in sample.items()
                if name == "scorekeeper_compile_seconds"}
    buckets = sorted({dict(labels)["bucket"] for (name, labels), _ in sample.items()
                      if name == "scorekeeper_cuda_graph_runs_total" and dict(labels).get("path") == "graph"},
                     key=_by_size)
    return (f"graph buckets {', '.join(buckets) or 'none'}; compiled "
            + (", ".join(f"{t} ({compiled[t]:.1f} s)" for t in sorted(compiled, key=_by_size)) or "nothing")
            + f"; compile failures {_sum(sample, 'scorekeeper_compile_failures_total'):.0f}"
            + f", capture failures {_sum(sample, 'scorekeeper_cuda_graph_capture_failures_total'):.0f}")
