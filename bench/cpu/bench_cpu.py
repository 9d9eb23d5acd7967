"""The CPU tier (issue 23): rerank and embeddings with all-MiniLM-L6-v2, the Scorekeeper worker (float32 and int8)
against vLLM's CPU server, Infinity, sentence-transformers and transformers, on the same CPUs, in one run.

Work: 1 query (16 tokens) against 200 documents, a "short" mix (8–64 tokens each) and a "long" mix (32–224), seeded
single-token words (bench_minilm.py), so every system gets the same token counts.
- rerank: the MiniLM trunk with a seeded 1-logit head (BertForSequenceClassification, built once into
  .cache/models/minilm-cross-encoder); relevance = sigmoid(logit). HTTP: scorekeeper, vLLM, Infinity (/rerank);
  in-process, without HTTP: sentence-transformers `CrossEncoder.predict`, transformers padded batches of 32.
- embed: the MiniLM embedding model; one request embeds the query and the documents, cosines client-side. HTTP:
  scorekeeper, vLLM, Infinity (/embeddings); in-process: `SentenceTransformer.encode`, transformers padded.

Every process is pinned to the same CPUs (this script pins itself; children inherit) with the same thread count
(`--threads`); vLLM runs with its own binding ("auto": it keeps one core for its frontend). Repetitions go
round-robin after a warm-up, alternating the order; after each answer the run waits until that system is idle again
(idle.py: vLLM busy-polls a core for about a second after every response), so each system is timed beside the
condition's load only, and the CPU-seconds a system used after answering get a column of their own. Conditions:
`--stress N` runs `stress --cpu N` on the same CPUs throughout, `--neighbours N` the same at `nice -n 19` (other
pods using whatever CPU is spare); `--isa avx2` caps every system to AVX2 (an AVX-512 CPU standing in for one without
it). Prints the CPU model, its ISA flags, the condition, each system's threads and configuration, then the tables
with ratios to the best peer measured in the same run.

`--systems …,floor` adds the floor (peers.FloorPeer, bench/cpu/gemm_floor.py): not a server but the matrix products any
server of the model must run for the request, with the norms and softmax around them, timed in the same rounds. The
machine's speed moves between minutes on a shared VM, so only a floor timed beside the peers bounds them: the
ceiling line says how far ahead of the best peer any server using these kernels could be, and what the 1.15× target
leaves for everything else.

    .venv/bin/python bench/cpu/bench_cpu.py                       # both tasks, both mixes, every system
    .venv/bin/python bench/cpu/bench_cpu.py --stress 2            # the same with `stress --cpu 2` beside it
    .venv/bin/python bench/cpu/bench_cpu.py --neighbours 2 --isa avx2   # low-priority neighbours, capped to AVX2
    .venv/bin/python bench/cpu/bench_cpu.py --quick --tasks rerank --systems scorekeeper,scorekeeper-int8,vllm
    .venv/bin/python bench/cpu/bench_cpu.py --quick --systems scorekeeper,vllm,vllm-bind-all,st,floor  # + the ceiling
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.cpu.bench_minilm import MIXES, make_workload
from bench.cpu.gemm_floor import FLOOR, TARGET
from bench.harness import http_servers
from bench.harness.common import (
    AVX2_CAP,
    REPO,
    Peer,
    background_load,
    log,
    markdown_table,
    max_abs_diff,
    median,
    set_threads,
)
from bench.harness.idle import SETTLE_TIMEOUT_S, settle

CROSS_ENCODER_DIR = REPO / ".cache" / "models" / "minilm-cross-encoder"
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16")
IN_PROCESS = {"rerank": {"st": "st-cross", "hf": "hf-cross", FLOOR: FLOOR},
              "embed": {"st": "st", "hf": "hf", FLOOR: FLOOR}}
LABELS = {"scorekeeper": "scorekeeper float32 (HTTP)", "scorekeeper-int8": "scorekeeper int8 (HTTP)",
          "scorekeeper-gnu": "scorekeeper float32, libgomp (--openmp-runtime gnu) (HTTP)",
          "scorekeeper-blocktime0": "scorekeeper float32, KMP_BLOCKTIME=0 (HTTP)",
          "scorekeeper-blocktime1": "scorekeeper float32, KMP_BLOCKTIME=1 (HTTP)",
          "scorekeeper-threads1": "scorekeeper float32, one thread (--threads 1) (HTTP)",
          "vllm": "vLLM CPU (HTTP)", "vllm-bind-all": "vLLM CPU, compute on every core (HTTP)",
          "infinity": "Infinity (HTTP)", "st": "sentence-transformers (in-process)",
          "hf": "transformers padded, batch 32 (in-process)",
          FLOOR: "floor: matrix products at the linear layers' rate, norms, softmax (in-process)"}
OURS = ("scorekeeper", "scorekeeper-int8", "scorekeeper-gnu", "scorekeeper-blocktime0", "scorekeeper-blocktime1",
        "scorekeeper-threads1")


def cross_encoder_dir() -> Path:
    """MiniLM's trunk and pooler with a seeded 1-logit classifier head, saved once."""
    if not (CROSS_ENCODER_DIR / "model.safetensors").exists():
        import torch
        from scorekeeper_worker.library import minilm_path
        from transformers import AutoTokenizer, BertForSequenceClassification

        torch.manual_seed(0)
        model = BertForSequenceClassification.from_pretrained(minilm_path(), num_labels=1)
        model.save_pretrained(CROSS_ENCODER_DIR)
        AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(CROSS_ENCODER_DIR)
    return CROSS_ENCODER_DIR


