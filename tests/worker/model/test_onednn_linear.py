"""model/trunk_patches.py: every linear layer of the trunk through oneDNN on a prepacked weight (the bias
and a BERT-style GELU fused), served values within float32 rounding of torch's own modules, and `plain_linears()`
giving back exactly the original computation (the self-check's transformers reference)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from engine_runs import one_batch
from scorekeeper_worker.api.wire.score import ScoreRequest
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.loader import load_model
from scorekeeper_worker.model.trunk_patches import FusedLinear, fuse_linears, plain_linears

REQUESTS = [ScoreRequest(query="what is the capital of the state", items=["the capital is a city", "rivers",
                                                                          "mountains and cities and more words"])]


@pytest.mark.parametrize("name, gelus", [("bert-cross", 2), ("xlmr-embed", 2), ("qwen3-cls3", 0),
                                         ("modernbert-cross", 0)])
def test_fused_trunk_scores_as_torch(tiny_model: Callable[[str], Path], name: str, gelus: int) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.trunk.modules())
    want = one_batch(model, REQUESTS)
    assert fuse_linears(model.trunk) == linears
    fused = [m for m in model.trunk.modules() if isinstance(m, FusedLinear)]
    assert len(fused) == linears and sum(m.gelu for m in fused) == gelus  # the tiny encoders have 2 layers
    np.testing.assert_allclose(one_batch(model, REQUESTS), want, rtol=1e-5, atol=1e-6)


def test_plain_linears_compute_as_the_original_modules(tiny_model: Callable[[str], Path]) -> None:
    """Each fused layer holds its weight prepacked for oneDNN, in place of the plain one: it unpacks to exactly the
    original weight, and under `plain_linears()` the model computes what the original modules compute."""
    model = load_model(tiny_model("bert-cross"), DType.FLOAT32, "cpu", "bert-cross")
    model.model.set_attn_implementation("eager")  # transformers' own attention, as the self-check's reference
    original = copy.deepcopy(model.model)
    weights = {name: m.weight.detach().clone() for name, m in model.trunk.named_modules()
               if isinstance(m, torch.nn.Linear)}
    fuse_linears(model.trunk)
    fused = {name: m for name, m in model.trunk.named_modules() if isinstance(m, FusedLinear)}
    assert fused.keys() == weights.keys()
    for name, module in fused.items():
        assert module.packed.layout == torch._mkldnn  # no plain copy kept beside it
        assert torch.equal(module.weight, weights[name]), name
    ids = torch.tensor([[2, 40, 41, 42, 3, 50, 51, 3]])
    with torch.inference_mode():
        want = original(input_ids=ids).logits
        with plain_linears():
            plain = model.model(input_ids=ids).logits
        out = model.model(input_ids=ids).logits
    torch.testing.assert_close(plain, want, rtol=0, atol=0)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
