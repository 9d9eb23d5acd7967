"""Linear layers through oneDNN on CPU, with the bias (and a GELU that follows) in the matrix product's epilogue.

torch's `nn.Linear` on CPU copies the bias into the output and runs MKL's sgemm on top (`addmm`), and a GELU after it
is another pass over the result: two extra passes over every activation. oneDNN's fused linear, the op Inductor
emits on CPU, adds the bias and applies the GELU while a tile is still in registers (docs/benchmarks.md measures
it). Float32 results differ from MKL's only by summation order (about 1e-6 relative).

`plain_linears()` runs the original modules for the duration: the self-check's transformers reference forwards."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from transformers.activations import GELUActivation

_PLAIN: ContextVar[bool] = ContextVar("scorekeeper_plain_linears", default=False)
_fused = torch.ops.mkldnn._linear_pointwise


class FusedLinear(nn.Module):
    """`linear`, then GELU (erf) when `gelu`, as one oneDNN call."""

    def __init__(self, linear: nn.Linear, gelu: bool = False) -> None:
        super().__init__()
        self.linear, self.gelu = linear, gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _PLAIN.get():
            out = self.linear(x)
            return nn.functional.gelu(out) if self.gelu else out
        return _fused(x, self.linear.weight, self.linear.bias, "gelu" if self.gelu else "none", [],  # type: ignore[no-any-return]
                      "none" if self.gelu else "")


def _exact_gelu(module: nn.Module) -> bool:
    return isinstance(module, GELUActivation) and module.act is nn.functional.gelu


def fuse_linears(trunk: nn.Module) -> int:
    """Replace every `nn.Linear` of `trunk` (CPU, float32) by a FusedLinear; a `dense` linear followed by an exact
    GELU as `intermediate_act_fn` (BERT-style feed-forward) takes the GELU into its epilogue. Returns the count."""
    count = 0
    for module in list(trunk.modules()):
        dense, act = getattr(module, "dense", None), getattr(module, "intermediate_act_fn", None)
        if isinstance(dense, nn.Linear) and act is not None and _exact_gelu(act):
            module.dense, module.intermediate_act_fn = FusedLinear(dense, gelu=True), nn.Identity()
            count += 1
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, FusedLinear(child))
                count += 1
    return count


@contextmanager
def plain_linears() -> Iterator[None]:
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)
