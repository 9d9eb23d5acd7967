"""`--quantization int8`: an OpenVINO int8 trunk behind the engine's padded-trunk interface, certified against float32
at start-up. Served int8 scores rank like float32 ones (real MiniLM embeddings, a tiny BERT cross-encoder); the
certificate (accuracy, and speed against float32) is exported as gauges; a worker whose certificate misses a
threshold, or whose model cannot be int8, exits with status 3 and says why; unusable combinations are refused on
the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from scorekeeper_worker.api.termination import EXIT_LOAD_FAILED
from scorekeeper_worker.model.files import minilm_path
from scorekeeper_worker.serving.startup.probe_texts import TOPICS
from scorekeeper_worker.serving.startup.quantization import compare, int8_dot_product_flags, spearman, top_agreement
from serving import RunningServer, free_port

pytest.importorskip("openvino", reason="the cpu-int8 extra (scripts/install.sh test installs it)")
pytestmark = pytest.mark.slow

QUERY = "Which city is the capital of France?"
# Passages other than the certificate's, so the served ranking is not the one the certificate checked.
PASSAGES = ["Paris has been the French capital for most of the last thousand years.",
            "Madrid is the capital of Spain.", "The Louvre in Paris is the most visited museum in the world.",
            "Cats sleep for most of the day.", "The capital city of Italy is Rome.",
            "France borders Belgium, Germany, Switzerland, Italy and Spain.", "Bread is baked from flour and water.",
            "Marseille is a port on the Mediterranean coast of France.", "The Seine flows through Paris.",
            "A heat pump can also cool a house.", "London is the capital of the United Kingdom.",
            "The French president lives in the Elysee Palace in Paris."]


def _metric(server: RunningServer, name: str) -> float:
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


def _scores(server: RunningServer) -> np.ndarray:
    response = server.score(query=QUERY, items=PASSAGES)
    assert response.status_code == 200, response.text
    return np.array([row[0] for row in response.json()["scores"]])


@pytest.mark.parametrize("model", ["minilm-embedding", "bert-cross"])
def test_int8_scores_rank_like_float32_and_the_certificate_is_exported(
        model: str, tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer],
        tmp_path: Path) -> None:
    """On a CPU with int8 dot-product instructions; without them (or capped below them) the worker refuses int8
    before calibrating: its u8·s8 products would saturate in 16-bit pairs, beyond this test's bound."""
    path = minilm_path() if model == "minilm-embedding" else tiny_model("bert-cross")
    if not int8_dot_product_flags():  # this CPU (or the instruction-set cap the tests run under) has no VNNI
        process, message = _serve(["--model", str(path), "--quantization", "int8",
                                   "--quantization-min-speedup", "0"], tmp_path)
        assert process.returncode == EXIT_LOAD_FAILED, process.stderr[-3000:]
        assert "--quantization int8 needs int8 dot-product instructions" in message, message
        return
    # The tiny cross-encoder has random weights: its scores barely differ between passages, so its ranking is all
    # near-ties; the real model is held to the default threshold.
    threshold = 0.99 if model == "minilm-embedding" else 0.9
    float32 = _scores(server_for(path))
    # Speed is the CPU's property (no int8 dot-product instructions: int8 is slower), refused in the test below.
    int8_server = server_for(path, quantization="int8", quantization_min_spearman=threshold,
                             quantization_min_speedup=0)
    int8 = _scores(int8_server)
    assert not np.array_equal(int8, float32)  # it is another model
    assert np.abs(int8 - float32).max() < 0.05 * (np.abs(float32).max() + 1)
    assert spearman(float32.tolist(), int8.tolist()) >= threshold
    assert top_agreement(float32.tolist(), int8.tolist(), 3) >= 2 / 3
    assert _metric(int8_server, "scorekeeper_int8_spearman") >= threshold
    assert 0 < _metric(int8_server, "scorekeeper_int8_max_score_delta") < 0.5
    assert 0.8 <= _metric(int8_server, "scorekeeper_int8_top10_agreement") <= 1
    assert _metric(int8_server, "scorekeeper_int8_speedup") > 0
    ranked = httpx.post(int8_server.url + "/v1/rerank", json={"query": QUERY, "documents": PASSAGES}, timeout=60)
    assert ranked.status_code == 200, ranked.text


