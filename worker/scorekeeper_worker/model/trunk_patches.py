"""The engine's changes to the model's own trunk, made at load: each keeps the model's forward and its numbers, takes
its per-forward setting from a context variable (so the forward's signature stays transformers'), and can be set
aside for the self-check's transformers reference forwards.

RoPE tables chosen per sequence, without state: a score never depends on the rest of its packed batch.
transformers' rotary embeddings pick their table from the longest position of the whole forward
(`dynamic_rope_update`): `longrope` switches to its long factors when any position passes
`original_max_position_embeddings`, and `dynamic` rescales beyond `max_position_embeddings` and keeps the rescaled
table until a shorter forward resets it. A packed batch holds many sequences, so the engine replaces each rotary
module with `PackedRotary`: the tables of every length class are computed once at load (with transformers' own
functions and buffers), and each token takes the table of its own sequence, the one its sequence's own forward
would use (`RopeTables.table`, chosen by the planner and passed per token). Nothing is written during a forward.
`dynamic` needs one table only: within `max_position_embeddings` (the planner refuses longer sequences and counts
the multi-item delimiter) transformers' dynamic table is the unscaled one. The original modules are kept, and
`transformers_rotary` puts them back.

Only the pooled rows through the per-token tail of the last layer. A cross-encoder reads one token per sequence
(CLS pooling), yet a forward computes every token to the end. In an encoder layer the attention is the only step
that mixes tokens; after the last layer's attention every step (output projection, residual, norms, feed-forward)
works row by row. So from there on the engine keeps only the rows that pools read: the same values for those rows,
and for a six-layer MiniLM about a seventh of the forward saved. `ArchitectureSupport.pooled_rows_from` names the
module where that tail starts; it is called with tensors of one row per token ([1, T, H]: the attention output and
the residual), and a forward pre-hook cuts them to the selected rows. The selection is set for one forward by
`only_rows` (engine/runner/forward.py): transformers' own forwards of the same model run whole.

Linear layers through oneDNN on CPU in float32: weights prepacked once, the bias (and a GELU that follows) fused.

torch's `nn.Linear` on CPU copies the bias into the output and runs MKL's sgemm on top (`addmm`), and a GELU after it
is another pass over the result: two extra passes over every activation. oneDNN's fused linear, the op Inductor
emits on CPU, adds the bias and applies the GELU while a tile is still in registers. Its weight is reordered at load
into the blocked layout oneDNN's kernels read (`mkldnn._reorder_linear_weight`, as vLLM's CPU backend prepacks its
linear weights); with a plain weight every call reorders it again, and MiniLM forwards took 1.05× as long
(docs/benchmarks.md). The packed weight replaces the plain one, so memory does not grow: `weight` unpacks it (exact)
for whoever needs the plain matrix. Float32 results differ from MKL's only by summation order (about 1e-6
relative); `plain_linears()` runs torch's own `linear` (and GELU) for the duration, the self-check's reference."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import nn
from transformers.activations import GELUActivation
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from scorekeeper_worker.model.support import ArchitectureSupport

# RoPE types whose tables this module reproduces (transformers' ROPE_INIT_FUNCTIONS, plus "default").
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")

_SELECTION: ContextVar[torch.Tensor | None] = ContextVar("scorekeeper_rope_tables", default=None)
_ROWS: ContextVar[torch.Tensor | None] = ContextVar("scorekeeper_pooled_rows", default=None)
_PLAIN: ContextVar[bool] = ContextVar("scorekeeper_plain_linears", default=False)
_fused = torch.ops.mkldnn._linear_pointwise
_pack = torch.ops.mkldnn._reorder_linear_weight
V = TypeVar("V")


@contextmanager
def _during(variable: ContextVar[V], value: V) -> Iterator[None]:
    """`variable` holds `value` for the duration (one forward, or a reference forward)."""
    token = variable.set(value)
    try:
        yield
    finally:
        variable.reset(token)


@dataclass(frozen=True)
class RopeTables:
    """Which table a sequence of `length` tokens uses. `long_after`: longrope's original maximum, past which a
    sequence uses the long factors (None: one table for every length)."""

    long_after: int | None = None

    def table(self, length: int) -> int:
        return int(self.long_after is not None and length > self.long_after)


def per_token_tables(selection: torch.Tensor) -> AbstractContextManager[None]:
    """During one forward: token t of the packed row uses table `selection[t]` ([T] int64)."""
    return _during(_SELECTION, selection)


def _rope_parameters(config: object, layer_type: str | None) -> dict[str, object]:
    parameters = getattr(config, "rope_parameters", None) or {}
    return parameters[layer_type] if layer_type is not None else parameters  # type: ignore[no-any-return]


class PackedRotary(torch.nn.Module):
    """Stands in for a model's rotary embedding (same call: `(x, position_ids[, layer_type]) → (cos, sin)`)."""

    def __init__(self, original: torch.nn.Module, tables: RopeTables) -> None:
        super().__init__()
        self.original = original
        self.tables = tables
        self.scaling: dict[str | None, float] = {}
        per_layer = isinstance(original.rope_type, dict)
        for layer_type in (sorted(original.rope_type) if per_layer else [None]):
            prefix = f"{layer_type}_" if layer_type is not None else ""
            short = getattr(original, f"{prefix}original_inv_freq").detach().clone()
            rows = [short]
            rope_type = original.rope_type[layer_type] if per_layer else original.rope_type
            if tables.long_after is not None and rope_type == "longrope":  # longrope_frequency_update, long
                kwargs = {"layer_type": layer_type} if layer_type is not None else {}
                rows.append(ROPE_INIT_FUNCTIONS["longrope"](original.config, short.device,
                                                            seq_len=tables.long_after + 1, **kwargs)[0])
            elif tables.long_after is not None:
                rows.append(short)
            self.register_buffer(f"{prefix}inv_freq_tables", torch.stack(rows).float(), persistent=False)
            self.scaling[layer_type] = float(getattr(original, f"{prefix}attention_scaling"))

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor,
                layer_type: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        prefix = f"{layer_type}_" if layer_type is not None else ""
        inv_freq = getattr(self, f"{prefix}inv_freq_tables").to(x.device)  # [K, D/2]
        selection = _SELECTION.get()
        if selection is None:  # a plain forward (one sequence per row): the row's own length, as transformers
            long_after = self.tables.long_after
            row_length = position_ids.amax(dim=-1, keepdim=True) + 1
            selection = (row_length > long_after).long().expand_as(position_ids) if long_after is not None \
                else torch.zeros_like(position_ids)
        else:
            selection = selection[None, :].expand_as(position_ids)
        freqs = inv_freq[selection] * position_ids[..., None].float()  # [B, T, D/2], as transformers' outer product
        emb = torch.cat((freqs, freqs), dim=-1)
        scaling = self.scaling[layer_type]
        return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


