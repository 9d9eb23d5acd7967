"""/v1/decisions with SmolLM2-135M-Instruct: 16 questions about one 2,048-token input in one request (the input runs
once, every question is an item of it: multi-item scoring) against one question alone, and against the same 16
questions as separate prompts, which is what SGLang and vLLM do (one prompt per question).

Systems, all on one worker (`--multi-item-scoring`, default batch budget), timed on the client:
- one:      POST /v1/decisions with the first question only;
- all16:    POST /v1/decisions with the 16 questions;
- separate: the 16 questions as 16 single-question requests sent at once (the worker batches them as it batches any
            concurrent requests; each runs the whole input).
Repetitions are interleaved round-robin (alternating order) after a warm-up, so the noise of a shared machine hits
every system alike: compare the ratios (the median of each repetition's ratio), not absolute times. Beside the wall
time, the worker's own CPU time per request (from /proc), which other processes on the machine disturb less. The
input is seeded support-ticket text cut to 2,048 tokens of SmolLM2's tokenizer; the questions are predicates,
choices (options of one and of several tokens) and scores, about 40 tokens each once rendered. Issue target: all16 ≤
1.5 × one.

    .venv/bin/python bench/scoring/bench_decisions.py   # 3 repetitions after a warm-up (~10 min on 2 cores)
    .venv/bin/python bench/scoring/bench_decisions.py --reps 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

from bench.harness.common import (
    Worker,
    log,
    machine_note,
    markdown_table,
    max_abs_diff,
    median,
    parse_worker_args,
    post_json,
)

DEFAULT_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "models"
INPUT_TOKENS = 2048
SENTENCES = ["I was charged twice for order #{n} and I want one of the charges refunded.",
             "The delivery of the replacement part took {n} days, which is far too long.",
             "Your support agent promised a call back on Monday but nobody called.",
             "The invoice lists a premium plan, but I only ever subscribed to the basic one.",
             "My account was locked after {n} failed logins even though the password was right.",
             "I have been a customer for {n} years and this is the worst service I have had.",
             "Please cancel the renewal and confirm in writing that no further payment will be taken.",
             "The mobile app crashes every time I open the billing page on my phone."]


def _predicate(instructions: str) -> dict[str, Any]:
    return {"type": "predicate", "instructions": instructions}


def _choice(instructions: str, *values: str) -> dict[str, Any]:
    return {"type": "choice", "instructions": instructions, "choices": [{"value": value} for value in values]}


def _score(instructions: str, *labels: str) -> dict[str, Any]:
    """Levels lowest first."""
    return {"type": "score", "instructions": instructions, "levels": [{"label": label} for label in labels]}


QUESTIONS: list[dict[str, Any]] = [
    _predicate("The customer asks for a refund of a charge."),
    {"type": "choice", "instructions": "How urgent is this ticket for the support team?",
     "choices": [{"value": "low", "description": "can wait a week"}, {"value": "high", "description": "today"}]},
    _score("How frustrated is the customer, judging by the whole message?", "calm", "annoyed", "angry"),
    _predicate("The customer threatens to cancel the subscription."),
    _choice("Which team should handle this ticket first?", "billing", "technical support", "account security",
            "logistics"),
    _predicate("The message mentions an order number."),
    _score("How polite is the message overall?", "rude", "neutral", "polite"),
    _choice("What does the customer want most?", "a refund", "an apology", "a call back", "a fix"),
    _predicate("The customer reports a problem with the mobile app."),
    _choice("Which language is the message written in?", "English", "German", "French"),
    _predicate("The customer has been with the company for several years."),
    _score("How likely is the customer to leave within a month?", "unlikely", "possible", "likely", "certain"),
    _predicate("The customer's account is locked."),
    _choice("Which channel should the answer use?", "email", "phone", "chat"),
    _predicate("The message asks for written confirmation."),
    _score("How severe is the issue for the business?", "minor", "major", "critical"),
]


def make_input(model_dir: Path, seed: int) -> tuple[str, int]:
    """Seeded ticket text cut to INPUT_TOKENS tokens of the model's tokenizer (counted again after the cut)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(seed)
    text = ""
    while len(tok(text, add_special_tokens=False)["input_ids"]) < INPUT_TOKENS:
        text += " ".join(rng.choice(SENTENCES).format(n=rng.randint(2, 9999)) for _ in range(50)) + " "
    ids = tok(text, add_special_tokens=False)["input_ids"][:INPUT_TOKENS]
    text = tok.decode(ids)
    return text, len(tok(text, add_special_tokens=False)["input_ids"])