def test_the_probe_set_is_a_ranking_problem() -> None:
    """Eight queries over the same 48 passages; each query's own six passages are the relevant ones."""
    assert len(TOPICS) == 8 and all(len(passages) == 6 for _, passages in TOPICS)
    assert len({passage for _, passages in TOPICS for passage in passages}) == 48


def test_the_certificate_statistics() -> None:
    reference = [[3.0, 2.0, 1.0, 0.0], [0.0, 1.0, 2.0, 3.0]]
    same = compare(reference, reference)
    assert (same.max_score_delta, same.spearman, same.top10, same.pairs) == (0.0, 1.0, 1.0, 8)
    swapped = compare(reference, [[3.0, 2.0, 0.5, 1.0], [0.0, 1.0, 2.0, 3.5]])
    assert swapped.max_score_delta == 1.0
    assert swapped.spearman == pytest.approx((0.8 + 1.0) / 2)
    assert top_agreement([4, 3, 2, 1], [1, 2, 3, 4], 2) == 0.0


def _serve(argv: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], str]:
    termination = tmp_path / "termination-log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    process = subprocess.run(
        [sys.executable, "-c", "import sys; from scorekeeper_worker.cli import main; main(sys.argv[1:])", "serve",
         *argv, "--host", "127.0.0.1", "--port", str(free_port()), "--termination-log", str(termination),
         "--log-level", "warning"], capture_output=True, text=True, timeout=600, env=env)
    return process, termination.read_text() if termination.exists() else ""


def test_the_cpu_flags_for_fast_int8(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma avx512f avx512_vnni amx_int8\n\n"
                       "processor\t: 1\nflags\t\t: fpu avx2 fma avx512f avx512_vnni amx_int8\n")
    assert int8_dot_product_flags(cpuinfo, {}) == ["avx512_vnni", "amx_int8"]
    # capped to AVX2 (how the suite emulates a CPU without VNNI), the same machine has none
    assert int8_dot_product_flags(cpuinfo, {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}) == []
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n")
    assert int8_dot_product_flags(cpuinfo, {}) == []
    assert int8_dot_product_flags(tmp_path / "absent", {}) == []


@pytest.mark.parametrize("case", ["certificate", "speed", "decoder"])
def test_a_worker_that_cannot_serve_int8_exits_3_with_the_reason(case: str, tiny_model: Callable[[str], Path],
                                                                 tmp_path: Path) -> None:
    if case == "certificate":  # no int8 model is within 1e-9 of float32
        model = tiny_model("bert-cross")
        argv = ["--quantization-max-score-delta", "1e-9", "--quantization-min-top10", "0.2"]
        expected = ["int8 certificate failed", "(--quantization-max-score-delta)", "384 query-passage pairs"]
    elif case == "speed":  # no int8 model is 1000 times as fast as float32
        model = tiny_model("bert-cross")
        argv = ["--quantization-min-spearman", "-1", "--quantization-min-speedup", "1000"]
        expected = ["int8 scored the probe set at", "(--quantization-min-speedup)", "int8 dot-product instructions"]
    else:
        model = tiny_model("qwen3-causal")
        argv = []
        expected = ["--quantization int8 serves encoder cross-encoders and embedding models"]
    if case != "decoder" and not int8_dot_product_flags():  # refused before any certificate is measured
        expected = ["--quantization int8 needs int8 dot-product instructions"]
    process, message = _serve(["--model", str(model), "--quantization", "int8", *argv], tmp_path)
    assert process.returncode == EXIT_LOAD_FAILED, process.stderr[-3000:]
    for text in expected:
        assert text in message, message
    assert "--quantization-min-top10" not in message  # only the thresholds that failed are named


@pytest.mark.parametrize("flags", [["--dtype", "bfloat16"], ["--device", "cuda"]])
def test_int8_needs_float32_weights_on_cpu(flags: list[str], tmp_path: Path) -> None:
    process, _ = _serve(["--model", str(tmp_path), "--quantization", "int8", *flags], tmp_path)
    assert process.returncode == 2
    assert "--quantization int8 runs on --device cpu" in process.stderr