def _rotary_modules(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str]]:
    """(parent, attribute) of every transformers rotary embedding of `model` (not yet replaced)."""
    return [(parent, name) for parent in model.modules() if not isinstance(parent, PackedRotary)
            for name, child in parent.named_children() if type(child).__name__.endswith("RotaryEmbedding")]


def long_after(config: object) -> int | None:
    """longrope's original maximum, or None when one table serves every length."""
    parameters = getattr(config, "rope_parameters", None) or {}
    nested = [parameters[k] for k in sorted(parameters) if isinstance(parameters[k], dict)] or [parameters]
    limits = {int(p["original_max_position_embeddings"]) for p in nested if p.get("rope_type") == "longrope"}
    if len(limits) > 1:
        raise ValueError(f"rope_parameters: longrope with several original maxima {sorted(limits)}")
    return limits.pop() if limits else None


def install_packed_rotary(model: torch.nn.Module) -> RopeTables:
    """Replace every rotary embedding of `model` by a PackedRotary; the tables a sequence length selects."""
    tables = RopeTables(long_after(model.config))  # type: ignore[arg-type]
    for parent, name in _rotary_modules(model):
        setattr(parent, name, PackedRotary(getattr(parent, name), tables))
    return tables


@contextmanager
def transformers_rotary(model: torch.nn.Module) -> Iterator[None]:
    """transformers' own rotary modules for the duration (the self-check's reference forwards); the engine's tables
    were computed at load, so whatever state transformers' modules keep never reaches them."""
    replaced = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
                if isinstance(child, PackedRotary)]
    for parent, name, packed in replaced:
        setattr(parent, name, packed.original)
    try:
        yield
    finally:
        for parent, name, packed in replaced:
            setattr(parent, name, packed)




def install_row_selection(trunk: torch.nn.Module, arch: ArchitectureSupport) -> bool:
    """Hook the module where the last layer's per-token tail starts; False if the architecture has none listed."""
    if arch.pooled_rows_from is None:
        return False
    last = trunk.config.num_hidden_layers - 1
    trunk.get_submodule(arch.pooled_rows_from.format(last=last)).register_forward_pre_hook(_select, with_kwargs=True)
    return True


def _select(_module: torch.nn.Module, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
    rows = _ROWS.get()
    if rows is None:
        return None
    return (tuple(a.index_select(1, rows) for a in args),
            {name: value.index_select(1, rows) for name, value in kwargs.items()})


def only_rows(rows: torch.Tensor | None) -> AbstractContextManager[None]:
    """During one forward: the trunk's output holds only the packed tokens `rows` ([K] int64, ascending), in that
    order (None: every token)."""
    return _during(_ROWS, rows)


class FusedLinear(nn.Module):
    """`linear`, then GELU (erf) when `gelu`, as one oneDNN call on a prepacked weight."""

    def __init__(self, linear: nn.Linear, gelu: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features, self.gelu = linear.in_features, linear.out_features, gelu
        self.packed = _pack(linear.weight.detach())  # an opaque oneDNN tensor: not a parameter or buffer
        self.bias = linear.bias

    @property
    def weight(self) -> torch.Tensor:
        """The plain [out, in] weight, unpacked (a copy)."""
        return self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _PLAIN.get():
            out = nn.functional.linear(x, self.weight, self.bias)
            return nn.functional.gelu(out) if self.gelu else out
        return _fused(x, self.packed, self.bias, "gelu" if self.gelu else "none", [],  # type: ignore[no-any-return]
                      "none" if self.gelu else "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, gelu={self.gelu}"


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


def plain_linears() -> AbstractContextManager[None]:
    """For the duration, fused layers compute as torch's own `nn.Linear` (and GELU) would."""
    return _during(_PLAIN, True)
