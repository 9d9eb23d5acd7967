"""The first mistakes a person makes end the real `scorekeeper-worker serve` with one line and an exit status of their
own, before it listens or loads any weights: a taken port, a path that holds no model, an architecture outside the
support matrix, --device cuda where torch has no CUDA device. Tracebacks are kept for the unexpected."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from scorekeeper_worker.api.termination import EXIT_DEVICE_UNAVAILABLE, EXIT_LOAD_FAILED, EXIT_PORT_UNAVAILABLE
from serving import free_port


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another process holds: a socket listening on it (as Prometheus would listen on 9090)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _serve(tmp_path: Path, *args: str, environ: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real command line at its default log level, run to its end (a worker that serves would time out)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCOREKEEPER_")} | (environ or {})
    return subprocess.run(
        [sys.executable, "-m", "scorekeeper_worker.cli", "serve", "--host", "127.0.0.1",
         "--termination-log", str(tmp_path / "termination-log"), *args],
        capture_output=True, text=True, timeout=300, env=env)


def _refused(process: subprocess.CompletedProcess[str], status: int, tmp_path: Path) -> str:
    """The one line the worker said (asserting it said nothing else, exited with `status` and wrote the same
    reason to the termination-message file)."""
    assert process.returncode == status, process.stderr[-3000:]
    assert "Traceback" not in process.stderr, process.stderr[-3000:]
    lines = process.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("scorekeeper-worker: error: "), process.stderr[-3000:]
    said = lines[0].removeprefix("scorekeeper-worker: error: ")
    assert (tmp_path / "termination-log").read_text() == said + "\n"
    assert process.stdout == ""  # no access line either: nothing listened
    return said


@pytest.mark.parametrize("flag", ["--metrics-port", "--port"])
def test_a_taken_port_is_one_line_naming_it(flag: str, taken_port: int, tiny_model: Callable[[str], Path],
                                             tmp_path: Path) -> None:
    ports = {"--port": str(free_port()), "--metrics-port": str(free_port())} | {flag: str(taken_port)}
    process = _serve(tmp_path, "--model", str(tiny_model("qwen3-cls3")), *(x for kv in ports.items() for x in kv))
    said = _refused(process, EXIT_PORT_UNAVAILABLE, tmp_path)
    assert said == f"{flag} {taken_port}: cannot listen on 127.0.0.1:{taken_port}: already in use by another process"


def _config_only(tmp_path: Path, name: str) -> Path:
    """A checkpoint directory of an architecture the worker does not serve: its config.json says enough."""
    from transformers import GPT2Config, T5Config

    config = (GPT2Config(n_layer=1, n_embd=32, n_head=2, architectures=["GPT2LMHeadModel"]) if name == "gpt2" else
              T5Config(num_layers=1, d_model=32, d_ff=64, num_heads=2, architectures=["T5ForConditionalGeneration"]))
    config.save_pretrained(tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize(("name", "architecture"), [("gpt2", "GPT2LMHeadModel"), ("t5", "T5ForConditionalGeneration")])
def test_an_unsupported_architecture_is_one_line(name: str, architecture: str, tmp_path: Path) -> None:
    model = _config_only(tmp_path, name)
    said = _refused(_serve(tmp_path, "--model", str(model), "--port", str(free_port())), EXIT_LOAD_FAILED, tmp_path)
    assert said.startswith(f"model {model} failed to load: UnsupportedModel: unsupported architecture "
                           f"'{architecture}'"), said
    assert "docs/support-matrix.md" in said


def test_a_path_that_holds_no_model_is_one_line(tmp_path: Path) -> None:
    model = tmp_path / "models" / "qwen3-reranker"
    (tmp_path / "models" / "qwen3-reranker-0.6b").mkdir(parents=True)
    said = _refused(_serve(tmp_path, "--model", str(model), "--port", str(free_port())), EXIT_LOAD_FAILED, tmp_path)
    assert said == (f"model {model} failed to load: ModelNotFound: {model} does not exist; {tmp_path / 'models'} "
                    "holds: qwen3-reranker-0.6b")


def test_device_cuda_without_cuda_is_refused_before_any_weights_load(tiny_model: Callable[[str], Path],
                                                                   tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES="" hides every GPU, so this holds on a GPU machine too. Nothing of the load ran: the
    start of a load logs its CPU threads, and the weights would log `loaded ...`."""
    process = _serve(tmp_path, "--model", str(tiny_model("qwen3-cls3")), "--device", "cuda", "--port",
                     str(free_port()), environ={"CUDA_VISIBLE_DEVICES": ""})
    said = _refused(process, EXIT_DEVICE_UNAVAILABLE, tmp_path)
    assert said.startswith("--device cuda: ") and said.endswith("; or serve on --device cpu"), said
