"""bench/gpu/make_qwen3_geometry.py: Qwen3-0.6B's geometry with SmolLM2's real tokenizer, loadable by the worker; and
the load benchmark's request bodies, whose token counts are exact with that tokenizer."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.loader import ModelKind, load_model
from transformers import PreTrainedTokenizerBase, Qwen3ForCausalLM

from bench.gpu import make_qwen3_geometry
from bench.load.load_workload import PRESETS, BodyPool, Mix, Shape, label_ids

# A geometry small enough to write and load in a test; the rest of Qwen3-0.6B's config is kept.
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "intermediate_size": 128, "vocab_size": 49152}


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerBase:
    return make_qwen3_geometry.smollm2_tokenizer()


def test_config_is_qwen3_0_6b(tokenizer: PreTrainedTokenizerBase) -> None:
    config = make_qwen3_geometry.qwen3_config(tokenizer)
    geometry = (config.hidden_size, config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
                config.head_dim, config.intermediate_size, config.vocab_size)
    assert geometry == (1024, 28, 16, 8, 128, 3072, 151936)
    assert config.tie_word_embeddings and config.hidden_act == "silu" and not config.attention_bias
    assert (config.bos_token_id, config.eos_token_id) == (tokenizer.bos_token_id, tokenizer.eos_token_id)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    # Tied: the embedding counts once. Counted by name, not by tying at construction: transformers' from_pretrained
    # patches PreTrainedModel.init_weights/tie_weights process-wide while it runs, and a test server loading in its
    # background thread at this moment would leave this model untied.
    parameters = sum(p.numel() for name, p in model.named_parameters() if name != "lm_head.weight")
    assert 590e6 < parameters < 600e6  # Qwen3-0.6B: 596 M with the embedding, 440 M without
    assert parameters - model.get_input_embeddings().weight.numel() == pytest.approx(440e6, rel=0.01)
    assert len(tokenizer) == 49152  # SmolLM2's vocabulary: every input id is a row of the embedding


def test_made_model_loads_in_the_worker_and_scores(tokenizer: PreTrainedTokenizerBase, tmp_path: Path,
                                                   server_for: Callable[..., object]) -> None:
    out = make_qwen3_geometry.make(tmp_path / "qwen3-small", seed=3, tokenizer=tokenizer, **SMALL)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["dtype"] == "bfloat16" and config["hidden_size"] == 64
    model = load_model(out, DType.FLOAT32, "cpu", "qwen3-small")
    assert model.kind == ModelKind.CAUSAL_LM and model.logit_size == 49152
    again = make_qwen3_geometry.make(tmp_path / "again", seed=3, tokenizer=tokenizer, **SMALL)
    weights = [load_model(path, DType.FLOAT32, "cpu", "x").model.state_dict() for path in (out, again)]
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[0])  # seeded
    server = server_for(out, dtype="float32")  # the start-up self-check compares it with transformers
    labels = label_ids(tokenizer)
    response = server.score(query="Is it true?", items=["Yes it is.", "No."], label_token_ids=labels,  # type: ignore[attr-defined]
                            apply_softmax=True, multi_item_scoring=True)
    assert response.status_code == 200
    assert [len(row) for row in response.json()["scores"]] == [2, 2]


@pytest.mark.parametrize("text", [True, False])
def test_bodies_have_exact_token_counts(tokenizer: PreTrainedTokenizerBase, text: bool) -> None:
    mix = Mix("test", ((0.5, Shape(7, 3, 5)), (0.5, Shape(12, 1, 9))))
    pool = BodyPool(mix, tokenizer, label_ids(tokenizer), text, size=40, seed=1)  # text: checked when built
    assert {shape for shape in pool.shapes} == {Shape(7, 3, 5), Shape(12, 1, 9)}
    for index in range(45):
        body, items = pool.body(index, mis=index % 2 == 0)
        request = json.loads(body)
        shape = pool.shapes[index % 40]
        assert items == shape.items == len(request["items"]) and request["multi_item_scoring"] == (index % 2 == 0)
        sequences = [request["query"], *request["items"]]
        if text:
            sequences = tokenizer(sequences, add_special_tokens=False)["input_ids"]
        assert [len(s) for s in sequences] == [shape.query_tokens] + [shape.item_tokens] * shape.items
        assert all(0 <= token < len(tokenizer) for s in sequences for token in s)
    assert BodyPool(mix, tokenizer, label_ids(tokenizer), text, size=40, seed=1).requests == pool.requests  # seeded


def test_sglang_preset_bodies(tokenizer: PreTrainedTokenizerBase) -> None:
    pool = BodyPool(PRESETS["sglang-mis"], tokenizer, label_ids(tokenizer), True, size=4, seed=0)
    request = json.loads(pool.body(0, mis=True)[0])
    assert request["label_token_ids"] == label_ids(tokenizer) and request["apply_softmax"] is True
    assert len(tokenizer(request["query"], add_special_tokens=False)["input_ids"]) == 120
