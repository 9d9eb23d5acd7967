"""Load a local Hugging Face directory or a .gguf file and decide what kind of scoring model it is."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from scorekeeper_worker.attention import ATTENTION_NAME
from scorekeeper_worker.config import DType

log = logging.getLogger(__name__)

# Encoders whose position ids start after the padding index (RoBERTa family).
_OFFSET_POSITION_TYPES = {"roberta", "xlm-roberta", "camembert"}
_ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "camembert", "electra"}
# DistilBERT's head runs pre_classifier + ReLU before the classifier; refuse rather than score it wrongly.
_UNSUPPORTED_TYPES = {"distilbert"}


class ModelKind(StrEnum):
    CAUSAL_LM = "causal_lm"  # label-token probabilities at the item's last token
    CLASSIFIER = "classifier"  # decoder *ForSequenceClassification, reward models when num_labels == 1
    CROSS_ENCODER = "cross_encoder"  # encoder *ForSequenceClassification on (query, item) pairs
    EMBEDDING = "embedding"  # bi-encoder: cosine of pooled query and item embeddings


class EmbeddingPooling(StrEnum):
    MEAN = "mean"
    CLS = "cls"
    LAST = "last"


@dataclass
class ScoringModel:
    """A loaded model split into the trunk we run on packed batches and the head we apply to gathered rows."""

    name: str
    kind: ModelKind
    model: PreTrainedModel
    trunk: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    dtype: torch.dtype
    device: torch.device
    hidden_size: int
    logit_size: int  # causal LM: rows of the output embedding; classifiers: num_labels
    max_positions: int
    position_start: int
    uses_token_types: bool
    embedding_pooling: EmbeddingPooling = EmbeddingPooling.MEAN

    @property
    def is_decoder(self) -> bool:
        return self.kind in (ModelKind.CAUSAL_LM, ModelKind.CLASSIFIER)

    @property
    def has_pooled_hidden_states(self) -> bool:
        return self.kind != ModelKind.CAUSAL_LM


def _torch_dtype(dtype: DType, config_dtype: object) -> torch.dtype:
    if dtype == DType.AUTO:
        return torch.bfloat16 if str(config_dtype).endswith("bfloat16") else torch.float32
    return torch.bfloat16 if dtype == DType.BFLOAT16 else torch.float32


def _embedding_pooling(path: Path) -> EmbeddingPooling | None:
    """sentence-transformers layout: modules.json names a Pooling module whose config says how to pool."""
    modules_file = path / "modules.json"
    if not modules_file.exists():
        return None
    for module in json.loads(modules_file.read_text()):
        if module.get("type", "").endswith("Pooling"):
            pooling = json.loads((path / module["path"] / "config.json").read_text())
            if pooling.get("pooling_mode_cls_token"):
                return EmbeddingPooling.CLS
            if pooling.get("pooling_mode_lasttoken"):
                return EmbeddingPooling.LAST
            return EmbeddingPooling.MEAN
    return EmbeddingPooling.MEAN


def _detect_kind(path: Path, architecture: str, model_type: str) -> ModelKind:
    if model_type in _UNSUPPORTED_TYPES:
        raise ValueError(f"unsupported model type {model_type!r}: its classifier head has layers the worker does "
                         "not apply (supported encoders: " + ", ".join(sorted(_ENCODER_TYPES)) + ")")
    if architecture.endswith("ForCausalLM"):
        return ModelKind.CAUSAL_LM
    if architecture.endswith(("ForSequenceClassification", "ForRewardModel")):
        return ModelKind.CROSS_ENCODER if model_type in _ENCODER_TYPES else ModelKind.CLASSIFIER
    if _embedding_pooling(path) is not None or architecture.endswith("Model"):
        return ModelKind.EMBEDDING
    raise ValueError(f"unsupported architecture {architecture!r}: expected *ForCausalLM, "
                     "*ForSequenceClassification or a sentence-transformers encoder")


def _load_hf(path: Path, torch_dtype: DType) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, ModelKind]:
    config = AutoConfig.from_pretrained(path)
    architecture = (config.architectures or [type(config).__name__])[0]
    kind = _detect_kind(path, architecture, config.model_type)
    auto = {ModelKind.CAUSAL_LM: AutoModelForCausalLM, ModelKind.EMBEDDING: AutoModel}.get(
        kind, AutoModelForSequenceClassification)
    dtype = _torch_dtype(torch_dtype, getattr(config, "dtype", None))
    model = auto.from_pretrained(path, dtype=dtype)
    return model, AutoTokenizer.from_pretrained(path), kind


def load_model(path: Path, dtype: DType, device: str, name: str) -> ScoringModel:
    if path.suffix == ".gguf":
        from scorekeeper_worker.model_files import load_gguf

        model, tokenizer = load_gguf(path, _torch_dtype(dtype, None))
        kind = ModelKind.CAUSAL_LM
    else:
        model, tokenizer, kind = _load_hf(path, dtype)
    model = model.to(device=device, dtype=_torch_dtype(dtype, model.dtype)).eval()
    model.requires_grad_(False)
    model.set_attn_implementation(ATTENTION_NAME)
    config = model.config
    trunk = model if kind == ModelKind.EMBEDDING else model.base_model
    offset = config.pad_token_id + 1 if config.model_type in _OFFSET_POSITION_TYPES else 0
    if kind == ModelKind.CAUSAL_LM:
        logit_size = model.get_output_embeddings().weight.shape[0]
    else:
        logit_size = getattr(config, "num_labels", 0)
    log.info("loaded %s (%s, %s) from %s", type(model).__name__, kind, model.dtype, path)
    return ScoringModel(
        name=name,
        kind=kind,
        model=model,
        trunk=trunk,
        tokenizer=tokenizer,
        dtype=model.dtype,
        device=torch.device(device),
        hidden_size=config.hidden_size,
        logit_size=logit_size,
        max_positions=config.max_position_embeddings - offset,
        position_start=offset,
        uses_token_types=getattr(config, "type_vocab_size", 0) > 1,
        embedding_pooling=_embedding_pooling(path) or EmbeddingPooling.MEAN,
    )
