"""One attention call over a block of rows, with memory bounded by a tile, never by the square of a row's length.

`attend` runs q [R, H, Lq, D] against k/v [R, H, Lk, D] and returns the output and its log-sum-exp (multi-item views
are merged by it). On CPU without softcapping it is the fused flash kernel; a block that needs a mask (sliding
windows, key padding seen by non-causal rows) gets it one tile of queries at a time. `attend_output` is for rows
that need no log-sum-exp (whole sequences): short float32 rows on CPU take two batched matrix products and a
softmax per tile of rows instead, faster than the flash kernel's per-row and per-head work on short rows
(bench/cpu/bench_attention.py). Whole rows that lie as runs of packed tokens skip the gather altogether
(`attend_spans`: the fused kernel on each row's slice, from `IN_PLACE_MIN_KEYS` keys). Softcapping (Gemma2), other
devices and CUDA-graph buckets take the explicit float32 path, also one tile of queries at a time, so no call holds
more than `TILE_ELEMENTS` scores or mask entries: a 32k-token item costs tiles, not a 32k × 32k matrix per head.
Causal rows only look at the keys a tile can see (up to its last query, and within the window)."""

from __future__ import annotations

import torch

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
# Scores (explicit path: rows × heads × queries × keys) or mask entries (fused path: rows × queries × keys) one call
# may materialise: 16 M elements, 64 MB in float32. Below it a block is one call, as fast as untiled.
TILE_ELEMENTS = 1 << 24
# `attend_output` on CPU: batched matrix products for rows of up to this many keys (the two are even at 192-384 keys,
# flash wins beyond), in tiles of at most BATCHED_TILE scores (4 MB: much larger tiles leave the cache and lose).
BATCHED_MAX_KEYS = 256
BATCHED_TILE = 1 << 20
# Rows of at least this many keys that lie as runs of packed tokens attend in place (`attend_spans`); shorter ones
# are cheaper gathered into blocks for the batched path, where one call serves many rows.
IN_PLACE_MIN_KEYS = 64


