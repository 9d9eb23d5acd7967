"""sentence-transformers' configuration honoured in full, as `SentenceTransformer(path)` applies it: prompts
(`default_prompt_name`, `prompts`, a request's `prompt_name`, `include_prompt`), `max_seq_length` wherever it is
stored, both pooling file formats, Normalize, last-token pooling (Qwen3-Embedding checkpoints saved as
`Qwen3ForCausalLM`), `similarity_fn_name`; what the engine does not implement is refused at start-up, naming the key.
The variants are written by sentence-transformers 6.2 itself (tests/support/st_variants.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import st_variants
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.loader import ModelKind, load_model
from scorekeeper_worker.model.support import UnsupportedModel
from serving import RunningServer
from st_variants import VARIANTS

TEXTS = ["What is the capital of France?", "Paris is the capital of France.", "",
         "My Dog likes to run in the Park; the Server answers YES or no."]
LONG = "the dog likes to run in the park and the model scores every item. " * 6  # about 80 tokens
RTOL, ATOL = 1e-4, 1e-5


@pytest.fixture(scope="module")
def variant(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    root = tmp_path_factory.mktemp("st-variants")
    return lambda name: st_variants.build(VARIANTS[name], root)


@cache
def _encoder(path: Path) -> Any:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu")


def _post(server: RunningServer, route: str, body: dict[str, Any], status: int = 200) -> Any:
    response = httpx.post(server.url + route, json=body, timeout=120)
    assert response.status_code == status, response.text
    return response.json()


def _tokens(encoder: Any, text: str, prompt: str | None) -> int:
    ids = encoder.tokenizer((prompt or "") + text, truncation=True, max_length=encoder.max_seq_length)["input_ids"]
    return len(ids)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_embeddings_equal_sentence_transformers(name: str, variant: Callable[[str], Path],
                                                server_for: Callable[..., RunningServer]) -> None:
    path = variant(name)
    encoder = _encoder(path)
    body = _post(server_for(path), "/v1/embeddings", {"input": [*TEXTS, LONG], "truncate": True})
    expected = encoder.encode([*TEXTS, LONG])  # the default prompt, cut at max_seq_length, normalized if declared
    np.testing.assert_allclose([row["embedding"] for row in body["data"]], expected, rtol=RTOL, atol=ATOL)
    prompt = encoder.prompts.get(encoder.default_prompt_name) if encoder.default_prompt_name else None
    assert body["usage"]["prompt_tokens"] == sum(_tokens(encoder, text, prompt) for text in [*TEXTS, LONG])


@pytest.mark.parametrize("name", list(VARIANTS))
def test_score_and_rerank_are_the_models_similarity(name: str, variant: Callable[[str], Path],
                                                    server_for: Callable[..., RunningServer]) -> None:
    """/v1/score: `model.similarity(encode(query), encode(items))`, both sides with the default prompt, as
    `SentenceTransformer.encode` gives them; /v1/rerank ranks by it."""
    path = variant(name)
    encoder = _encoder(path)
    query, items = TEXTS[0], [*TEXTS[1:], LONG]
    expected = encoder.similarity(encoder.encode([query]), encoder.encode(items))[0].tolist()
    server = server_for(path)
    scores = _post(server, "/v1/score", {"query": query, "items": items, "truncate": True})["scores"]
    np.testing.assert_allclose([row[0] for row in scores], expected, rtol=RTOL, atol=ATOL)
    results = _post(server, "/v1/rerank", {"query": query, "documents": items, "truncate": True})["results"]
    assert [r["index"] for r in results] == sorted(range(len(items)), key=lambda i: -expected[i])
    np.testing.assert_allclose([r["relevance_score"] for r in results], sorted(expected, reverse=True), rtol=RTOL,
                               atol=ATOL)


@pytest.mark.parametrize("name", ["bert-max-length-tokenizer", "bert-max-length-legacy", "qwen3-embedding"])
def test_max_seq_length_wherever_it_is_stored(name: str, variant: Callable[[str], Path],
                                              server_for: Callable[..., RunningServer]) -> None:
    """A text over max_seq_length is a 400 naming it (prompt tokens count against it), and cut to it as
    sentence-transformers cuts it with `truncate`."""
    path = variant(name)
    encoder = _encoder(path)
    limit = VARIANTS[name].max_seq_length
    assert encoder.max_seq_length == limit and len(encoder.tokenizer(LONG)["input_ids"]) > limit
    server = server_for(path)
    error = _post(server, "/v1/embeddings", {"input": ["short", LONG]}, 400)
    assert error["message"].startswith("input[1]: sequence of ") and f"maximum of {limit}" in error["message"]
    body = _post(server, "/v1/embeddings", {"input": [LONG], "truncate": True})
    np.testing.assert_allclose(body["data"][0]["embedding"], encoder.encode([LONG])[0], rtol=RTOL, atol=ATOL)
    assert httpx.get(server.url + "/v1/models", timeout=10).json()["data"][0]["max_positions"] == limit


@pytest.mark.parametrize(("name", "prompt_name"), [("bert-default-prompt", "document"),
                                                   ("bert-default-prompt", "classification"),
                                                   ("qwen3-embedding", "query"), ("qwen3-embedding", "document")])
def test_a_request_picks_a_named_prompt(name: str, prompt_name: str, variant: Callable[[str], Path],
                                        server_for: Callable[..., RunningServer]) -> None:
    """`prompt_name` on /v1/embeddings = `encode(texts, prompt_name=...)` (TEI's field of the same name); the
    prompt counts against max_seq_length (Qwen3's query prompt fills most of the tiny variant's 64 tokens)."""
    path = variant(name)
    body = _post(server_for(path), "/v1/embeddings", {"input": TEXTS, "prompt_name": prompt_name, "truncate": True})
    np.testing.assert_allclose([row["embedding"] for row in body["data"]],
                               _encoder(path).encode(TEXTS, prompt_name=prompt_name), rtol=RTOL, atol=ATOL)


def test_truncate_dim_is_the_embeddings_dimension(variant: Callable[[str], Path],
                                                 server_for: Callable[..., RunningServer]) -> None:
    server = server_for(variant("bert-dot-truncated"))
    assert len(_post(server, "/v1/embeddings", {"input": "a", "dimensions": 16})["data"][0]["embedding"]) == 16
    error = _post(server, "/v1/embeddings", {"input": "a", "dimensions": 32}, 400)
    assert error["message"].startswith("dimensions: this model's embeddings have 16 dimensions")


def test_an_unknown_prompt_name_is_a_400_naming_the_prompts(variant: Callable[[str], Path],
                                                            server_for: Callable[..., RunningServer]) -> None:
    server = server_for(variant("bert-default-prompt"))
    error = _post(server, "/v1/embeddings", {"input": "a", "prompt_name": "search"}, 400)
    assert error["message"].startswith("prompt_name: 'search' is not one of this model's prompts")
    assert "'classification', 'document', 'query'" in error["message"]
    assert _post(server, "/v1/embeddings", {"input": "a", "prompt_name": 3}, 400)["message"].startswith("prompt_name")


# ----------------------------------------------------------------------------------------------- refusals


def _edited(variant: Callable[[str], Path], name: str, tmp_path: Path, file: str, **changes: Any) -> Path:
    target = tmp_path / f"{name}-edited"
    shutil.copytree(variant(name), target)
    settings = json.loads((target / file).read_text()) if (target / file).is_file() else {}
    (target / file).write_text(json.dumps(settings | changes))
    return target


@pytest.mark.parametrize(("name", "file", "changes", "match"), [
    ("bert-default-prompt", "1_Pooling/config.json", {"pooling_mode": "max"}, r"pooling_mode 'max'"),
    ("bert-default-prompt", "1_Pooling/config.json", {"pooling_mode": ["mean", "max"]}, r"pooling_mode \['mean'"),
    ("bert-max-length-legacy", "1_Pooling/config.json",
     {"pooling_mode_mean_tokens": False, "pooling_mode_weightedmean_tokens": True}, "pooling_mode_weightedmean_tokens"),
    ("bert-default-prompt", "1_Pooling/config.json", {"pooling_scale": 2}, "pooling_scale"),
    ("bert-default-prompt", "config_sentence_transformers.json", {"default_prompt_name": "search"},
     "default_prompt_name 'search'"),
    ("bert-default-prompt", "config_sentence_transformers.json", {"similarity_fn_name": "cos_sim"},
     "similarity_fn_name 'cos_sim'"),
    ("bert-default-prompt", "config_sentence_transformers.json", {"prompt_format": "x"}, "prompt_format"),
    ("bert-default-prompt", "sentence_bert_config.json", {"processing_kwargs": {"text": {"max_length": 8}}},
     "processing_kwargs"),
    ("bert-default-prompt", "sentence_bert_config.json", {"modality_config": {"message": {
        "method": "forward", "method_output_name": "last_hidden_state", "format": "flat"}}}, "modality_config"),
    ("bert-default-prompt", "sentence_bert_config.json", {"transformer_task": "fill-mask"}, "transformer_task"),
    ("qwen3-embedding", "2_Normalize/config.json", {"module_input_name": "token_embeddings"}, "module_input_name"),
])
def test_what_the_engine_does_not_implement_is_refused_naming_the_key(
        variant: Callable[[str], Path], tmp_path: Path, name: str, file: str, changes: dict[str, Any],
        match: str) -> None:
    path = _edited(variant, name, tmp_path, file, **changes)
    with pytest.raises(UnsupportedModel, match=match):
        load_model(path, DType.FLOAT32, "cpu", "t")


def test_a_qwen3_causal_lm_without_sentence_transformers_files_stays_a_causal_lm(
        variant: Callable[[str], Path], tmp_path: Path) -> None:
    """The same `Qwen3ForCausalLM` class is an embedding model with a sentence-transformers pipeline (modules.json
    with a Pooling module), a causal LM without one."""
    assert load_model(variant("qwen3-embedding"), DType.FLOAT32, "cpu", "t").kind == ModelKind.EMBEDDING
    bare = tmp_path / "bare"
    shutil.copytree(variant("qwen3-embedding"), bare)
    for name in ("modules.json", "config_sentence_transformers.json"):
        (bare / name).unlink()
    assert load_model(bare, DType.FLOAT32, "cpu", "t").kind == ModelKind.CAUSAL_LM  # lm_head tied to the embeddings


def test_a_text_with_nothing_left_to_pool_after_the_prompt_is_a_400(variant: Callable[[str], Path]) -> None:
    """With include_prompt false and a tokenizer that adds nothing after the text, an empty text is the prompt
    alone: sentence-transformers would pool no token at all (a zero vector); the request is refused instead."""
    import dataclasses

    from scorekeeper_worker.base.errors import Invalid
    from scorekeeper_worker.planning.encoding import LengthRules
    from scorekeeper_worker.planning.planner import ScoreAsk, plan, tokenize

    model = load_model(variant("bert-prompt-excluded"), DType.FLOAT32, "cpu", "t")
    model = dataclasses.replace(model, specials=dataclasses.replace(model.specials, suffix=[]))
    request = ScoreAsk(query="", items=["a dog", ""], rules=LengthRules(field="input"), embed=True)
    tokens = tokenize(model, request)
    with pytest.raises(Invalid, match=r"^input\[1\]: nothing left to pool after the model's prompt"):
        plan(model, request, tokens, False, 8192, None)


def test_an_embedding_pipeline_around_a_class_without_an_embedding_row_is_refused(
        variant: Callable[[str], Path], tmp_path: Path, tiny_model: Callable[[str], Path]) -> None:
    """gte-Qwen2's shape (Qwen2ForCausalLM + a Pooling module): not served as a causal LM it does not mean to be."""
    path = tmp_path / "qwen2-embedding"
    shutil.copytree(tiny_model("qwen2-causal"), path)
    for name in ("modules.json", "1_Pooling"):
        source = variant("qwen3-embedding") / name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, path / name)
    with pytest.raises(UnsupportedModel, match="Qwen2ForCausalLM with a sentence-transformers embedding pipeline"):
        load_model(path, DType.FLOAT32, "cpu", "t")


