"""Memory is bounded by the batch, not by the square of a row's length: sliding-window (Mistral) and soft-capped
(Gemma2) attention, the explicit path other devices take, and the causal-LM vocabulary normaliser work in tiles.

Measured deterministically: a TorchDispatchMode records the largest storage any op produces during the forward. With
a small tile, a long item never allocates more than the tile or a tensor linear in its length, and its scores equal
the untiled ones (the untiled run, with the default tile, is shown to allocate the full L × L matrix)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import scorekeeper_worker.model.kernels.tiled as kernels
import tiny_models
import torch
from engine_runs import one_batch
from packed_units import mixed_units
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner import forward
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import PackUnit, Pool
from scorekeeper_worker.model.loader import ScoringModel, load_model
from scorekeeper_worker.serving.direct import score_now, scored
from scorekeeper_worker.serving.prepare import (
    Limits,
    label_lists,
    largest,
    longest_unit,
    prepare,
    shape_intermediates,
    token_intermediates,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

LENGTH = 2000  # the tiny models allow 2048 positions
SMALL_TILE = 1 << 16  # elements: 256 KB of float32
FLOAT32 = 4


class LargestAllocation(TorchDispatchMode):
    """The largest storage (bytes) produced by any op while active."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.largest = max(self.largest, leaf.untyped_storage().nbytes())
        return out


def _long_item(model: ScoringModel, length: int) -> list[PackUnit]:
    rng = random.Random(length)
    ids = [rng.randrange(10, 120) for _ in range(length)]
    short = [rng.randrange(10, 120) for _ in range(37)]  # a second row, so the block holds padding too
    return [PackUnit(ids, pools=[Pool(range(length - 1, length), 0)]),
            PackUnit(short, pools=[Pool(range(36, 37), 1)])]


def _forward(model: ScoringModel, units: list[PackUnit]) -> tuple[torch.Tensor, int]:
    with torch.inference_mode(), LargestAllocation() as recorder:
        pooled = pooled_rows(model, build_inputs(units, torch.device("cpu")))
    return pooled, recorder.largest


def _linear_bytes(model: ScoringModel, tokens: int) -> int:
    """The largest activation a forward needs in any case: tokens × the widest layer (float32)."""
    config = model.model.config
    width = max(config.hidden_size, config.intermediate_size, config.num_attention_heads * config.head_dim)
    return tokens * width * FLOAT32


@pytest.mark.parametrize(("name", "emulate_gpu"), [("mistral-cls3", False), ("gemma2-cls3", False),
                                                   ("qwen3-causal", True)])