class Mask:
    """Who sees whom in one attention call, evaluated one tile (query range × key range) at a time."""

    causal: bool
    window: int | None

    def __init__(self) -> None:
        self._tiles: dict[tuple[object, ...], torch.Tensor | None] = {}

    @property
    def fused_needs_bias(self) -> bool:
        """Whether the fused kernel needs the mask (it does plain causality itself)."""
        return True

    @property
    def per_query(self) -> bool:
        """Whether the mask differs between queries (else one row serves every query)."""
        return True

    def keys(self, q0: int, q1: int, keys: int) -> tuple[int, int]:
        """The key range queries [q0, q1) may see at all."""
        return 0, keys

    def allowed(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor | None:
        """[R', q1 - q0 (or 1), k1 - k0] bool (R' = the call's rows, or 1), or None when everything is visible."""
        raise NotImplementedError

    def tile(self, dtype: torch.dtype, q0: int, q1: int, k0: int, k1: int, keep: bool) -> torch.Tensor | None:
        """The tile as [R', 1, q, k]: bool for `dtype=torch.bool`, else an additive bias; `keep` caches it for the
        next layers (only done for a block that is a single tile, so the cache stays one tile per block)."""
        key = (dtype, q0, q1, k0, k1) if self.per_query else (dtype, k0, k1)
        if key in self._tiles:
            return self._tiles[key]
        allowed = self.allowed(q0, q1, k0, k1)
        if allowed is not None:
            allowed = allowed[:, None]
            if dtype != torch.bool:  # a finite minimum (not -inf) keeps a fully masked row finite, weighing nothing
                bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
                allowed = bias.masked_fill_(~allowed, torch.finfo(dtype).min)
        if keep:
            self._tiles[key] = allowed
        return allowed


class RowMask(Mask):
    """The rules of a row block from position ids (so multi-item positions just work). `q_pos` [R', Lq] and
    `k_pos`/`k_valid` [R', Lk] (`k_valid` None: no padding). Padding has position 0, so a materialised mask needs
    `k_valid` even for causal rows; the fused kernel's own causality (by index) hides right-padding without it.
    `contiguous`: queries and keys are the same row (positions grow by one along it), so a causal tile skips the
    keys after its last query and before its window."""

    def __init__(self, q_pos: torch.Tensor, k_pos: torch.Tensor, k_valid: torch.Tensor | None, causal: bool,
                 window: int | None, contiguous: bool) -> None:
        super().__init__()
        self.q_pos, self.k_pos, self.k_valid = q_pos, k_pos, k_valid
        self.causal, self.window, self.contiguous = causal, window, contiguous

    @property
    def fused_needs_bias(self) -> bool:
        return self.window is not None or (self.k_valid is not None and not self.causal)

    @property
    def per_query(self) -> bool:
        return self.causal or self.window is not None

    def keys(self, q0: int, q1: int, keys: int) -> tuple[int, int]:
        if not (self.contiguous and self.causal):
            return 0, keys
        return (0 if self.window is None else max(0, q0 - self.window + 1)), min(keys, q1)

    def allowed(self, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor | None:
        allowed = None if self.k_valid is None else self.k_valid[:, None, k0:k1]
        if self.per_query:
            distance = self.q_pos[:, q0:q1, None] - self.k_pos[:, None, k0:k1]
            # Encoders' local windows are symmetric (ModernBERT): |distance|.
            rule = (distance >= 0) if self.causal else (distance.abs() < self.window)
            if self.causal and self.window is not None:
                rule = rule & (distance < self.window)
            allowed = rule if allowed is None else allowed & rule
        return allowed


def fused_kernel(device: torch.device) -> bool:
    """Whether the fused kernel (with log-sum-exp and masks) runs on `device`: on CPU only."""
    return device.type == "cpu"


def _causal(q: torch.Tensor) -> RowMask:
    """Plain causality over one row of q's length, as a mask (for the paths that materialise one)."""
    index = torch.arange(q.shape[-2], device=q.device)[None]
    return RowMask(index, index, None, True, None, contiguous=True)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None, causal: bool, scale: float,
           softcap: float | None, explicit: bool = False,
           query_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, H, Lq, D] against [R, H, Lk, D] → (output [R, H, Lq, D], log-sum-exp [R, H, Lq] float32). `mask` None:
    every key (`causal`: every earlier key; only with Lq = Lk). `query_rows` fixes the tile height (graph buckets,
    whose result must not depend on how far a bucket is padded); by default it follows `TILE_ELEMENTS`."""
    explicit = explicit or softcap is not None or not fused_kernel(q.device)
    if not explicit and (mask is None or not mask.fused_needs_bias):
        return _flash_cpu(q, k, v, 0.0, causal, scale=scale)
    if mask is None and causal:
        mask = _causal(q)
    rows, heads, queries, _ = q.shape
    keys = k.shape[-2]
    per_query = rows * keys * (heads if explicit else 1)
    if not explicit and mask is not None and not mask.per_query:
        step = queries  # a key-padding mask is one row per block, whatever the query count
    else:
        step = query_rows or max(1, TILE_ELEMENTS // per_query)
    if explicit:
        k, v = k.float(), v.float()  # once for every tile (no copy when already float32)
    outputs, lses = [], []
    for q0 in range(0, queries, step):
        q1 = min(queries, q0 + step)
        k0, k1 = (0, keys) if mask is None else mask.keys(q0, q1, keys)
        single = step >= queries
        qt, kt, vt = q[:, :, q0:q1], k[:, :, k0:k1], v[:, :, k0:k1]
        if explicit:
            allowed = None if mask is None else mask.tile(torch.bool, q0, q1, k0, k1, single)
            o, lse = _explicit(qt, kt, vt, allowed, scale, softcap)
        else:
            assert mask is not None
            bias = mask.tile(q.dtype, q0, q1, k0, k1, single)
            o, lse = _flash_cpu(qt, kt, vt, 0.0, False, attn_mask=bias, scale=scale)[:2]
        outputs.append(o)
        lses.append(lse)
    if len(outputs) == 1:
        return outputs[0], lses[0]
    return torch.cat(outputs, dim=-2), torch.cat(lses, dim=-1)


def attend_output(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None, causal: bool, scale: float,
                  softcap: float | None) -> torch.Tensor:
    """`attend`'s output alone. Short float32 rows on CPU: tiles of whole rows (of query ranges, for wide rows) whose
    scores fit `BATCHED_TILE`, each two batched products and a softmax with the mask added as a bias."""
    rows, heads, queries, _ = q.shape
    keys = k.shape[-2]
    if softcap is not None or not fused_kernel(q.device) or q.dtype != torch.float32 or keys > BATCHED_MAX_KEYS:
        return attend(q, k, v, mask, causal, scale, softcap)[0]
    if mask is None and causal:
        mask = _causal(q)
    query_step = min(queries, max(1, BATCHED_TILE // (heads * keys)))
    row_step = max(1, BATCHED_TILE // (heads * query_step * keys))
    outputs = []
    for q0 in range(0, queries, query_step):
        q1 = min(queries, q0 + query_step)
        k0, k1 = (0, keys) if mask is None else mask.keys(q0, q1, keys)
        bias = None if mask is None else mask.tile(q.dtype, q0, q1, k0, k1, query_step == queries)
        if bias is not None and bias.shape[0] == 1:
            bias = bias.expand(rows, *bias.shape[1:])
        parts = [_batched(q[r0:r0 + row_step, :, q0:q1], k[r0:r0 + row_step, :, k0:k1], v[r0:r0 + row_step, :, k0:k1],
                          None if bias is None else bias[r0:r0 + row_step], scale)
                 for r0 in range(0, rows, row_step)]
        outputs.append(parts[0] if len(parts) == 1 else torch.cat(parts))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-2)


def in_place(device: torch.device, softcap: float | None, window: int | None, keys: int) -> bool:
    """Whether rows of up to `keys` keys that lie as runs of consecutive packed tokens attend where they lie
    (`attend_spans`): on CPU, without softcapping or a window (the rows need no mask then), from
    `IN_PLACE_MIN_KEYS` up."""
    return fused_kernel(device) and softcap is None and window is None and keys >= IN_PLACE_MIN_KEYS


def attend_spans(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spans: tuple[tuple[int, int], ...],
                 out: torch.Tensor, causal: bool, scale: float) -> None:
    """Whole rows in place: q [1, H, T, D] and k/v [1, Hkv, T, D] (transformers' views of the packed projections)
    → `out` [T', H, D] (T' ≥ T), one fused kernel call per row (start, length) on its slices. Nothing is gathered,
    padded or copied into head-major batches: MiniLM embedding forwards 1.06× (8-64 tokens) and 1.11-1.13× (32-224)
    faster than through gathered blocks (docs/benchmarks.md)."""
    for start, length in spans:
        end = start + length
        o = _flash_cpu(q[:, :, start:end], k[:, :, start:end], v[:, :, start:end], 0.0, causal, scale=scale)[0]
        out[start:end] = o[0].transpose(0, 1)


def _batched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None,
             scale: float) -> torch.Tensor:
    """One tile as batched products over rows × heads; `bias` [R, 1, q or 1, k] additive (finite minimum)."""
    rows, heads, queries, dim = q.shape
    keys = k.shape[-2]
    q3, k3 = q.reshape(rows * heads, queries, dim), k.reshape(rows * heads, keys, dim).transpose(1, 2)
    if bias is None:
        scores = torch.bmm(q3, k3).mul_(scale)
    else:
        scores = torch.baddbmm(bias.expand(rows, heads, queries, keys).reshape(rows * heads, queries, keys), q3, k3,
                               alpha=scale)
    probs = torch.softmax(scores, dim=-1)
    return torch.bmm(probs, v.reshape(rows * heads, keys, dim)).view(rows, heads, queries, dim)


def _explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None, scale: float,
              softcap: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One tile in float32 with materialised scores (k and v are float32 already)."""
    scores = (q.float() @ k.transpose(-1, -2)) * scale
    if softcap is not None:  # before the mask: tanh of a masked score would give it weight again
        scores = torch.tanh(scores / softcap) * softcap
    if allowed is not None:
        scores = scores.masked_fill_(~allowed, torch.finfo(torch.float32).min)
    # softmax (not exp(scores - lse)): its result does not change when masked columns are appended.
    return (torch.softmax(scores, dim=-1) @ v).to(q.dtype), torch.logsumexp(scores, dim=-1)


def masked_values(k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v ([..., keys, D] or token-major [keys, h, D] alike) for a kernel that multiplies masked keys by their
    weight 0 (dense tiles over a whole bucket, flex's partial tiles), where 0 × inf = NaN would reach every query of
    the call. A key whose value holds a non-finite number gets value 0, so where it is masked it adds exactly 0, and
    key NaN, so a query that does see it still gets a NaN score, and NaN out (transformers: inf or NaN). Where a
    key's score is NaN, the mask replaces it; the finite keys are unchanged, so other rows' results stay bit-exact."""
    bad = ~torch.isfinite(v).all(-1, keepdim=True)
    return k.masked_fill(bad, float("nan")), v.masked_fill(bad, 0.0)


def merge(*parts: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Attention over the union of disjoint key sets, from each set's output and log-sum-exp."""
    top = parts[0][1]
    for _, lse in parts[1:]:
        top = torch.maximum(top, lse)
    weights = [torch.exp(lse - top)[..., None] for _, lse in parts]
    total = sum(out.float() * w for (out, _), w in zip(parts, weights, strict=True))
    return (total / sum(weights)).to(parts[0][0].dtype)
