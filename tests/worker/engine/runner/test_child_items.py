"""Child items (decisions: a question's options after the question, under the shared input): a multi-item unit shaped
as a tree `query → parent item → child items` gives every pooled row exactly what the flat sequence `query + parent
+ child` gives, in every attention layout (row blocks, per-token dense tiles, FlexAttention) and padded to a
CUDA-graph bucket, next to ordinary sequences and multi-item groups in the same batch."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.batch_inputs import build_inputs
from scorekeeper_worker.engine.runner.forward import pooled_rows
from scorekeeper_worker.engine.runner.packing import GraphShape, PackUnit, Pool
from scorekeeper_worker.model.kernels.attention import LayoutKind, token_allowed
from scorekeeper_worker.model.loader import ScoringModel, load_model

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
CPU = torch.device("cpu")


def _ids(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(10, 120) for _ in range(length)]


def _tree(model: ScoringModel, rng: random.Random, query: int, questions: list[tuple[int, list[int]]],
          owner: int) -> tuple[PackUnit, list[PackUnit]]:
    """A tree unit (query; per question an item and its option items as children), and the same rows as flat
    sequences, pooled in the same order: each question's last token, then every token of each option."""
    shared = _ids(rng, query)
    tree = PackUnit(list(shared), visible_prefix=query, position_start=model.position_start)
    flat = []
    for question_length, options in questions:
        tail = _ids(rng, question_length)
        end = tree.num_tokens + question_length - 1
        tree.items.append(tail)
        tree.parents.append(-1)
        parent = len(tree.items) - 1
        tree.pools.append(Pool(range(end, end + 1), owner + len(tree.pools)))
        prompt = shared + tail
        flat.append(PackUnit(prompt, position_start=model.position_start,
                             pools=[Pool(range(len(prompt) - 1, len(prompt)), owner + len(flat))]))
        for length in options:
            option = _ids(rng, length)
            start = tree.num_tokens
            tree.items.append(option)
            tree.parents.append(parent)
            sequence = prompt + option
            for j in range(length):
                tree.pools.append(Pool(range(start + j, start + j + 1), owner + len(tree.pools)))
                flat.append(PackUnit(sequence, position_start=model.position_start,
                                     pools=[Pool(range(len(prompt) + j, len(prompt) + j + 1), owner + len(flat))]))
    return tree, flat


def _batch(model: ScoringModel, seed: int) -> tuple[list[PackUnit], list[PackUnit]]:
    """Two tree units (one with a long option, beyond Mistral's window of 24; one question without options), a plain
    sequence and a plain multi-item group, in one batch; and the same rows flat."""
    rng = random.Random(seed)
    first, first_flat = _tree(model, rng, 30, [(9, [3, 1, 40]), (1, [2]), (6, [])], 0)
    second, second_flat = _tree(model, rng, 12, [(4, [5, 5])], 100)
    plain = PackUnit(_ids(rng, 17), position_start=model.position_start, pools=[Pool(range(16, 17), 200)])
    group = PackUnit(_ids(rng, 8), items=[_ids(rng, 3), _ids(rng, 6)], visible_prefix=8,
                     position_start=model.position_start, pools=[Pool(range(10, 11), 300), Pool(range(16, 17), 301)])
    group_flat = [PackUnit(group.context + item, position_start=model.position_start,
                           pools=[Pool(range(len(group.context) + len(item) - 1, len(group.context) + len(item)),
                                       owner)]) for item, owner in zip(group.items, (300, 301), strict=True)]
    return [first, plain, second, group], [*first_flat, plain, *second_flat, *group_flat]


def _pooled(model: ScoringModel, units: list[PackUnit], kind: LayoutKind,
            shape: GraphShape | None = None) -> dict[object, torch.Tensor]:
    with torch.inference_mode():
        inputs = build_inputs(units, CPU, kind, shape)
        rows = pooled_rows(model, inputs)
    return dict(zip([readout.slot for readout in inputs.readouts], rows, strict=False))


@pytest.mark.parametrize("name", ["qwen3-causal", "mistral-causal", "gemma2-causal", "llama-causal"])
def test_tree_rows_equal_flat_sequences(name: str, tiny_model: Callable[[str], Path]) -> None:
    model = load_model(tiny_model(name), DType.FLOAT32, "cpu", name)
    tree, flat = _batch(model, 3)
    expected = _pooled(model, flat, LayoutKind.BLOCKS)
    tokens = sum(unit.num_tokens for unit in tree)
    for kind, shape in ((LayoutKind.BLOCKS, None), (LayoutKind.DENSE, None), (LayoutKind.FLEX, None),
                        (LayoutKind.DENSE, GraphShape(tokens + 37, 64)), (LayoutKind.FLEX, GraphShape(tokens + 5, 64))):
        got = _pooled(model, tree, kind, shape)
        assert got.keys() >= expected.keys()
        for owner, row in expected.items():
            torch.testing.assert_close(got[owner], row, rtol=1e-5, atol=1e-5, msg=f"{kind} {shape} row {owner}")


def test_children_see_their_parent_only() -> None:
    """The per-token rule: a child token sees the query's visible prefix, its parent item whole, itself causally;
    never a sibling, another question, the other question's options, or a delimiter after the prefix."""
    unit = PackUnit([1, 2, 3, 9], items=[[4, 4], [5], [6, 6], [7]], visible_prefix=3, parents=[-1, 0, -1, 2])
    tokens = build_inputs([unit], CPU, LayoutKind.DENSE).layout.tokens
    assert tokens is not None
    index = torch.arange(tokens.segment.shape[0])
    allowed = token_allowed(tokens, index[:, None], index[None, :], True, None)
    # packed: query 0-3 (3 = delimiter), question A 4-5, its option 6, question B 7-8, its option 9
    assert allowed[6].nonzero().flatten().tolist() == [0, 1, 2, 4, 5, 6]
    assert allowed[9].nonzero().flatten().tolist() == [0, 1, 2, 7, 8, 9]
    assert allowed[8].nonzero().flatten().tolist() == [0, 1, 2, 7, 8]
    assert tokens.positions.tolist() == [0, 1, 2, 3, 3, 4, 5, 3, 4, 5]
