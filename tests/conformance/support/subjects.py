"""One variant under test: the engine's model, and its independent references, loaded once per test run.

The references never share code with the engine: plain transformers forwards (tests/support/reference.py), the
tokenizer's own `tokenizers` post-processor for special tokens and pairs, sentence-transformers for embedding models
(and its CrossEncoder for cross-encoders' /v1/rerank), transformers' text-classification pipeline for class
probabilities."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

import reference
import tiny_tokenizers
from scorekeeper_worker.base.config import DType
from scorekeeper_worker.model.loader import ScoringModel, load_model
from scorekeeper_worker.model.templates.prompt_template import PromptTemplate, load_template, resolve_label_tokens
from variants import SentenceVariant, Variant


@dataclass
class Subject:
    variant: Variant | SentenceVariant
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
    unembedded: list[str] = field(default_factory=list)  # tokens the tokenizer has and the embeddings do not

    @property
    def kind(self) -> str:
        return self.variant.kind

    @cached_property
    def cross_encoder(self) -> Any:
        """sentence-transformers' CrossEncoder on the directory (its activation, wherever the files declare it)."""
        from sentence_transformers import CrossEncoder

        return CrossEncoder(str(self.path), device="cpu")

    @cached_property
    def pipeline(self) -> Any:
        """transformers' text-classification pipeline on the model (softmax, or a sigmoid per class for one logit
        and for multi_label_classification)."""
        from transformers import TextClassificationPipeline

        return TextClassificationPipeline(model=self.hf, tokenizer=self.tokenizer, device="cpu")


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
    subject.unembedded = sorted(str(token) for token_id, token in tokenizer.added_tokens_decoder.items()
                                if token_id >= subject.vocab_size)
    if variant.kind == "embedding":
        from sentence_transformers import SentenceTransformer

        encoder = SentenceTransformer(str(path), device="cpu")
        # sentence-transformers caps max_seq_length at max_position_embeddings, which RoBERTa's padding_idx offset
        # makes two too many: past `limit` it fails (index out of range), the server refuses or cuts at `limit`.
        encoder.max_seq_length = subject.max_positions = subject.room = min(limit, encoder.max_seq_length)
        subject.sentence_transformer = encoder
    return subject


def subject(variant: Variant | SentenceVariant, out_dir: Path) -> Subject:
    return _subject(variant, out_dir)


@cache
def half_precision(variant: Variant, out_dir: Path) -> ScoringModel:
    """The variant's engine in float16 (with the float32 engine's prompt template and label tokens)."""
    tested = _subject(variant, out_dir)
    engine = load_model(tested.path, DType.FLOAT16, "cpu", variant.name)
    engine.template, engine.default_labels = tested.engine.template, tested.engine.default_labels
    return engine
