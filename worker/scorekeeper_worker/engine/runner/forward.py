"""The model forward on a packed batch, pooled: shared by the eager executor and the CUDA-graph runner, which
captures exactly this function."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from scorekeeper_worker.engine.runner.packing import ForwardInputs
from scorekeeper_worker.model.kernels.attention import LayoutKind
from scorekeeper_worker.model.loader import ScoringModel
from scorekeeper_worker.model.pooled_rows import only_rows
from scorekeeper_worker.model.rope import per_token_tables


class PaddedTrunk(Protocol):
    """The backend boundary: a trunk run on one right-padded block of rows, called with `input_ids`,
    `attention_mask`, `position_ids` (and `token_type_ids`), returning an object with `.last_hidden_state`. A model's
    own torch module is one; the int8 runtime (engine/runner/int8_trunk.py) is another."""

    def __call__(self, **inputs: torch.Tensor) -> Any: ...


def padded_hidden(trunk: PaddedTrunk, inputs: ForwardInputs) -> torch.Tensor:
    """Models whose attention does not go through transformers' AttentionInterface (support matrix: padded): each
    block of similar-length sequences runs as an ordinary right-padded batch with an attention mask, so the model's
    own attention keeps sequences apart. Returns the packed hidden states [T, H], as the packed path does."""
    ids, types = inputs.input_ids[0], inputs.token_type_ids
    hidden: torch.Tensor | None = None
    for block in inputs.layout.context_blocks:
        mask = torch.arange(block.token_index.shape[1], device=ids.device)[None, :] < block.lengths[:, None]
        extra = {} if types is None else {"token_type_ids": types[0][block.token_index]}
        out = trunk(input_ids=ids[block.token_index], attention_mask=mask.long(), position_ids=block.positions,
                    **extra).last_hidden_state
        if hidden is None:
            hidden = out.new_empty(inputs.num_tokens + 1, out.shape[-1])  # the last row takes padding
        hidden.index_copy_(0, block.write_index, out.reshape(-1, out.shape[-1]))
    assert hidden is not None, "a batch has at least one sequence"
    return hidden[:-1]


def pooled_rows(model: ScoringModel, inputs: ForwardInputs, trunk: PaddedTrunk | None = None) -> torch.Tensor:
    """Forward the packed batch and pool it: [P, H] float32, one row per Pool of the units (graph-shaped inputs:
    one row per slot of the bucket, the live ones first). Reads no device value on the host for graph-shaped inputs,
    so it can be captured.
    `trunk`: another backend for the trunk, run on padded blocks (int8)."""
    inputs.layout.reset()  # masks are rebuilt from the tensors' current values in every pass
    token_index = inputs.pool_token_index
    if trunk is not None:
        hidden = padded_hidden(trunk, inputs)
    elif model.packed:
        extra = {} if inputs.token_type_ids is None else {"token_type_ids": inputs.token_type_ids}
        rows = None
        if model.selects_rows and inputs.layout.kind == LayoutKind.BLOCKS:  # eager: graph buckets keep their shapes
            pooled_tokens, index = torch.unique(token_index, return_inverse=True)  # ascending
            if len(pooled_tokens) < inputs.num_tokens:  # the trunk then returns these tokens only
                rows, token_index = pooled_tokens, index
        with per_token_tables(inputs.rope_table), only_rows(rows):
            output = model.trunk(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                                 scorekeeper_layout=inputs.layout, use_cache=False, **extra)
        hidden = output.last_hidden_state[0]
    else:
        hidden = padded_hidden(model.trunk, inputs)
    contributions = hidden[token_index].float() * inputs.pool_weight[:, None]
    pooled = torch.zeros(inputs.pool_rows or len(inputs.readouts), hidden.shape[-1], dtype=torch.float32,
                         device=hidden.device)
    return pooled.index_add_(0, inputs.pool_slot, contributions)
