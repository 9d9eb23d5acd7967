"""bench/cpu/gemm_floor.py: the floor it reports covers exactly the model's dense layers over every token, and the norms
and softmax every forward runs besides them."""

from __future__ import annotations

import pytest
import torch
from scorekeeper_worker.model.files import minilm_path

from bench.cpu import gemm_floor


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


def test_rerank_work_is_the_tokenizers_pairs_and_reads_one_row_each() -> None:
    from transformers import AutoTokenizer

    from bench.cpu.bench_minilm import make_workload

    workload = make_workload(minilm_path(), "short", 20, 0)
    tokenizer = AutoTokenizer.from_pretrained(minilm_path())
    pairs = tokenizer([workload["query"]] * 20, workload["items"])["input_ids"]
    work = gemm_floor.work_of("rerank", workload)
    assert work.lengths == [len(ids) for ids in pairs]
    assert work.first_token_only
    embed = gemm_floor.work_of("embed", workload)
    assert embed.tokens == workload["tokens"] and not embed.first_token_only


def test_first_token_only_runs_the_last_layers_tail_on_one_row_per_sequence() -> None:
    layers: list[torch.nn.Module] = [torch.nn.Linear(8, 8) for _ in range(2 * gemm_floor.LAYER_MATRICES)]
    rows: dict[int, list[int]] = {i: [] for i in range(len(layers))}
    for i, layer in enumerate(layers):
        layer.register_forward_hook(lambda _m, args, _out, i=i: rows[i].append(args[0].shape[0]))
    work = gemm_floor.Work([5, 7, 9], first_token_only=True)
    gemm_floor.linear_seconds([layers], work, blocks=[100], reps=1)
    timed = {i: set(r) for i, r in rows.items()}
    last = range(gemm_floor.LAYER_MATRICES, 2 * gemm_floor.LAYER_MATRICES)
    tail = {last[0], *last[3:]}  # the last layer's query, attention output and MLP
    assert all(timed[i] == ({3} if i in tail else {21}) for i in rows)
    assert gemm_floor.linear_flop(layers, work) == 2 * 64 * (8 * 21 + 4 * 3)
    assert gemm_floor.attention_flop(work, hidden=8, layers=2) == 4 * 8 * (25 + 49 + 81) + 4 * 8 * 21


def test_best_peer_reads_bench_cpu_and_bench_minilm_records() -> None:
    cpu_run = [{"task": "rerank", "mix": "short", "system": "scorekeeper", "times": [1.0, 1.2, 1.1]},
               {"task": "rerank", "mix": "short", "system": "vllm", "times": [2.0, 3.0, 2.5]},
               {"task": "rerank", "mix": "short", "system": "st", "times": [1.5]},
               {"task": "rerank", "mix": "short", "system": "infinity", "unavailable": "not installed"},
               {"task": "embed", "mix": "short", "system": "st", "times": [0.1]}]
    assert gemm_floor.best_peer(cpu_run, "rerank", "short", "float32") == ("st", 1.5, 1.1)
    minilm_run = [{"dtype": "float32", "mix": "long", "system": "st", "times": [4.0]},
                  {"dtype": "bfloat16", "mix": "long", "system": "infinity", "times": [3.0]}]
    name, seconds, _ = gemm_floor.best_peer(minilm_run, "embed", "long", "float32") or ("", 0.0, 0.0)
    assert (name, seconds) == ("st", 4.0)
    assert gemm_floor.best_peer(minilm_run, "rerank", "long", "float32") is None


@pytest.mark.parametrize("first_token_only", [False, True])
def test_the_rest_is_every_layers_norms_and_every_sequences_softmax(monkeypatch: pytest.MonkeyPatch,
                                                                    first_token_only: bool) -> None:
    softmaxes: list[tuple[int, ...]] = []
    norms: list[int] = []
    softmax, layer_norm = torch.softmax, torch.nn.functional.layer_norm
    monkeypatch.setattr(torch, "softmax", lambda t, dim: softmaxes.append(tuple(t.shape)) or softmax(t, dim=dim))
    monkeypatch.setattr(torch.nn.functional, "layer_norm",
                        lambda t, *args: norms.append(t.shape[0]) or layer_norm(t, *args))
    work = gemm_floor.Work([3, 5], first_token_only)
    assert gemm_floor.rest_seconds(work, hidden=8, heads=2, layers=2, reps=1) > 0
    last_rows = 1 if first_token_only else None  # a cross-encoder's last layer: the first token's scores and rows
    one_pass_softmaxes = [(2, 3, 3), (2, 5, 5), (2, last_rows or 3, 3), (2, last_rows or 5, 5)]
    one_pass_norms = [8, 8, 8, *([2, 2] if first_token_only else [8, 8])]  # the embeddings', then two per layer
    assert softmaxes == one_pass_softmaxes * 2  # a warm-up and one timed pass
    assert norms == one_pass_norms * 2
