"""The self-check's embedding reference reads the sentence-transformers configuration on its own (not through the
engine's reader): it equals `SentenceTransformer.encode` on every variant, and it catches an engine that reads the
configuration wrongly (pooling, prompt, max_seq_length, similarity)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import st_variants
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.engine.runner.executor import Executor
from scorekeeper_worker.model.loader import ScoringModel, load_model
from scorekeeper_worker.model.sentence_transformers import Similarity
from scorekeeper_worker.model.support import Pooling
from scorekeeper_worker.serving.startup import embedding_reference, selfcheck
from st_variants import VARIANTS
from transformers import AutoModel

TEXTS = ["What is the capital of France?", "", "My Dog likes to run in the Park.",
         "the dog likes to run in the park and the model scores every item. " * 6]
# The tiny models' classic directories.
PLAIN = ["bert-embed", "xlmr-embed", "qwen3-embed", "qwen3-causal-embed", "modernbert-embed"]


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory, tiny_model: Callable[[str], Path]) -> Callable[[str], Path]:
    root = tmp_path_factory.mktemp("st-variants")
    return lambda name: tiny_model(name) if name in PLAIN else st_variants.build(VARIANTS[name], root)


@cache
def _encoder(path: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


@pytest.mark.parametrize("name", [*PLAIN, *VARIANTS])
def test_the_reference_equals_sentence_transformers(name: str, directory: Callable[[str], Path]) -> None:
    path = directory(name)
    encoder = _encoder(path)
    reference = embedding_reference.ReferenceEncoder(path, AutoModel.from_pretrained(path, dtype=torch.float32).eval())
    prompt_names = [None, *(n for n in encoder.prompts if encoder.prompts[n])]
    for prompt_name in prompt_names:
        got = torch.stack([reference.embed(text, prompt_name) for text in TEXTS])
        expected = encoder.encode(TEXTS, prompt_name=prompt_name, convert_to_tensor=True)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-4, atol=1e-5, err_msg=str(prompt_name))
    np.testing.assert_allclose(reference.similarity(got[:1], got).numpy(),
                               encoder.similarity(expected[:1], expected).numpy(), rtol=1e-4, atol=1e-5)


def _check(model: ScoringModel) -> selfcheck.SelfCheckResult:
    return selfcheck.run(model, Executor(model), check=True, max_batch_tokens=8192, max_items=4096,
                         multi_item=False, delimiter=None)


@pytest.mark.parametrize("name", [*PLAIN, *VARIANTS])
def test_the_self_check_passes_on_every_variant(name: str, directory: Callable[[str], Path]) -> None:
    result = _check(load_model(directory(name), DType.FLOAT32, "cpu", "t"))
    assert result.deviation is not None and result.deviation < 1e-5


def _sabotaged(model: ScoringModel, **sentence_config: Any) -> ScoringModel:
    return dataclasses.replace(model, sentence_config=dataclasses.replace(model.sentence_config, **sentence_config))


@pytest.mark.parametrize(("name", "sabotage"), [
    ("bert-embed", lambda m: dataclasses.replace(m, pooling=Pooling.CLS)),
    ("bert-default-prompt", lambda m: _sabotaged(m, default_prompt_name=None)),
    ("bert-prompt-excluded", lambda m: _sabotaged(m, include_prompt=True)),
    ("bert-max-length-tokenizer", lambda m: dataclasses.replace(m, max_positions=512)),
    ("bert-dot-truncated", lambda m: _sabotaged(m, similarity=Similarity.COSINE)),
    ("bert-dot-truncated", lambda m: _sabotaged(m, truncate_dim=None)),
])
def test_the_self_check_catches_a_wrong_reading(name: str, sabotage: Callable[[ScoringModel], ScoringModel],
                                                directory: Callable[[str], Path]) -> None:
    with pytest.raises(selfcheck.SelfCheckFailed, match="deviate from plain transformers"):
        _check(sabotage(load_model(directory(name), DType.FLOAT32, "cpu", "t")))