def cpu_description() -> tuple[str, list[str]]:
    text = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((set(line.split(":", 1)[1].split()) for line in text.splitlines() if line.startswith("flags")), set())
    return model, [flag for flag in ISA_FLAGS if flag in flags]


def start(system: str, task: str, model: Path, threads: int, cpus: set[int]) -> Any:
    if system in OURS:
        extra = {"scorekeeper-int8": ["--quantization", "int8"], "scorekeeper-gnu": ["--openmp-runtime", "gnu"]}
        blocktime = system.removeprefix("scorekeeper-blocktime") if "blocktime" in system else None
        own_threads = 1 if system == "scorekeeper-threads1" else threads
        return http_servers.scorekeeper(system, model, own_threads, cpus, extra.get(system, []),
                                        {"KMP_BLOCKTIME": blocktime, "KMP_TPAUSE": "0"} if blocktime else None)
    if system.startswith("vllm"):
        return http_servers.vllm(model, cpus, "auto" if system == "vllm" else f"{min(cpus)}-{max(cpus)}")
    if system == "infinity":
        return http_servers.infinity(model, threads, cpus)
    peer = Peer(IN_PROCESS[task][system], model, "float32", {"query": "", "items": []}, options={"task": task},
                env=worker_runtime() if system == FLOOR else None)
    peer.threads = f"{threads} (OMP_NUM_THREADS)"  # type: ignore[attr-defined]
    peer.config = f"OMP_NUM_THREADS={threads}, in-process"  # type: ignore[attr-defined]
    return peer


def worker_runtime() -> dict[str, str]:
    """The worker's own OpenMP runtime for the floor: Intel's, with TCMalloc, preloaded, and its wait setting."""
    from scorekeeper_worker.base.config import OpenMPRuntime
    from scorekeeper_worker.serving.startup.openmp_env import REEXEC_MARKER, find_libiomp, find_tcmalloc, reexec_env

    env = reexec_env(OpenMPRuntime.INTEL, {}, find_libiomp(), find_tcmalloc()) or {}
    env.pop(REEXEC_MARKER, None)
    return env


def once(runner: Any, task: str, workload: dict[str, Any]) -> tuple[float, list[float]]:
    if isinstance(runner, Peer):
        seconds, result = runner.run(workload={key: workload[key] for key in ("query", "items", "lengths")})
        return seconds, result["scores"]
    call = runner.rerank if task == "rerank" else runner.embed
    return call(workload["query"], workload["items"])  # type: ignore[no-any-return]


