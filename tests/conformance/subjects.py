"""One variant under test: the engine's model, and its independent references, loaded once per session.

The references never share code with the engine: plain transformers forwards (tests/reference.py), the tokenizer's
own `tokenizers` post-processor for special tokens and pairs, sentence-transformers for embedding models."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import reference
import tiny_tokenizers
from conformance.variants import Variant
from scorekeeper_worker.config import DType
from scorekeeper_worker.model.loader import ScoringModel, load_model
from scorekeeper_worker.model.prompt_template import PromptTemplate, load_template, resolve_label_tokens


@dataclass
class Subject:
    variant: Variant
    path: Path
    engine: ScoringModel
    hf: Any  # the transformers model (float32, its own attention)
    tokenizer: Any
    template: PromptTemplate | None
    max_positions: int  # read from the checkpoint's files, not from the engine
    room: int  # positions left for query and items (beside a prompt template's own tokens)
    vocab_size: int
    logit_size: int
    words: list[str]
    specials: list[str]
    sentence_transformer: Any = None  # embedding models

    @property
    def kind(self) -> str:
        return self.variant.kind


def _max_positions(path: Path, hf: Any) -> int:
    config = hf.config
    offset = config.pad_token_id + 1 if config.model_type in ("roberta", "xlm-roberta") else 0
    limit = config.max_position_embeddings - offset
    settings = path / "sentence_bert_config.json"
    if settings.is_file():
        limit = min(limit, json.loads(settings.read_text()).get("max_seq_length") or limit)
    return int(limit)


@cache
def _subject(variant: Variant, out_dir: Path) -> Subject:
    path = variant.build(out_dir)
    hf, tokenizer, _ = reference.load_model(path)
    engine = load_model(path, DType.FLOAT32, "cpu", variant.name)
    template = load_template(variant.template) if variant.template is not None else None
    engine.template = template  # what the service does for --prompt-template
    if template is not None and template.label_tokens and variant.kind == "causal_lm":
        engine.default_labels = resolve_label_tokens(engine.tokenizer, template.label_tokens, "template",
                                                     engine.logit_size)
    output = hf.get_output_embeddings() if variant.kind == "causal_lm" else None
    words = sorted({word for line in tiny_tokenizers.corpus() for word in line.split()})
    specials = sorted(set(tokenizer.all_special_tokens) | {str(t) for t in tokenizer.added_tokens_decoder.values()})
    limit = _max_positions(path, hf)
    room = limit - (len(tokenizer(template.render("", "", None))["input_ids"]) if template is not None else 0)
    subject = Subject(variant, path, engine, hf, tokenizer, template, limit, room,
                      hf.get_input_embeddings().num_embeddings,
                      output.weight.shape[0] if output is not None else 0, words, specials)
    if variant.kind == "embedding":
        from sentence_transformers import SentenceTransformer

        subject.sentence_transformer = SentenceTransformer(str(path), device="cpu")
    return subject


def subject(variant: Variant, out_dir: Path) -> Subject:
    return _subject(variant, out_dir)