@pytest.mark.parametrize("direction", ["right", "left"])
def test_max_tokens_per_item_cuts_the_text_never_the_prompt(variant: Callable[[str], Path], direction: str) -> None:
    """docs/api.md "Long inputs": under an embedding model's prompt, `max_tokens_per_item` counts and cuts only the
    text's own tokens; the prompt's tokens stay whole, in front, whichever end is cut."""
    from scorekeeper_worker.api.wire.score import ScoreRequest
    from scorekeeper_worker.planning.planner import tokenize

    path = variant("bert-default-prompt")
    model = load_model(path, DType.FLOAT32, "cpu", "t")
    tokenizer = _encoder(path).tokenizer
    prompt = tokenizer(VARIANTS["bert-default-prompt"].prompts["query"], add_special_tokens=False)["input_ids"]
    text = tokenizer(LONG, add_special_tokens=False)["input_ids"]
    cls, sep = tokenizer("")["input_ids"]  # BERT: [CLS] text [SEP]
    assert len(prompt) > 1 and len(text) > 10
    kept = text[:5] if direction == "right" else text[-5:]
    request = ScoreRequest(query="q", items=[LONG, "dog"], max_tokens_per_item=5, truncation_direction=direction)
    items = tokenize(model, request.ask()).items
    assert items == [[cls, *prompt, *kept, sep],
                     tokenizer(VARIANTS["bert-default-prompt"].prompts["query"] + "dog")["input_ids"]]


