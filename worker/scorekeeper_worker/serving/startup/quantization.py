"""`--quantization int8` at start-up: calibrate, quantize, and certify the int8 model against float32, or refuse.

Calibration blocks are recorded by running the calibration requests through the engine (serving/startup/probe_texts.py),
so they are planned, packed and split into blocks exactly like served requests. The certificate scores the fixed
probe set (8 queries × 48 passages) through the float32 engine and through the int8 engine, both as the server
plans requests, and compares them: the largest |Δscore|, Spearman's rank correlation of each query's 48 scores
(the mean over the queries) and top-10 agreement (the share of each query's float32 top 10 that int8 also ranks in
its top 10, averaged). It also times both passes (after one warm-up request each): int8 is refused unless it scores
the probe set at least `--quantization-min-speedup` times as fast as float32 (default 1: faster at all). OpenVINO's
int8 matrix products need int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or AMX) to beat float32; on a CPU
without them int8 measured 0.74-0.92x float32 (docs/benchmarks.md), and its u8·s8 products are summed in saturating
16-bit pairs, so scores drift beyond int8 rounding: int8 is refused there before calibrating (instruction-set caps,
`ONEDNN_MAX_CPU_ISA=AVX2`, count as the CPU they cap to). Below `--quantization-min-spearman` (or the
optional bounds) the worker refuses to become ready, like any other load failure (exit status 3, termination
message)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scorekeeper_worker.base.config import WorkerConfig
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.engine.runner.int8_trunk import Int8Unavailable, RecordingTrunk, quantize
from scorekeeper_worker.model.dtypes import host_cpu_flags
from scorekeeper_worker.model.loader import ModelKind, ScoringModel
from scorekeeper_worker.planning.encoding import LengthRules
from scorekeeper_worker.planning.planner import ScoreAsk
from scorekeeper_worker.serving.direct import score_now, scored
from scorekeeper_worker.serving.startup.probe_texts import calibration_requests, certificate_requests

log = logging.getLogger(__name__)
TOP = 10
INT8_DOT_PRODUCT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
QUANTIZABLE = (ModelKind.CROSS_ENCODER, ModelKind.EMBEDDING)  # encoders (classifier kinds are decoders)


@dataclass(frozen=True)
class Certificate:
    max_score_delta: float
    spearman: float
    top10: float
    pairs: int
    speedup: float  # float32 seconds / int8 seconds for the probe set
    seconds: float  # calibration, quantization and the scoring passes


class CertificateFailed(RuntimeError):
    """int8 scores are too far from float32 scores on the probe set: the worker refuses to serve them."""


def text_scores(model: ScoringModel, executor: Executor, requests: list[tuple[str, list[str]]],
                max_batch_tokens: int) -> list[list[float]]:
    """Each request planned as the server plans a text request (long texts cut to fit), run in batches of the
    server's budget; the score of each item: its first value (a cosine, a single logit) or, with several labels,
    its last (the positive class of a two-class cross-encoder)."""
    asks = [ScoreAsk(query=query, items=items, rules=LengthRules(truncate=True)) for query, items in requests]
    jobs = scored(score_now(executor, asks, max_batch_tokens=max_batch_tokens))
    return [[float(row[-1]) for row in job.scores if row is not None] for job in jobs]


def _ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (Pearson's on the ranks); 1.0 when either side is constant and both agree."""
    ra, rb = _ranks(np.asarray(a)), _ranks(np.asarray(b))
    if ra.std() == 0 or rb.std() == 0:
        return 1.0 if np.array_equal(np.asarray(a), np.asarray(b)) else 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def top_agreement(reference: list[float], other: list[float], top: int = TOP) -> float:
    best = set(np.argsort(-np.asarray(reference), kind="stable")[:top].tolist())
    return len(best & set(np.argsort(-np.asarray(other), kind="stable")[:top].tolist())) / min(top, len(reference))


def compare(reference: list[list[float]], other: list[list[float]], speedup: float = 1.0,
            seconds: float = 0.0) -> Certificate:
    """Per-query rankings of float32 (`reference`) and int8 scores → the certificate."""
    deltas = [abs(a - b) for ref, oth in zip(reference, other, strict=True) for a, b in zip(ref, oth, strict=True)]
    return Certificate(
        max_score_delta=max(deltas),
        spearman=float(np.mean([spearman(ref, oth) for ref, oth in zip(reference, other, strict=True)])),
        top10=float(np.mean([top_agreement(ref, oth) for ref, oth in zip(reference, other, strict=True)])),
        pairs=len(deltas), speedup=speedup, seconds=seconds)


