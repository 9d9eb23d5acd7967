"""Throughput at a latency SLO: the highest items/s a worker sustains with P99 ≤ --slo-ms under open-loop load.

    # CPU (SmolLM2-135M, real weights): MIS on vs off, a CPU-sized SLO
    .venv/bin/python bench/load/bench_load.py --model smollm2 --preset sglang-mis --slo-ms 30000 --compare mis \\
        --start-qps 0.1 --step-seconds 45 --step-min-requests 10 --max-steps 4 --probe 4 --warmup 1 --json load-cpu.json
    # GPU (the Qwen3-0.6B-geometry model, built offline on first use): MIS and CUDA graphs on vs off
    .venv/bin/python bench/load/bench_load.py --model qwen3-geometry --device cuda --dtype bfloat16 \\
        --preset sglang-mis --slo-ms 500 --compare mis,cuda-graph --probe 64 --step-seconds 30 --json load-gpu.json
    # a running worker (e.g. a Kubernetes Service): its tokenizer for the bodies, its metrics for the shares
    .venv/bin/python bench/load/bench_load.py --url http://scorer:8000 --tokenizer /models/m --slo-ms 500
    # the host pipeline on a CPU, the device simulated at 21 ms per 8,192-token bucket (the H200's compiled replay)
    .venv/bin/python bench/load/bench_load.py --preset sglang-mis --cuda-graph --simulate-device-ms 21 --slo-ms 500

Each arm is one configuration (MIS on/off per request through `multi_item_scoring`; worker flags such as
`--cuda-graph` or `--gc-freeze` per worker process). For each arm: warm-up requests, a burst that estimates its
capacity, then a QPS sweep (load_stats.SweepRule) from half that capacity, every step an open-loop Poisson schedule
of --step-seconds (at least --step-min-requests, at most --step-requests). Arms take turns step by step, so a noisy
neighbour hits them alike. Prints one row per step and the best items/s at the SLO per arm, with the ratios between
arms; --json writes it all.

With --simulate-device-ms R every worker started here replaces each forward by a simulated device (R ms per 8,192
tokens of its bucket; `--simulate-device-ms` in docs/configuration.md): everything else (HTTP, planning, the queue,
packing, the copies into the bucket's buffers, the heads, the responses) is the real code. The figures are then the
host pipeline's on a simulated device, never a GPU's speed; the report says so and gives the device's busy share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import REPO, Worker, exit_on_sigterm, log, machine_note, markdown_table, set_threads
from bench.load.load_metrics import STEPS, parse, startup_note
from bench.load.load_runner import Target, post, run_step
from bench.load.load_stats import Step, SweepRule, best_at_slo, next_qps, poisson_arrivals
from bench.load.load_workload import PRESETS, BodyPool, Mix, Shape, label_ids

CACHE = REPO / ".cache" / "models"


@dataclass(frozen=True)
class Arm:
    name: str
    mis: bool
    worker_flags: tuple[str, ...]


def arms_for(args: argparse.Namespace) -> list[Arm]:
    """The base arm from the flags, then one arm per --compare knob, flipped."""
    graphs = args.cuda_graph if args.cuda_graph is not None else args.device == "cuda"
    knobs = {"cuda-graph": graphs, "gc-freeze": args.gc_freeze, "pipeline": args.pipeline}

    # A simulated device's worker runs its host as a GPU worker's does: torch's own OpenMP runtime (a CUDA worker does
    # not preload Intel's), one thread for the few CPU ops left to the host (Intel's spinning second thread took
    # 0.4-0.9 ms of CPU per request).
    simulated = () if args.simulate_device_ms is None else (
        "--simulate-device-ms", str(args.simulate_device_ms), "--openmp-runtime", "gnu", "--threads", "1")

    def flags(values: dict[str, bool]) -> tuple[str, ...]:
        switches = (f"--pipeline-depth={2 if on else 1}" if k == "pipeline" else f"--{k}" if on else f"--no-{k}"
                    for k, on in values.items())
        return ("--device", args.device, *switches, *simulated, *args.worker_arg)

    def name(mis: bool, values: dict[str, bool]) -> str:
        return ", ".join(["MIS" if mis else "no MIS", *(f"{k} {'on' if on else 'off'}" for k, on in values.items())])

    base = Arm(name(args.mis, knobs), args.mis, flags(knobs))
    arms = [base]
    for knob in filter(None, args.compare.split(",")):
        if knob == "mis":
            arms.append(Arm(name(not args.mis, knobs), not args.mis, base.worker_flags))
        elif knob in knobs:
            flipped = {**knobs, knob: not knobs[knob]}
            arms.append(replace(base, name=name(args.mis, flipped), worker_flags=flags(flipped)))
        else:
            raise SystemExit(f"--compare: unknown knob {knob!r} (mis, cuda-graph, gc-freeze, pipeline)")
    return arms


def model_dir(name: str) -> Path:
    if name == "smollm2":
        from scorekeeper_worker.library import prepare_smollm2

        return Path(prepare_smollm2(CACHE))
    if name == "qwen3-geometry":
        from bench.gpu.make_qwen3_geometry import make

        return make(CACHE / "qwen3-0.6b-geometry")
    return Path(name)


def mix_from(args: argparse.Namespace) -> Mix:
    if args.preset:
        return PRESETS[args.preset]
    return Mix("custom", ((1.0, Shape(args.query_tokens, args.items, args.item_tokens)),))


async def capacity(client: aiohttp.ClientSession, url: str, bodies: list[bytes], warmup: int) -> float:
    """Requests/s of a burst of len(bodies) concurrent requests, after `warmup` sequential ones."""
    for body in bodies[:warmup]:
        if (status := await post(client, url, body)) != 200:
            raise SystemExit(f"{url}: a warm-up request got {status}")
    started = time.perf_counter()
    statuses = await asyncio.gather(*(post(client, url, body) for body in bodies))
    if any(status != 200 for status in statuses):
        raise SystemExit(f"{url}: the burst got statuses {sorted(set(statuses))}")
    return len(bodies) / (time.perf_counter() - started)


async def sweep(arms: list[Arm], targets: dict[str, Target], pool: BodyPool,
                args: argparse.Namespace) -> dict[str, list[Step]]:
    steps: dict[str, list[Step]] = {arm.name: [] for arm in arms}
    drain_s = max(2 * args.slo_ms / 1000, 10.0)
    connector = aiohttp.TCPConnector(limit=args.max_connections)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as client:
        rules = {}
        for arm in arms:
            bodies = [pool.body(i, arm.mis)[0] for i in range(args.probe)]
            rate = await capacity(client, targets[arm.name].score_url, bodies, args.warmup)
            start = args.start_qps or 0.5 * rate
            log(f"{arm.name}: burst of {args.probe} → {rate:.3g} requests/s; sweep starts at {start:.3g} QPS")
            rules[arm.name] = SweepRule(start, args.growth, args.resolution, args.max_steps)
        sent = 0
        active = list(arms)
        while active:
            for arm in list(active):
                qps = next_qps(steps[arm.name], rules[arm.name], args.slo_ms)
                if qps is None:
                    active.remove(arm)
                    continue
                schedule = poisson_arrivals(qps, args.step_seconds, args.step_requests, f"{args.seed}-{qps:.6g}",
                                            args.step_min_requests)
                step = await run_step(client, targets[arm.name], arm.name, qps, schedule,
                                      lambda i, mis=arm.mis: pool.body(i, mis), sent, drain_s)
                sent += len(schedule)
                steps[arm.name].append(step)
                log(f"{arm.name}: {qps:.3g} QPS → p99 {step.p99_ms:.0f} ms, {step.items_per_s:.3g} items/s, "
                    f"{step.rejected} × 429, {'meets' if step.meets(args.slo_ms) else 'misses'} the SLO "
                    f"(load average {step.load_avg:.1f})")
    return steps


def _finite(value: object) -> object:
    """JSON has no infinity: an unanswered request's latency (and any percentile it decides) is written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _ms(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.0f}"