@pytest.mark.parametrize("direction", ["right", "left"])
def test_every_window_of_a_chunked_document_begins_with_the_prompt(variant: Callable[[str], Path],
                                                                  direction: str) -> None:
    """/v1/rerank's `long_document_strategy: "chunk"` on an embedding model: every window is embedded as a text of
    its own, after the model's prompt (which its pooling leaves out here, include_prompt false), and the windows'
    texts are consecutive pieces of the document's tokens."""
    from scorekeeper_worker.planning.encoding import Direction, LengthRules
    from scorekeeper_worker.planning.planner import ScoreAsk, tokenize

    path = variant("bert-prompt-excluded")
    model = load_model(path, DType.FLOAT32, "cpu", "t")
    tokenizer = _encoder(path).tokenizer
    prompt_text = VARIANTS["bert-prompt-excluded"].prompts["classification"]
    prompt = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    document = LONG * 8
    text = tokenizer(document, add_special_tokens=False)["input_ids"]
    cls, sep = tokenizer("")["input_ids"]
    assert len(text) > model.max_positions
    rules = LengthRules(chunk=True, direction=Direction(direction), field="documents")
    tokens = tokenize(model, ScoreAsk(query="q", items=[document], rules=rules))
    windows = tokens.items
    assert len(windows) > 1 and all(len(window) <= model.max_positions for window in windows)
    assert all(window[:len(prompt) + 1] == [cls, *prompt] and window[-1] == sep for window in windows)
    assert [token for window in windows for token in window[len(prompt) + 1:-1]] == text
    assert tokens.pool_from == len(prompt) + 1  # [CLS] and the prompt, in every window