def test_a_long_item_allocates_tiles_not_its_square(name: str, emulate_gpu: bool, tiny_model: Callable[[str], Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """mistral: a sliding window (fused kernel, masked tiles); gemma2: softcapping (explicit tiles); qwen3 with the
    fused kernel switched off: the explicit path of other devices."""
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    if emulate_gpu:
        monkeypatch.setattr(kernels, "fused_kernel", lambda device: False)
    units = _long_item(model, LENGTH)
    untiled, untiled_largest = _forward(model, units)
    assert untiled_largest >= LENGTH * LENGTH * FLOAT32  # the default tile holds this item's whole matrix
    monkeypatch.setattr(kernels, "TILE_ELEMENTS", SMALL_TILE)
    tiled, largest = _forward(model, units)
    tokens = sum(unit.num_tokens for unit in units)
    assert largest <= max(SMALL_TILE * FLOAT32, _linear_bytes(model, tokens + 1)), (largest, untiled_largest)
    torch.testing.assert_close(tiled, untiled, rtol=1e-5, atol=1e-5)


def test_the_vocabulary_normaliser_runs_in_row_chunks(tiny_model: Callable[[str], Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_model(tiny_model("qwen3-causal"), DType.FLOAT32, "cpu", "qwen3-causal")
    rows = torch.randn(1000, model.hidden_size, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([1, 2])
    with torch.inference_mode(), LargestAllocation() as whole:
        expected = forward.causal_lm_scores(model, rows, labels, False, 1.0)
    assert whole.largest >= 1000 * model.logit_size * FLOAT32
    monkeypatch.setattr(forward, "NORMALISER_ELEMENTS", 16 * model.logit_size)
    with torch.inference_mode(), LargestAllocation() as chunked:
        scores = forward.causal_lm_scores(model, rows, labels, False, 1.0)
    # Besides the chunk's logits only the rows themselves: the label rows of the output embedding are [labels, hidden].
    assert chunked.largest <= max(16 * model.logit_size, 1000 * model.hidden_size) * FLOAT32
    torch.testing.assert_close(scores, expected, rtol=1e-6, atol=1e-7)


def _mixed_batch(model: ScoringModel) -> list[PackUnit]:
    """Rows of different lengths (padded blocks) and, for decoders, multi-item groups with a delimiter."""
    groups = ((45, [5, 30, 0, 12]), (80, [40, 3])) if model.is_decoder else ()
    return mixed_units(model, random.Random(7), (3, 50, 61, 140), groups)


@pytest.mark.parametrize("emulate_gpu", [False, True])
@pytest.mark.parametrize("name", ["mistral-cls3", "gemma2-cls3", "qwen3-causal", "bert-cross"])
def test_tiling_never_changes_scores(name: str, emulate_gpu: bool, tiny_model: Callable[[str], Path],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles of a few queries, windows shorter than rows, multi-item views and key padding: the same pooled rows."""
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    if emulate_gpu:
        monkeypatch.setattr(kernels, "fused_kernel", lambda device: False)
    units = _mixed_batch(model)
    expected, _ = _forward(model, units)
    monkeypatch.setattr(kernels, "TILE_ELEMENTS", 1 << 9)
    tiled, _ = _forward(model, units)
    torch.testing.assert_close(tiled, expected, rtol=1e-5, atol=1e-5)


# The request (issue 48, defect 1): 4,096 one-token items × 290 label tokens on a causal LM of hidden 512.
LABEL_ITEMS, LABEL_COUNT, LABEL_HIDDEN = 4096, 290, 512


def test_label_scores_allocate_items_times_labels_not_times_hidden(tiny_dir: Path) -> None:
    """Label scores are one product per distinct label list, `rows @ W[labels].T`: nothing the request runs is
    [items, labels, hidden] (the old gather `W[labels]` per item: 2.4 GB here, for 4.5 MiB of scores)."""
    path = tiny_models.build("qwen3-causal", tiny_dir, variant="hidden512", config_edits={"hidden_size": LABEL_HIDDEN})
    model = load_model(path, DType.FLOAT32, "cpu", "qwen3-causal")
    request = ScoreRequest(query=[5], items=[[10 + i % 200] for i in range(LABEL_ITEMS)],
                           label_token_ids=list(range(LABEL_COUNT)), apply_softmax=True)
    with torch.inference_mode(), LargestAllocation() as recorder:
        [scores] = one_batch(model, [request])
    assert len(scores) == LABEL_ITEMS and len(scores[0]) == LABEL_COUNT
    tokens = 2 * LABEL_ITEMS  # the query and one item token per unit
    linear = (LABEL_ITEMS * LABEL_COUNT * 8  # the probabilities, in float64
              + LABEL_COUNT * LABEL_HIDDEN * FLOAT32  # the label rows of the output embedding
              + _linear_bytes(model, tokens + 1))  # the trunk's activations
    assert recorder.largest <= linear < LABEL_ITEMS * LABEL_COUNT * LABEL_HIDDEN * FLOAT32 // 50, recorder.largest


ESTIMATED = [  # (model, /v1/score body): each term of serving/prepare.py the largest in turn
    ("qwen3-causal", {"query": [5], "items": [[10 + i % 200] for i in range(300)], "label_token_ids": list(range(290)),
                      "apply_softmax": True}),  # label scores
    ("qwen3-causal", {"query": [5], "items": [[7, 8]] * 500, "label_token_ids": [1, 2]}),  # vocabulary logits
    ("qwen3-cls3", {"query": "a question", "items": ["an answer"] * 300, "return_pooled_hidden_states": True}),
    ("bert-embed", {"query": "a question", "items": ["an answer"] * 300}),  # pooled rows
    ("bert-cross", {"query": "a question", "items": [" ".join(["answer"] * 400)] * 3}),  # the trunk
]


@pytest.mark.parametrize(("name", "body"), ESTIMATED, ids=[f"{name}-{i}" for i, (name, _) in enumerate(ESTIMATED)])
def test_no_allocation_exceeds_the_admission_estimate(name: str, body: dict[str, Any],
                                                      tiny_model: Callable[[str], Path]) -> None:
    """What admission counts (`--max-intermediate-bytes`) bounds what the request allocates: its own terms (its shape's,
    its longest unit's), or the activations of the whole batch (--max-batch-tokens; here all the request's tokens)."""
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    ask = ScoreRequest(**body).ask()
    labels = label_lists(model, ask, len(ask.items))
    loop = asyncio.new_event_loop()
    try:
        units = prepare(model, ask, labels, Limits(), loop.create_future(), loop).plan.units
    finally:
        loop.close()
    own = largest([*shape_intermediates(model, ask, labels),
                   *token_intermediates(model, longest_unit(units), "items")])
    with torch.inference_mode(), LargestAllocation() as recorder:
        [job] = scored(score_now(Executor(model), [ask]))
    activations, _ = token_intermediates(model, job.prompt_tokens + 1, "items")  # the batch, and its padding row
    assert recorder.largest <= max(own.nbytes, activations.nbytes), (recorder.largest, own, activations)
