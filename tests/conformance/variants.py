"""The model variants of the conformance suite: every supported architecture and kind, configured the ways real
checkpoints are (RoPE types, sliding windows, soft-capping, tied or untied embeddings, pad = EOS, no pad token,
padding_idx positions, token types, ModernBERT's pooling and local window, prompt templates), each small enough that
requests reach its maximum position.

A variant is a tiny model of tests/tiny_models.py rebuilt with config edits (weights of the edited shapes, same
seed); `build` writes it once per directory."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tiny_models
from tiny_models import SPECS, TinyModel

DECODER_MAX = 80  # positions of every decoder variant: requests reach it, windows and RoPE thresholds lie inside
ENCODER_MAX = 64
TEMPLATE_MAX = 400  # decoders behind a prompt template
WINDOW = 12  # sliding windows of the decoder variants (ModernBERT keeps its local window of 8)
LONGROPE_AFTER = 40  # longrope's original maximum: sequences on both sides of it
THETA = {"rope_theta": 10000.0}
ROPE = {
    "default": {"rope_type": "default", **THETA},
    "linear": {"rope_type": "linear", "factor": 2.0, **THETA},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, **THETA},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 20, **THETA},
    "longrope": {"rope_type": "longrope", "original_max_position_embeddings": LONGROPE_AFTER,
                 "short_factor": [1.0, 1.1, 1.3, 1.6], "long_factor": [2.0, 5.0, 11.0, 23.0], **THETA},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16, **THETA},
}
SLIDING_LAYERS = {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1,
                  "layer_types": ["full_attention", "sliding_attention"]}


@dataclass(frozen=True)
class Variant:
    base: TinyModel
    label: str
    edits: dict[str, Any] = field(default_factory=dict, hash=False)
    template: str | None = None  # --prompt-template (decoders)
    positions: int | None = None  # max_position_embeddings, when the default of its kind is too short

    @property
    def name(self) -> str:
        return f"{self.base.value}-{self.label}"

    @property
    def kind(self) -> str:
        return SPECS[self.base].kind

    @property
    def decoder(self) -> bool:
        return not SPECS[self.base].encoder and self.kind != "embedding"

    @property
    def cross_encoder(self) -> bool:
        return SPECS[self.base].encoder and self.kind == "classifier"

    def build(self, out_dir: Path) -> Path:
        positions = self.positions or (ENCODER_MAX + (2 if SPECS[self.base].family in ("xlmr", "roberta") else 0)
                                       if SPECS[self.base].encoder else DECODER_MAX)
        return tiny_models.build(self.base, out_dir, self.label, {"max_position_embeddings": positions} | self.edits)


def _rope(base: TinyModel, rope: str, **edits: Any) -> Variant:
    label = "-".join([rope, *(k.replace("_", "") for k in edits)])
    return Variant(base, label, {"rope_parameters": ROPE[rope]} | edits)


T = TinyModel
VARIANTS: list[Variant] = [
    # Decoders: every RoPE type, windows, soft-capping, tied and untied output embeddings, pad arrangements.
    _rope(T.QWEN2_REWARD, "longrope"),
    _rope(T.QWEN2_CLS3, "yarn", **SLIDING_LAYERS),
    _rope(T.QWEN2_CAUSAL, "dynamic", tie_word_embeddings=False),
    Variant(T.QWEN2_REWARD, "pad-eos", {"pad_token_id": 2}),
    _rope(T.QWEN3_CLS3, "longrope", **SLIDING_LAYERS),
    _rope(T.QWEN3_REWARD, "linear", pad_token_id=None),
    _rope(T.QWEN3_CAUSAL, "default"),
    # Qwen3-Reranker's prompt alone is about 170 tokens: room for it and for the query and items.
    Variant(T.QWEN3_RERANKER, "template", template="qwen3-reranker", positions=TEMPLATE_MAX),
    Variant(T.QWEN2_REWARD, "template-longrope",
            {"rope_parameters": ROPE["longrope"] | {"original_max_position_embeddings": 256}},
            template="qwen3-reranker", positions=TEMPLATE_MAX),
    _rope(T.LLAMA_REWARD, "llama3"),
    _rope(T.LLAMA_CLS3, "dynamic"),
    _rope(T.LLAMA_CAUSAL, "longrope", tie_word_embeddings=False),
    Variant(T.LLAMA_EOS_CLS3, "pad-eos", {"pad_token_id": 2}),
    _rope(T.MISTRAL_CLS3, "linear", sliding_window=WINDOW),
    _rope(T.MISTRAL_CAUSAL, "longrope", sliding_window=WINDOW),
    _rope(T.GEMMA2_REWARD, "default", sliding_window=WINDOW),
    _rope(T.GEMMA2_CLS3, "longrope", sliding_window=WINDOW, attn_logit_softcapping=None),
    _rope(T.GEMMA2_CAUSAL, "dynamic", sliding_window=WINDOW),
    Variant(T.QWEN3_EMBED, "plain"),
    # Encoders: token types, padding_idx positions, ModernBERT's pooling and local window, DeBERTa's own attention.
    Variant(T.BERT_CROSS, "plain"),
    Variant(T.BERT_EMBED, "plain"),
    Variant(T.ELECTRA_CROSS, "plain"),
    Variant(T.ELECTRA_EMBED, "plain"),
    Variant(T.ROBERTA_CROSS, "plain"),
    Variant(T.ROBERTA_EMBED, "plain"),
    Variant(T.XLMR_CROSS, "plain"),
    Variant(T.XLMR_EMBED, "plain"),
    Variant(T.MODERNBERT_CROSS, "plain"),
    Variant(T.MODERNBERT_CROSS_MEAN, "plain"),
    Variant(T.MODERNBERT_EMBED, "plain"),
    Variant(T.DEBERTA_CROSS, "plain"),
]
