"""Shared fixtures: tiny random models built once per test run, and real uvicorn servers on loopback."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if not torch.cuda.is_available():  # Triton kernels run under Triton's interpreter (set before Triton loads)
    os.environ.setdefault("TRITON_INTERPRET", "1")

import reference
import tiny_models
from serving import RunningServer
from transformers_loads import serialize_loads

serialize_loads()  # before any test loads a model (tests/support/transformers_loads.py)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Path) -> Callable[[str], Path]:
    """name → directory of that tiny model (built on first use)."""
    return lambda name: tiny_models.build(name, tiny_dir)


@pytest.fixture(scope="session")
def smollm2_converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct converted from its GGUF once per test run (~30 s) into SCOREKEEPER_MODEL_CACHE (when
    set, reused between runs) or a temporary directory: loads in a fraction of a second, in servers and references."""
    from scorekeeper_worker.model import files as model_files

    cache = os.environ.get("SCOREKEEPER_MODEL_CACHE")
    return model_files.prepare_smollm2(Path(cache) if cache else tmp_path_factory.mktemp("model-cache"))


@pytest.fixture(scope="session")
def server_for() -> Iterator[Callable[..., RunningServer]]:
    """(model dir, **flags) → a server, started once per distinct configuration and reused by every test."""
    servers: dict[tuple[Any, ...], RunningServer] = {}

    def get(model: Path, **flags: Any) -> RunningServer:
        key = (str(model), *sorted(flags.items()))
        if key not in servers:
            servers[key] = RunningServer(model=model, **flags)
        return servers[key]

    yield get
    for server in servers.values():
        server.stop()


@pytest.fixture(scope="session")
def cross(tiny_model: Callable[[str], Path], server_for: Callable[..., RunningServer]) -> tuple[RunningServer, Any,
                                                                                               Any]:
    """The tiny BERT cross-encoder: its server, and its transformers model and tokenizer for reference scores."""
    path = tiny_model("bert-cross")
    model, tok, _ = reference.load_model(path)
    return server_for(path), model, tok