def run_task(task: str, systems: list[str], workloads: dict[str, dict[str, Any]], args: argparse.Namespace,
             cpus: set[int]) -> list[dict[str, Any]]:
    from scorekeeper_worker.library import minilm_path

    model = cross_encoder_dir() if task == "rerank" else minilm_path()
    runners: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    loads: list[subprocess.Popen[bytes]] = []
    try:
        for system in systems:
            why = http_servers.available(system)
            try:
                if why is None:
                    runners[system] = start(system, task, model, args.threads, cpus)
            except RuntimeError as error:
                lines = str(error).splitlines()  # a refusal's reason is the worker's "failed to load" line
                why = next((line for line in reversed(lines) if "failed to load" in line), lines[0])[:400]
            if why is not None:
                log(f"{system} unavailable: {why}")
                records += [{"task": task, "mix": mix, "system": system, "unavailable": why} for mix in workloads]
        for command in load_commands(args):
            loads.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          start_new_session=True))
        for mix, workload in workloads.items():
            times: dict[str, list[float]] = {s: [] for s in runners}
            after: dict[str, list[float]] = {s: [] for s in runners}
            scores: dict[str, list[float]] = {}
            for _ in range(args.warmup):
                for system, runner in runners.items():
                    _, scores[system] = once(runner, task, workload)
                    settled(system, runner)
            for rep in range(args.reps):
                for system in list(runners) if rep % 2 == 0 else list(reversed(runners)):
                    times[system].append(once(runners[system], task, workload)[0])
                    after[system].append(settled(system, runners[system]))
                log(f"{task} {mix} rep {rep + 1}/{args.reps}: "
                    + ", ".join(f"{s} {times[s][-1]:.2f}s (then {after[s][-1]:.2f} CPU-s)" for s in runners))
            records += [{"task": task, "mix": mix, "system": s, "times": times[s], "scores": scores[s],
                         "cpu_after": after[s], "threads": runners[s].threads, "config": runners[s].config,
                         "items_per_s": len(workload["items"]) / median(times[s])} for s in runners]
    finally:
        for load in loads:
            os.killpg(load.pid, 15)
            load.wait(30)
        for runner in runners.values():
            runner.close()
    return records


def settled(system: str, runner: Any) -> float:
    """Wait until `system` is idle again after answering (vLLM busy-polls about a second): the next system is timed
    on idle cores. Returns the CPU-seconds it used meanwhile."""
    used, idle = settle({runner.proc.pid})  # each runner leads a session of its own
    if not idle:
        log(f"{system} still busy {SETTLE_TIMEOUT_S:.0f} s after answering; timing the next system anyway")
    return used


def load_commands(args: argparse.Namespace) -> list[list[str]]:
    """The background load of the run's condition (`--stress`, `--neighbours`: both may be given)."""
    conditions = (("stress", args.stress), ("neighbours", args.neighbours))
    return [command for condition, cpus in conditions if cpus and (command := background_load(condition, cpus))]


def spearman(a: list[float], b: list[float]) -> float:
    from scorekeeper_worker.library import spearman as rank_correlation

    return rank_correlation(a, b)


def report(records: list[dict[str, Any]]) -> str:
    out = []
    for task in dict.fromkeys(r["task"] for r in records):
        for mix in dict.fromkeys(r["mix"] for r in records if r["task"] == task):
            group = [r for r in records if r["task"] == task and r["mix"] == mix]
            ran = [r for r in group if "unavailable" not in r]
            peers = [r for r in ran if r["system"] not in (*OURS, FLOOR)]
            best = max(peers, key=lambda r: r["items_per_s"]) if peers else None
            reference = next((r["scores"] for r in ran if r["system"] == "hf"), None)
            rows = []
            for r in group:
                if "unavailable" in r:
                    rows.append([LABELS[r["system"]], "", "unavailable", "", "", "", "", r["unavailable"][:60]])
                    continue
                ratio = f"{r['items_per_s'] / best['items_per_s']:.2f}×" if best else "n/a"
                scored = reference and r["scores"]
                diff = f"{max_abs_diff(r['scores'], reference):.1e}" if scored else "n/a"
                rank = f"{spearman(reference, r['scores']):.4f}" if scored else "n/a"
                rows.append([LABELS[r["system"]], r["threads"], f"{r['items_per_s']:.1f}",
                             f"{1000 * median(r['times']):.0f}", f"{median(r['cpu_after']):.2f}", ratio, diff, rank])
            out.append(f"\n### {task}, {mix} mix\n")
            out.append(markdown_table(["system", "threads", "items/s", "ms/request", "CPU-s after answering",
                                       "vs best peer",
                                       "max |Δ| vs fp32 transformers", "Spearman vs fp32 transformers"], rows))
            by = {r["system"]: r for r in ran}
            if best and "scorekeeper" in by:
                sk = by["scorekeeper"]
                rounds = [b / s for s, b in zip(sk["times"], best["times"], strict=False)]
                out.append(f"\nfloat32: scorekeeper / best peer ({LABELS[best['system']]}) = "
                           f"{sk['items_per_s'] / best['items_per_s']:.2f}× (per round {min(rounds):.2f}–"
                           f"{max(rounds):.2f}×); target ≥ {TARGET}×")
            if best and FLOOR in by:
                out.append(ceiling(best, by[FLOOR], by.get("scorekeeper")))
            if "scorekeeper" in by and "scorekeeper-int8" in by:
                int8, fp32 = by["scorekeeper-int8"], by["scorekeeper"]
                speedup = int8["items_per_s"] / fp32["items_per_s"]
                out.append(f"int8: scorekeeper int8 / scorekeeper float32 = {speedup:.2f}×, "
                           f"Spearman vs scorekeeper float32 {spearman(fp32['scores'], int8['scores']):.4f}; "
                           "target ≥ 2× (AVX2), ≥ 3× (AVX-512 VNNI or AMX), Spearman ≥ 0.99")
    return "\n".join(out)