def step_rows(steps: list[Step], slo_ms: float) -> list[list[str]]:
    rows = []
    for s in steps:
        v = s.server
        server = ["—"] * 7 if v is None else [
            f"{100 * v.queue_share:.0f} %", f"{100 * v.tokenize_share:.1f} %", f"{100 * v.device_busy:.0f} %",
            " / ".join(f"{v.steps_ms[step]:.1f}" for step in STEPS),
            f"{v.gc_collections} / {v.gc_full_collections} / {v.gc_pause_total_ms:.0f} ms / ≤ {_ms(v.gc_pause_max_ms)}",
            f"{v.tokens_per_s:.0f}", f"{100 * v.graph_share:.0f} %"]
        rows.append([s.arm, f"{s.qps:.3g}", f"{s.ok}/{s.sent}", str(s.rejected), str(s.errors + s.unfinished),
                     _ms(s.p50_ms), _ms(s.p99_ms), _ms(s.p999_ms), f"{s.items_per_s:.3g}", *server,
                     f"{s.send_lag_max_ms:.0f}", f"{s.load_avg:.1f}", "yes" if s.meets(slo_ms) else "no"])
    return rows


STEP_HEADER = ["arm", "QPS", "ok/sent", "429", "failed", "p50 ms", "p99 ms", "p99.9 ms", "items/s", "queue share",
               "tokenize share", "device busy", "ms per batch: " + " / ".join(STEPS), "GC n / full / total / max",
               "tokens/s", "graph share", "send lag ms", "load", "meets SLO"]


