"""bench/gemm_floor.py: the floor it reports covers exactly the model's dense layers over every token."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import gemm_floor
from scorekeeper_worker.model.files import minilm_path


def test_minilm_dense_layers_are_the_36_trunk_matrices() -> None:
    layers = gemm_floor.linear_layers(minilm_path(), torch.float32)
    hidden, inner = 384, 1536
    assert len(layers) == 6 * 6
    assert sum(layer.in_features * layer.out_features for layer in layers) == 6 * (4 * hidden**2 + 2 * hidden * inner)


def test_floor_runs_every_layer_over_every_token_once() -> None:
    layers = [torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)]
    rows: list[list[int]] = [[], []]
    for i, layer in enumerate(layers):
        layer.register_forward_hook(lambda _m, args, _out, i=i: rows[i].append(args[0].shape[0]))
    assert gemm_floor.floor_seconds(layers, tokens=1000, block=300, reps=2) > 0
    # one warm-up and two timed passes, each in blocks of 300, 300, 300 and 100 tokens
    assert rows == [[300, 300, 300, 100] * 3] * 2