def ceiling(best: dict[str, Any], floor: dict[str, Any], ours: dict[str, Any] | None) -> str:
    """The most any server of this model could gain on the best peer with these kernels, round by round (each round
    times the peer and the floor within seconds of each other), and what 1.15× would leave for all the rest."""
    rounds = [b / f for b, f in zip(best["times"], floor["times"], strict=False)]
    left = median(best["times"]) / TARGET - median(floor["times"])
    spent = f"; scorekeeper spends {median(ours['times']) - median(floor['times']):.3f} s on it" if ours else ""
    return (f"ceiling: best peer / floor = {median(best['times']) / median(floor['times']):.2f}× (per round "
            f"{min(rounds):.2f}–{max(rounds):.2f}×); at {TARGET}× everything the floor leaves out (tokenization, "
            f"copies, HTTP, the kernels' own losses) would have {left:.3f} s{spent}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="rerank,embed")
    parser.add_argument("--mix", default="short,long")
    parser.add_argument("--systems", default="scorekeeper,scorekeeper-int8,vllm,infinity,st,hf",
                        help=f"comma-separated, of: {', '.join(LABELS)}")
    parser.add_argument("--cpus", help="CPU list every process is pinned to, e.g. 0-1 (default: this process's)")
    parser.add_argument("--threads", type=int, help="threads per system (default: the CPUs pinned to)")
    parser.add_argument("--stress", type=int, default=0, help="run `stress --cpu N` on the same CPUs throughout")
    parser.add_argument("--neighbours", type=int, default=0,
                        help="run `nice -n 19 stress --cpu N` on the same CPUs throughout (low-priority neighbours)")
    parser.add_argument("--isa", choices=("native", "avx2"), default="native",
                        help="avx2: cap every system to AVX2 (common.AVX2_CAP)")
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="3 repetitions after 1 warm-up")
    parser.add_argument("--json", type=Path, help="write the raw records here")
    args = parser.parse_args()
    if args.isa == "avx2":
        os.environ.update(AVX2_CAP)  # before torch loads here; every child inherits it
    if args.quick:
        args.reps, args.warmup = 3, 1
    if args.cpus:
        low, _, high = args.cpus.partition("-")
        os.sched_setaffinity(0, set(range(int(low), int(high or low) + 1)))
    cpus = os.sched_getaffinity(0)
    args.threads = args.threads or len(cpus)
    set_threads(args.threads)
    from scorekeeper_worker.library import minilm_path

    workloads = {mix: make_workload(minilm_path(), mix, args.items, args.seed) for mix in args.mix.split(",")}
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    records: list[dict[str, Any]] = []
    for task in args.tasks.split(","):
        records += run_task(task, args.systems.split(","), workloads, args, cpus)
    model, flags = cpu_description()
    condition = ", ".join(" ".join(command) for command in load_commands(args)) or "quiet (no background load)"
    isa = "capped to AVX2 for every system: " + " ".join(f"{k}={v}" for k, v in AVX2_CAP.items()) \
        if args.isa == "avx2" else "native"
    print(f"\nCPU: {model}; ISA flags: {', '.join(flags) or 'none of ' + ', '.join(ISA_FLAGS)}; instructions: {isa}; "
          f"pinned to CPUs {sorted(cpus)}; load average before the run {load}; condition: {condition}; "
          f"{args.reps} repetitions after {args.warmup} warm-up, medians, each request once the previous system "
          f"was idle; 1 query × {args.items} documents: "
          + "; ".join(f"{m} mix {MIXES[m][0]}–{MIXES[m][1]} tokens, {w['tokens']} tokens in all"
                      for m, w in workloads.items()))
    configs = {r["system"]: r["config"] for r in records if "config" in r}
    print("\nConfigurations:\n" + "\n".join(f"- {LABELS[system]}: `{config}`" for system, config in configs.items()))
    print(report(records))
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
