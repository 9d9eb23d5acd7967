"""A worker that cannot serve its model exactly never becomes ready: the real CLI, in a subprocess, exits with
status 3 before /ready ever says ready, after writing one paragraph saying why to the termination-message file. The
reason is one log line; only a bug (an error no refusal names, api/preflight.py) comes with its traceback."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from scorekeeper_worker.api.termination import EXIT_LOAD_FAILED
from serving import free_port

TESTS = Path(__file__).resolve().parents[3] / "support"  # leaky_attention.py
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (WARNING|ERROR) ")  # base/logs.py FORMAT


def _serve(model: Path, tmp_path: Path, preload: str | None = None,
           prelude: str = "") -> tuple[subprocess.CompletedProcess[str], str]:
    """Run `scorekeeper-worker serve` to its end; `preload` is a module whose install() runs first (a deliberately
    broken engine), `prelude` code run before the worker.
    Returns the finished process and the termination message it wrote."""
    termination = tmp_path / "termination-log"
    code = prelude + (f"import {preload}; {preload}.install(); " if preload else "")
    code += "import sys; from scorekeeper_worker.cli import main; main(sys.argv[1:])"
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    process = subprocess.run(
        [sys.executable, "-c", code, "serve", "--model", str(model), "--host", "127.0.0.1", "--port",
         str(free_port()), "--termination-log", str(termination), "--log-level", "warning"],
        capture_output=True, text=True, timeout=300, env=env)
    return process, termination.read_text() if termination.exists() else ""


def _without_head(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    weights = load_file(target / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.startswith("score.")}, target / "model.safetensors",
              metadata={"format": "pt"})
    return target


def _with_architecture(source: Path, target: Path, architecture: str) -> Path:
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps(config | {"architectures": [architecture]}))
    return target


@pytest.mark.parametrize("case", ["unsupported-architecture", "missing-head-weights", "leaky-attention"])
def test_worker_exits_non_zero_with_the_reason(case: str, tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    preload = None
    if case == "unsupported-architecture":
        model = _with_architecture(tiny_model("bert-cross"), tmp_path / "model", "DistilBertForSequenceClassification")
        expected = ["'DistilBertForSequenceClassification'", "supported:", "ModernBertForSequenceClassification"]
    elif case == "missing-head-weights":
        model = _without_head(tiny_model("qwen2-reward"), tmp_path / "model")
        expected = ["missing from the checkpoint", "'score.weight'"]
    else:  # the engine is broken, the model is fine: only the self-check can tell
        model, preload = tiny_model("qwen3-cls3"), "leaky_attention"
        expected = ["self-check failed", "deviate from plain transformers by", "tolerance 0.0005 for float32"]
    process, message = _serve(model, tmp_path, preload)
    assert process.returncode == EXIT_LOAD_FAILED, process.stderr[-3000:]
    assert message.count("\n") == 1 and message.startswith(f"model {model} failed to load:"), message
    for text in expected:
        assert text in message, message
        assert text in process.stderr  # the log says it too (FallbackToLogsOnError shows the log tail)
    assert "ready:" not in process.stderr
    # The reason is the last line: the command line's when the files alone refuse the model, else the log's. Before
    # it only warnings (an environment may add one, e.g. a low file-descriptor limit), and no traceback.
    *before, reason = process.stderr.splitlines()
    assert reason.startswith("scorekeeper-worker: error: ") or (LOG_LINE.match(reason) and " ERROR " in reason)
    assert all(LOG_LINE.match(line) and " WARNING " in line for line in before), process.stderr[-3000:]
    assert "Traceback" not in process.stderr


def test_a_bug_during_the_load_keeps_its_traceback(tiny_model: Callable[[str], Path], tmp_path: Path) -> None:
    """An error no refusal names is a bug: the traceback is what to report. The worker still exits with status 3
    and the reason, since the model was not served."""
    bug = ("import scorekeeper_worker.serving.startup.selfcheck as selfcheck; "
           "selfcheck.run = lambda *args, **kwargs: {}['no such key']; ")
    process, message = _serve(tiny_model("qwen3-cls3"), tmp_path, prelude=bug)
    assert process.returncode == EXIT_LOAD_FAILED, process.stderr[-3000:]
    assert message.endswith("failed to load: KeyError: 'no such key'\n"), message
    assert "Traceback (most recent call last)" in process.stderr and "selfcheck.run" not in message


@pytest.mark.parametrize("case", ["missing", "no-config"])
def test_a_model_path_that_holds_no_model_is_named_with_what_is_there(case: str, tmp_path: Path) -> None:
    """A pvc:// path with a typo: the worker names the path and the volume's contents, where transformers would take
    the path for a Hub repository id ("Repo id must be in the form ...")."""
    volume = tmp_path / "models"
    (volume / "bge-m3" / "onnx").mkdir(parents=True)
    (volume / "qwen3-reranker-0.6b").mkdir()
    if case == "missing":
        model, said = volume / "qwen3-reranker", f"does not exist; {volume} holds: bge-m3, qwen3-reranker-0.6b"
    else:
        model, said = volume / "bge-m3", f"has no config.json; {volume / 'bge-m3'} holds: onnx"
    process, message = _serve(model, tmp_path)
    assert process.returncode == EXIT_LOAD_FAILED, process.stderr[-3000:]
    assert f"ModelNotFound: {model} {said}" in message and "Repo id" not in message, message