def summary(arms: list[Arm], steps: dict[str, list[Step]], mix: Mix, slo_ms: float) -> dict[str, object]:
    best = {arm.name: best_at_slo(steps[arm.name], slo_ms) for arm in arms}
    out: dict[str, object] = {"best_by_arm": {n: (b.items_per_s if b else None) for n, b in best.items()}}
    base = best[arms[0].name]
    for arm in arms[1:]:
        other = best[arm.name]
        ratio = base.items_per_s / other.items_per_s if base and other else None
        line = f"{arms[0].name} / {arm.name} at P99 ≤ {slo_ms:g} ms: " + (f"{ratio:.2f}×" if ratio else "n/a")
        if ratio and arms[0].mis != arm.mis:
            token_ratio = mix.token_ratio() if arms[0].mis else 1 / mix.token_ratio()
            share = ratio / token_ratio
            line += (f"; token ratio {token_ratio:.2f}×, so {100 * share:.0f} % of it (target ≥ 70 %: "
                     f"{'met' if share >= 0.7 else 'NOT met'})")
            out["mis_share_of_token_ratio"] = share
        out[f"ratio {arms[0].name} / {arm.name}"] = ratio
        print(line)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, qwen3-geometry or a model directory")
    parser.add_argument("--url", help="a running worker's base URL (no worker is started)")
    parser.add_argument("--metrics-url", help="its /metrics (default: URL/metrics)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer directory for --url (default: --model's)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--query-tokens", type=int, default=120)
    parser.add_argument("--items", type=int, default=10)
    parser.add_argument("--item-tokens", type=int, default=180)
    parser.add_argument("--text", action="store_true", help="send texts (tokenized by the worker), not token ids")
    parser.add_argument("--mis", action=argparse.BooleanOptionalAction, default=True, help="base arm's MIS")
    parser.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, help="default: on with cuda")
    parser.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=True,
                        help="two batches in flight (--pipeline-depth 2); --no-pipeline: one")
    parser.add_argument("--compare", default="", help="comma-separated knobs flipped in extra arms: mis, "
                        "cuda-graph, gc-freeze, pipeline")
    parser.add_argument("--worker-arg", action="append", default=[], help="extra worker flag (repeatable)")
    parser.add_argument("--simulate-device-ms", type=float, help="simulate the device: this many ms per 8,192 tokens "
                        "of each forward's bucket (the host pipeline's speed, not a GPU's)")
    parser.add_argument("--slo-ms", type=float, default=500.0)
    parser.add_argument("--start-qps", type=float, help="default: half the capacity a burst measures")
    parser.add_argument("--growth", type=float, default=1.5)
    parser.add_argument("--resolution", type=float, default=1.15)
    parser.add_argument("--max-steps", type=int, default=8, help="most steps per arm")
    parser.add_argument("--step-seconds", type=float, default=60.0)
    parser.add_argument("--step-requests", type=int, default=2000, help="most requests per step")
    parser.add_argument("--step-min-requests", type=int, default=20, help="fewest requests per step (a slow rate "
                        "runs past --step-seconds)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--probe", type=int, default=8, help="requests in the capacity burst")
    parser.add_argument("--pool", type=int, default=256, help="distinct request bodies, cycled")
    parser.add_argument("--max-connections", type=int, default=2048)
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of the workers started here (default: torch's "
                        "choice, every core; on a shared CPU machine 1 avoids threads spinning for a busy core)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker-log", type=Path, help="keep the log of the worker started here (its first arm's)")
    args = parser.parse_args()
    set_threads(args.threads)
    exit_on_sigterm()

    from transformers import AutoTokenizer

    mix, arms = mix_from(args), arms_for(args)
    model = None if args.url and args.tokenizer else model_dir(args.model)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or model)
    pool = BodyPool(mix, tokenizer, label_ids(tokenizer), args.text, args.pool, args.seed)
    log(f"{mix.name}: {mix.shapes}, token ratio without/with MIS {mix.token_ratio():.3f}; arms: "
        + "; ".join(a.name for a in arms))
    workers: dict[tuple[str, ...], Worker] = {}
    targets: dict[str, Target] = {}
    try:
        for arm in arms:
            if args.url:
                if len({a.worker_flags for a in arms}) > 1:
                    raise SystemExit("--url: only --compare mis (one worker serves every arm)")
                base = args.url.rstrip("/")
                targets[arm.name] = Target(f"{base}/v1/score", args.metrics_url or f"{base}/metrics")
                continue
            if arm.worker_flags not in workers:
                assert model is not None
                workers[arm.worker_flags] = Worker(model, args.dtype, list(arm.worker_flags))
                metrics = workers[arm.worker_flags].client.get("/metrics")
                log(f"{arm.name}: {startup_note(parse(metrics.text)) if metrics.is_success else 'no /metrics'}")
            url = workers[arm.worker_flags].url
            targets[arm.name] = Target(f"{url}/v1/score", f"{url}/metrics")
        steps = asyncio.run(sweep(arms, targets, pool, args))
    finally:
        if args.worker_log and workers:
            args.worker_log.write_text(next(iter(workers.values())).tail(chars=1 << 24))
        for worker in workers.values():
            worker.close()
    all_steps = [s for arm in arms for s in steps[arm.name]]
    device = args.device if args.simulate_device_ms is None else \
        f"a simulated device ({args.simulate_device_ms:g} ms per 8,192 tokens: host pipeline, simulated device)"
    print(f"\n{args.model if not args.url else args.url}, {args.dtype} on {device}; {mix.name} "
          f"({'text' if args.text else 'token ids'}); P99 SLO {args.slo_ms:g} ms; {machine_note()}\n")
    print(markdown_table(STEP_HEADER, step_rows(all_steps, args.slo_ms)) + "\n")
    for arm in arms:
        best = best_at_slo(steps[arm.name], args.slo_ms)
        busy = f", device busy {100 * best.server.device_busy:.0f} %" if best and best.server else ""
        print(f"{arm.name}: " + (f"{best.items_per_s:.4g} items/s at P99 {best.p99_ms:.0f} ms ({best.qps:.3g} QPS"
                                 f"{busy})" if best else "no step met the SLO"))
    result = summary(arms, steps, mix, args.slo_ms)
    if args.json:
        base = best_at_slo(steps[arms[0].name], args.slo_ms)
        args.json.write_text(json.dumps(_finite({
            "steps": [asdict(s) for s in all_steps], "best_items_per_s_at_slo": base.items_per_s if base else None,
            "slo_ms": args.slo_ms, "arms": [asdict(a) for a in arms], "workload": mix.name,
            "token_ratio": mix.token_ratio(), "machine": machine_note(), "argv": sys.argv[1:], **result}), indent=1))


if __name__ == "__main__":
    main()