def check(certificate: Certificate, config: WorkerConfig) -> None:
    """The configured thresholds; one message naming every one that failed."""
    failed = []
    if not certificate.spearman >= config.quantization_min_spearman:
        failed.append(f"Spearman {certificate.spearman:.4f} < {config.quantization_min_spearman} "
                      "(--quantization-min-spearman)")
    bound = config.quantization_max_score_delta
    if bound is not None and not certificate.max_score_delta <= bound:
        failed.append(f"max |Δscore| {certificate.max_score_delta:.3g} > {bound} (--quantization-max-score-delta)")
    if config.quantization_min_top10 is not None and not certificate.top10 >= config.quantization_min_top10:
        failed.append(f"top-10 agreement {certificate.top10:.3f} < {config.quantization_min_top10} "
                      "(--quantization-min-top10)")
    if not certificate.speedup >= config.quantization_min_speedup:
        flags = ", ".join(int8_dot_product_flags()) or "none (no AVX-512 VNNI, AVX-VNNI or AMX)"
        failed.append(f"int8 scored the probe set at {certificate.speedup:.2f}× the speed of float32 < "
                      f"{config.quantization_min_speedup} (--quantization-min-speedup); this CPU's int8 dot-product "
                      f"instructions: {flags}{_cap_note()}")
    if failed:
        raise CertificateFailed(
            f"int8 certificate failed against float32 on the fixed probe set ({certificate.pairs} "
            f"query-passage pairs): {'; '.join(failed)}. The int8 model would rank differently from the float32 "
            "model or run slower, so the worker refuses to serve it; run without --quantization (float32), or lower "
            "the threshold if this is acceptable.")


def int8_executor(model: ScoringModel, reference: Executor, config: WorkerConfig,
                  threads: int) -> tuple[Executor, Certificate]:
    """Calibrate and quantize the trunk, then certify it against the float32 engine `reference`."""
    if model.kind not in QUANTIZABLE:
        raise ValueError(f"--quantization int8 serves encoder cross-encoders and embedding models; this model is a "
                         f"{model.kind.value} (a decoder), which runs in its --dtype")
    if not int8_dot_product_flags():
        raise Int8Unavailable(f"--quantization int8 needs int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI or "
                              f"AMX), which this CPU{_cap_note()} lacks: without them int8 products are summed in "
                              "saturating 16-bit pairs (scores drift beyond int8 rounding) and int8 ran slower than "
                              "float32 (0.74-0.92x, docs/operations.md). Run without --quantization (float32).")
    started = time.perf_counter()
    recording = RecordingTrunk(model.hidden_size)
    text_scores(model, Executor(model, trunk=recording), calibration_requests(), config.max_batch_tokens)
    executor = Executor(model, trunk=quantize(model, recording.blocks, threads, config.quantization_float32_modules))
    requests = certificate_requests()
    float32, float32_seconds = _timed_scores(model, reference, requests, config.max_batch_tokens)
    int8, int8_seconds = _timed_scores(model, executor, requests, config.max_batch_tokens)
    certificate = compare(float32, int8, float32_seconds / int8_seconds, time.perf_counter() - started)
    log.info("int8 certificate: max |Δscore| %.3g, Spearman %.4f, top-10 agreement %.3f on %d pairs, "
             "%.2f× the speed of float32 (%.1f s)", certificate.max_score_delta, certificate.spearman,
             certificate.top10, certificate.pairs, certificate.speedup, certificate.seconds)
    return executor, certificate


def _timed_scores(model: ScoringModel, executor: Executor, requests: list[tuple[str, list[str]]],
                  max_batch_tokens: int) -> tuple[list[list[float]], float]:
    """`text_scores` and its seconds, after one request as a warm-up (first calls build kernels for new shapes)."""
    text_scores(model, executor, requests[:1], max_batch_tokens)
    started = time.perf_counter()
    scores = text_scores(model, executor, requests, max_batch_tokens)
    return scores, time.perf_counter() - started


def int8_dot_product_flags(cpuinfo: Path = Path("/proc/cpuinfo"), environ: Mapping[str, str] | None = None
                           ) -> list[str]:
    """The CPU's int8 dot-product instruction sets among those OpenVINO's fast int8 kernels use, as capped by the
    instruction-set variables of `environ` (the process's environment by default)."""
    flags = host_cpu_flags(cpuinfo, environ)
    return [flag for flag in INT8_DOT_PRODUCT_FLAGS if flag in flags]


def _cap_note() -> str:
    caps = [f"{name}={os.environ[name]}" for name in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")
            if name in os.environ]
    return f" (capped by {', '.join(caps)})" if caps else ""
