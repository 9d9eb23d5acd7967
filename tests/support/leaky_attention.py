"""The worker's packed attention replaced for tests.

A deliberately broken engine: `install()` replaces it with plain attention over the whole packed row, so every token
also sees the other sequences of its batch (all of them in encoders, the earlier ones in decoders). Only a worker's
self-check stands between this and wrong scores:

    python -c "import leaky_attention; leaky_attention.install(); from scorekeeper_worker.cli import main; main()" \
        serve --model ...

An overflowing request: `poisoned_keys(tokens, key, value)` gives the first `tokens` packed tokens keys and values of
`key` and `value` (inf, NaN) in every attention call, as a request whose activations overflow float16 has them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from scorekeeper_worker.model.kernels.attention import ATTENTION_NAME, packed_attention
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


@contextlib.contextmanager
def poisoned_keys(tokens: int, key: float, value: float) -> Iterator[None]:
    """While active, every packed attention call sees keys `key` and values `value` on packed tokens [0, tokens)."""
    def poisoning(module: torch.nn.Module, query: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  *args: object, **kwargs: object) -> tuple[torch.Tensor, None]:
        k, v = k.clone(), v.clone()
        k[:, :, :tokens], v[:, :, :tokens] = key, value
        return packed_attention(module, query, k, v, *args, **kwargs)  # type: ignore[arg-type]

    AttentionInterface.register(ATTENTION_NAME, poisoning)
    try:
        yield
    finally:
        AttentionInterface.register(ATTENTION_NAME, packed_attention)
