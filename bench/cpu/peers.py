"""Peer systems for the benchmarks, one per process, driven by JSON lines on stdin (see bench/harness/common.py `Peer`).

    python bench/cpu/peers.py --system SYSTEM --model DIR --dtype float32|bfloat16 --workload FILE    # SYSTEMS below

The process loads the model, answers {"ready": true, ...} and then, for each {"cmd": "run", ...} line, does one
timed repetition and answers {"seconds": s, "scores": [...]}. The workload (query + items) comes from the file and
may be replaced by a "workload" key of a run line. Runs under the main venv (sentence-transformers, transformers)
and under .venv-bench (Infinity), so it imports only what its system needs.

Embedding systems (st, hf, infinity) do the whole job every time: embed the query and all items, then cosines.
hf-causal scores label-token probabilities at the last token of every query+item row, batched (padded) rows.
Cross-encoder systems (st-cross, hf-cross) score every (query, item) pair: the sigmoid of the single logit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The protocol owns the real stdout; everything libraries print goes to stderr.
_PROTO = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)
sys.stdout = sys.stderr

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.* imports

import torch  # noqa: E402


def send(message: dict[str, Any]) -> None:
    _PROTO.write(json.dumps(message) + "\n")
    _PROTO.flush()


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


@dataclass(frozen=True)
class Timed:
    """A repetition that reports its own time (the floor: what it ran plus what it counts at that rate)."""

    scores: list[Any]
    seconds: float


def cosines(embeddings: torch.Tensor) -> list[float]:
    """Row 0 is the query; cosine of every other row with it, in float32."""
    e = torch.nn.functional.normalize(embeddings.float(), dim=-1)
    return (e[1:] @ e[0]).tolist()


class SentenceTransformersPeer:
    """`SentenceTransformer.encode` with its defaults (batch_size=32, length-sorted batches)."""

    def __init__(self, model: str, dtype: str, options: dict[str, Any]) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model, device="cpu")
        if dtype != "float32":
            self.model = self.model.to(torch_dtype(dtype))
        self.batch_size = int(options.get("batch_size", 32))

    def run(self, workload: dict[str, Any]) -> list[Any]:
        texts = [workload["query"], *workload["items"]]
        with torch.inference_mode():
            emb = self.model.encode(texts, batch_size=self.batch_size, convert_to_tensor=True,
                                    show_progress_bar=False)
        return cosines(emb)


class TransformersPaddedPeer:
    """Plain transformers: padded batches of `batch_size` texts in request order, mean pooling."""

    def __init__(self, model: str, dtype: str, options: dict[str, Any]) -> None:
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModel.from_pretrained(model, dtype=torch_dtype(dtype)).eval()
        self.batch_size = int(options.get("batch_size", 32))
        self.max_length = int(options.get("max_length", 512))

    def run(self, workload: dict[str, Any]) -> list[Any]:
        texts = [workload["query"], *workload["items"]]
        pooled = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(texts[start:start + self.batch_size], padding=True, truncation=True,
                                     max_length=self.max_length, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state.float()
                mask = enc["attention_mask"].unsqueeze(-1).float()
                pooled.append((hidden * mask).sum(1) / mask.sum(1))
        return cosines(torch.cat(pooled))


class InfinityPeer:
    """infinity-emb's `AsyncEmbeddingEngine` (torch engine, CPU) with its own dynamic batching."""

    def __init__(self, model: str, dtype: str, options: dict[str, Any]) -> None:
        from infinity_emb import AsyncEngineArray, EngineArgs

        self.loop = asyncio.new_event_loop()
        args = EngineArgs(model_name_or_path=model, engine="torch", device="cpu", dtype=dtype,
                          batch_size=int(options.get("batch_size", 32)))
        self.engine = AsyncEngineArray.from_args([args])[0]
        self.loop.run_until_complete(self.engine.astart())

    def run(self, workload: dict[str, Any]) -> list[Any]:
        texts = [workload["query"], *workload["items"]]
        embeddings, _usage = self.loop.run_until_complete(self.engine.embed(sentences=texts))
        return cosines(torch.tensor(__import__("numpy").stack(embeddings)))

    def close(self) -> None:
        self.loop.run_until_complete(self.engine.astop())


class CrossEncoderPeer:
    """sentence-transformers `CrossEncoder.predict` (batch_size=32 in request order, sigmoid of a single logit)."""

    def __init__(self, model: str, dtype: str, options: dict[str, Any]) -> None:
        from sentence_transformers import CrossEncoder

        self.model = CrossEncoder(model, device="cpu")
        if dtype != "float32":
            self.model.model.to(torch_dtype(dtype))
        self.batch_size = int(options.get("batch_size", 32))

    def run(self, workload: dict[str, Any]) -> list[Any]:
        pairs = [(workload["query"], item) for item in workload["items"]]
        with torch.inference_mode():
            return [float(s) for s in self.model.predict(pairs, batch_size=self.batch_size, show_progress_bar=False)]


