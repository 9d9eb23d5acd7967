"""Unknown means refused: a checkpoint whose config holds a value the engine does not implement is refused at load,
naming the config key (model/config_keys.py, rendered into docs/support-matrix.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_runs import variant
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.config_keys import CONFIG_KEYS
from scorekeeper_worker.model.loader import load_model
from scorekeeper_worker.model.support import MATRIX, UnsupportedModel

ROPE = {"rope_theta": 10000.0}


def test_every_architecture_lists_its_config_keys() -> None:
    assert {arch.model_type for arch in MATRIX} == set(CONFIG_KEYS)


@pytest.mark.parametrize(("name", "config", "key"), [
    # transformers 5 no longer implements relative position embeddings in BERT: it would silently run absolute ones.
    ("bert-cross", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ("bert-embed", {"position_embedding_type": "relative_key_query"}, "position_embedding_type"),
    ("xlmr-cross", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ("electra-cross", {"is_decoder": True}, "is_decoder"),
    ("gemma2-reward", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("modernbert-cross", {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 2.0, **ROPE},
                                              "sliding_attention": {"rope_type": "default", **ROPE}}},
     "rope_parameters.*.rope_type"),
    ("qwen2-reward", {"layer_types": ["full_attention", "chunked_attention"]}, "layer_types"),
])
def test_unimplemented_config_values_are_refused_naming_the_key(name: str, config: dict[str, Any], key: str,
                                                                tiny_model: Callable[[str], Path],
                                                                tmp_path: Path) -> None:
    path = variant(tiny_model(name), tmp_path / name, **config)
    with pytest.raises(UnsupportedModel, match=rf"config key {key.replace('.', '[.]').replace('*', '[*]')} = "):
        load_model(path, DType.FLOAT32, "cpu", "t")


@pytest.mark.parametrize(("name", "config"), [
    ("bert-cross", {"position_embedding_type": "absolute"}),  # the usual BERT config.json
    ("qwen2-reward", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512,
                                          **ROPE}}),
    ("llama-reward", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 512, **ROPE}}),
    ("mistral-cls3", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, **ROPE}}),
])
def test_implemented_values_load(name: str, config: dict[str, Any], tiny_model: Callable[[str], Path],
                                 tmp_path: Path) -> None:
    assert load_model(variant(tiny_model(name), tmp_path / name, **config), DType.FLOAT32, "cpu", "t")
