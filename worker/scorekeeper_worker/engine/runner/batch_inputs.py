"""`build_inputs`: a batch's tensors in any layout, built on the host and moved to a device in one call, for tests,
benchmarks and start-up checks (the executor calls the two packers and `packing.to_device` itself, timing each).

Token layouts (CUDA-graph buckets, flex) are built with vector operations from the units' lengths
(`engine/runner/token_packing.py`); row blocks (the eager path on CPU) by `engine/runner/row_blocks.py`."""

from __future__ import annotations

import torch

from scorekeeper_worker.engine.runner import row_blocks, token_packing
from scorekeeper_worker.engine.runner.packing import ForwardInputs, GraphShape, PackUnit, fits, to_device
from scorekeeper_worker.model.kernels import mis_attention
from scorekeeper_worker.model.kernels.attention import LayoutKind


def build_inputs(units: list[PackUnit], device: torch.device, kind: LayoutKind = LayoutKind.BLOCKS,
                 shape: GraphShape | None = None) -> ForwardInputs:
    """Pack units into one row, on the host, then move it to `device`. `kind` picks the attention layout; `shape`
    (token layouts only) pads the batch to a CUDA-graph bucket: padding tokens after the live ones, each its own
    segment, and pool entries that add zero into the scratch slot, so every tensor has the bucket's shape and no
    live value is needed to run it."""
    if shape is not None and kind == LayoutKind.BLOCKS:
        raise ValueError("graph-shaped inputs need a token layout (dense or flex)")
    if shape is not None and not fits(units, shape):
        raise ValueError(f"batch does not fit the {shape.tokens}-token bucket")
    if kind == LayoutKind.BLOCKS:
        host = row_blocks.build(units)
    else:
        block = mis_attention.BLOCK_M if kind == LayoutKind.TRITON else 0
        host = token_packing.inputs(token_packing.pack(units, shape, block), kind, shape is not None)
    return to_device(host, device)