class TransformersCrossPeer:
    """Plain transformers sequence classifier: padded pair batches of `batch_size` in request order, sigmoid."""

    def __init__(self, model: str, dtype: str, options: dict[str, Any]) -> None:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForSequenceClassification.from_pretrained(model, dtype=torch_dtype(dtype)).eval()
        self.batch_size = int(options.get("batch_size", 32))

    def run(self, workload: dict[str, Any]) -> list[Any]:
        items = workload["items"]
        out: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(items), self.batch_size):
                chunk = items[start:start + self.batch_size]
                enc = self.tokenizer([workload["query"]] * len(chunk), chunk, padding=True, truncation=True,
                                     max_length=512, return_tensors="pt")
                out += torch.sigmoid(self.model(**enc).logits[:, -1].float()).tolist()
        return out


class TransformersCausalPeer:
    """Plain transformers causal LM: rows `query + item` in batches of `batch_size` (equal-length rows here, so the
    batch is padded to nothing), logits of the label tokens at the last position, softmax over them."""

    def __init__(self, model: str, dtype: str, options: dict[str, Any]) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch_dtype(dtype)).eval()
        self.batch_size = int(options.get("batch_size", 32))

    def run(self, workload: dict[str, Any]) -> list[Any]:
        query, items, labels = workload["query"], workload["items"], workload["labels"]
        limit = workload.get("limit") or len(items)
        rows = [query + item for item in items[:limit]]
        if len({len(r) for r in rows}) != 1:
            raise ValueError("hf-causal expects equal-length rows (no padding implemented)")
        out = []
        with torch.inference_mode():
            for start in range(0, len(rows), self.batch_size):
                ids = torch.tensor(rows[start:start + self.batch_size])
                logits = self.model(input_ids=ids, logits_to_keep=1).logits[:, -1, labels].float()
                out.append(torch.softmax(logits, dim=-1))
        return torch.cat(out).tolist()


class FloorPeer:
    """Not a server: the matrix products any server of this model must run for the request (bench/cpu/gemm_floor.py),
    timed in the benchmark's own rounds, so its ceiling (best peer / floor) is measured at the machine's speed of that
    run, under the worker's runtime (bench_cpu.py preloads it) and allocator thresholds. The linear layers of every
    token (of a cross-encoder's last layer, the first tokens only) with the faster of torch's `nn.Linear` (MKL) and
    the worker's prepacked oneDNN linear on packed blocks of 8,192 tokens, no padding (the median of three passes); the
    attention products counted as if they ran at the linear layers' rate; the norms and softmax every forward runs
    (`gemm_floor.rest_seconds`, torch's kernels). No scores."""

    BLOCK = 8192

    def __init__(self, model: str, dtype: str, options: dict[str, Any]) -> None:
        from scorekeeper_worker.library import FusedLinear
        from scorekeeper_worker.serving.startup.cpu_memory import keep_freed_memory
        from transformers import AutoConfig

        from bench.cpu import gemm_floor

        keep_freed_memory()  # the worker's allocator thresholds: fresh outputs are not page-faulted in every time
        self.floor, self.task = gemm_floor, options["task"]
        self.heads = AutoConfig.from_pretrained(model).num_attention_heads
        layers = gemm_floor.linear_layers(Path(model), torch_dtype(dtype))
        self.kernels = [layers, [FusedLinear(layer) for layer in layers]]
        self.faster: dict[int, list[torch.nn.Module]] = {}  # per workload (token count): the first run decides

    def run(self, workload: dict[str, Any]) -> Timed:
        floor, work = self.floor, self.floor.work_of(self.task, workload)
        if work.tokens not in self.faster:
            self.faster[work.tokens] = min(self.kernels, key=lambda k: floor.linear_seconds([k], work, [self.BLOCK], 1))
        return Timed([], floor.floor_of([self.faster[work.tokens]], self.heads, work, [self.BLOCK], 3).seconds)


SYSTEMS = {"st": SentenceTransformersPeer, "floor": FloorPeer, "hf": TransformersPaddedPeer, "infinity": InfinityPeer,
           "hf-causal": TransformersCausalPeer, "st-cross": CrossEncoderPeer, "hf-cross": TransformersCrossPeer}


def versions(system: str) -> dict[str, str]:
    import importlib.metadata as md

    names = {"st": ["sentence-transformers", "transformers"], "hf": ["transformers"],
             "infinity": ["infinity-emb", "sentence-transformers", "transformers"], "hf-causal": ["transformers"],
             "st-cross": ["sentence-transformers", "transformers"], "hf-cross": ["transformers"], "floor": []}
    found = {"torch": torch.__version__}
    for name in names[system]:
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            found[name] = "missing"
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", choices=sorted(SYSTEMS), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--options", default="{}")
    args = parser.parse_args()
    with open(args.workload) as f:
        workload = json.load(f)
    try:
        peer = SYSTEMS[args.system](args.model, args.dtype, json.loads(args.options))
    except Exception as error:  # reported to the driver, which prints it
        send({"error": f"{type(error).__name__}: {error}"})
        raise
    send({"ready": True, "versions": versions(args.system), "threads": torch.get_num_threads()})
    for line in sys.stdin:
        message = json.loads(line)
        if message.get("cmd") == "quit":
            break
        if "workload" in message:
            workload = message["workload"]
        run_workload = dict(workload, limit=message.get("limit"))
        started = time.perf_counter()
        answer = peer.run(run_workload)
        seconds = time.perf_counter() - started
        if isinstance(answer, Timed):
            answer, seconds = answer.scores, answer.seconds
        send({"seconds": seconds, "scores": answer})
    if hasattr(peer, "close"):
        peer.close()


if __name__ == "__main__":
    main()