def cpu_seconds(pid: int) -> float:
    """CPU time a process has used so far, every thread (utime + stime of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def decide(worker: Worker, text: str, questions: list[dict[str, Any]]) -> tuple[float, dict[str, Any]]:
    return post_json(worker.client, "/v1/decisions", {"model": "bench", "input": text, "questions": questions})


def separate(worker: Worker, text: str, pool: ThreadPoolExecutor) -> tuple[float, list[dict[str, Any]]]:
    started = time.perf_counter()
    bodies = list(pool.map(lambda q: decide(worker, text, [q])[1], QUESTIONS))
    return time.perf_counter() - started, bodies


def probabilities(answers: list[dict[str, Any]]) -> list[float]:
    return [p for a in answers for p in ([a["probability"]] if a["type"] == "predicate"
                                         else [e["probability"] for e in a["probabilities"]])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--reps", type=int, default=3, help="timed repetitions of every system, after one warm-up")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="where the converted SmolLM2 dir lives")
    args = parse_worker_args(parser, threads_help="OMP_NUM_THREADS for the worker (default: torch's own choice)",
                             json_help="write the raw timings here")
    from scorekeeper_worker.library import prepare_smollm2

    model_dir = Path(prepare_smollm2(args.cache))
    text, input_tokens = make_input(model_dir, args.seed)
    log(f"model {model_dir}; input {input_tokens} tokens, {len(QUESTIONS)} questions")
    times: dict[str, list[float]] = {"one": [], "all16": [], "separate": []}
    cpu: dict[str, list[float]] = {"one": [], "all16": [], "separate": []}  # the worker's CPU seconds
    tokens: dict[str, int] = {}
    with Worker(model_dir, args.dtype, ["--multi-item-scoring", *args.worker_arg]) as worker, \
            ThreadPoolExecutor(len(QUESTIONS)) as pool:
        runs = {"one": lambda: decide(worker, text, QUESTIONS[:1]),
                "all16": lambda: decide(worker, text, QUESTIONS),
                "separate": lambda: separate(worker, text, pool)}
        results: dict[str, Any] = {}
        for rep in range(args.reps + 1):  # the first round warms up (not timed)
            order = list(runs) if rep % 2 == 0 else list(reversed(runs))
            seconds: dict[str, float] = {}
            for system in order:
                used = cpu_seconds(worker.proc.pid)
                seconds[system], results[system] = runs[system]()
                if rep:
                    times[system].append(seconds[system])
                    cpu[system].append(cpu_seconds(worker.proc.pid) - used)
            log(f"rep {rep}{' (warm-up)' if not rep else ''}: " + ", ".join(f"{s} {seconds[s]:.2f}s" for s in order))
    tokens["one"] = results["one"]["usage"]["input_tokens"]
    tokens["all16"] = results["all16"]["usage"]["input_tokens"]
    tokens["separate"] = sum(body["usage"]["input_tokens"] for body in results["separate"])
    together = probabilities(results["all16"]["answers"])
    apart = probabilities([body["answers"][0] for body in results["separate"]])
    rows = []
    labels = {"one": "1 question", "all16": "16 questions, one request (input once)",
              "separate": "16 separate prompts (one per question: SGLang, vLLM)"}
    def ratio(values: dict[str, list[float]], a: str, b: str) -> float:
        """The median of the per-repetition ratios: each repetition ran both systems back to back."""
        return median([x / y for x, y in zip(values[a], values[b], strict=True)])

    for system in runs:
        rows.append([labels[system], str(tokens[system]), f"{median(times[system]):.2f}",
                     f"{ratio(times, system, 'one'):.2f}×", f"{ratio(times, 'separate', system):.1f}×",
                     f"{median(cpu[system]):.2f}", f"{ratio(cpu, system, 'one'):.2f}×"])
    print(f"\nSmolLM2-135M-Instruct ({args.dtype}), /v1/decisions, input {input_tokens} tokens, {len(QUESTIONS)} "
          f"questions; {machine_note()}; medians of {args.reps} interleaved repetitions after a warm-up\n")
    print(markdown_table(["system", "tokens run", "median s", "vs 1 question", "speed-up vs separate prompts",
                          "worker CPU s", "CPU vs 1 question"], rows))
    for what, values in (("wall time", times), ("worker CPU time", cpu)):
        ratios = [a / o for a, o in zip(values["all16"], values["one"], strict=True)]
        found = ratio(values, "all16", "one")
        print(f"\n16 questions / 1 question, {what}: {found:.2f}× (median of the repetitions: "
              f"{', '.join(f'{r:.2f}' for r in ratios)}; target ≤ 1.5×: {'met' if found <= 1.5 else 'NOT met'})")
    print(f"\nmax |Δp| between the 16-question request and the separate prompts: {max_abs_diff(together, apart):.1e}")
    if args.json:
        args.json.write_text(json.dumps({"times": times, "cpu": cpu, "tokens": tokens, "input_tokens": input_tokens},
                                        indent=1))


if __name__ == "__main__":
    main()
