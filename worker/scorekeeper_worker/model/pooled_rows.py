"""Only the pooled rows through the per-token tail of the last layer.

A cross-encoder reads one token per sequence (CLS pooling), yet a forward computes every token to the end. In an
encoder layer the attention is the only step that mixes tokens; after the last layer's attention every step (output
projection, residual, norms, feed-forward) works row by row. So from there on the engine keeps only the rows that
pools read: the same values for those rows, and for a six-layer MiniLM about a seventh of the forward saved.

`ArchitectureSupport.pooled_rows_from` names the module where that tail starts; it is called with tensors of one row
per token ([1, T, H]: the attention output and the residual), and a forward pre-hook cuts them to the selected rows.
The selection is set for one forward by `only_rows` (engine/runner/forward.py): transformers' own forwards of the
same model (the self-check's reference) run whole."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

from scorekeeper_worker.model.support import ArchitectureSupport

_ROWS: ContextVar[torch.Tensor | None] = ContextVar("scorekeeper_pooled_rows", default=None)


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


@contextmanager
def only_rows(rows: torch.Tensor | None) -> Iterator[None]:
    """During one forward: the trunk's output holds only the packed tokens `rows` ([K] int64, ascending), in that
    order (None: every token)."""
    token = _ROWS.set(rows)
    try:
        yield
    finally:
        _ROWS.reset(token)
