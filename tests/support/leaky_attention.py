"""A deliberately broken engine for tests: `install()` replaces the worker's packed attention with plain attention
over the whole packed row, so every token also sees the other sequences of its batch (all of them in encoders, the
earlier ones in decoders). Only a worker's self-check stands between this and wrong scores:

    python -c "import leaky_attention; leaky_attention.install(); from scorekeeper_worker.cli import main; main()" \
        serve --model ...
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from scorekeeper_worker.model.kernels.attention import ATTENTION_NAME
from transformers import AttentionInterface


def leaky_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float | None = None,
                    **_: object) -> tuple[torch.Tensor, None]:
    """q [1, H, T, D], k/v [1, Hkv, T, D] → [1, T, H, D], ignoring where sequences start and end."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    causal = bool(getattr(module, "is_causal", True))
    return F.scaled_dot_product_attention(query, key, value, is_causal=causal, scale=scaling).transpose(1, 2), None


def install() -> None:
    AttentionInterface.register(ATTENTION_NAME, leaky_attention)

