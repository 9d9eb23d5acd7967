"""The model variants of the conformance suite: every supported architecture and kind, configured the ways real
checkpoints are (RoPE types, sliding windows, soft-capping, tied or untied embeddings, pad = EOS, no pad token,
padding_idx positions, token types, ModernBERT's pooling and local window, prompt templates, multi-label
classifiers, the activation a cross-encoder declares wherever sentence-transformers reads it), each small enough that
requests reach its maximum position; and the sentence-transformers directories of tests/support/st_variants.py (prompts,
pooling in both file formats, max_seq_length wherever it is stored, Normalize, truncate_dim, similarity functions,
do_lower_case, Qwen3ForCausalLM embeddings over base-model and full causal-LM weights).

A variant is a tiny model of tests/support/tiny_models.py rebuilt with config edits (weights of the edited shapes, same
seed), re-saved by sentence-transformers' CrossEncoder for a 6.x activation; `build` writes it once per directory."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import st_variants
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


def _positions(base: TinyModel) -> int:
    """max_position_embeddings of a variant: requests reach it (RoBERTa's positions start after padding_idx)."""
    if not SPECS[base].encoder:
        return DECODER_MAX
    return ENCODER_MAX + (2 if SPECS[base].family in ("xlmr", "roberta") else 0)


@dataclass(frozen=True)
class Variant:
    base: TinyModel
    label: str
    edits: dict[str, Any] = field(default_factory=dict, hash=False)
    template: str | None = None  # --prompt-template (decoders)
    positions: int | None = None  # max_position_embeddings, when the default of its kind is too short
    activation: str | None = None  # a torch.nn activation, saved by CrossEncoder 6.x (config_sentence_transformers)
    # Tokens added to the tokenizer only (no resize_token_embeddings): ids past the embedding rows, which the server
    # refuses with a 400 wherever a request's text reaches one (issue 35).
    unembedded: tuple[str, ...] = ()

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
        positions = self.positions or _positions(self.base)
        path = tiny_models.build(self.base, out_dir, self.label, {"max_position_embeddings": positions} | self.edits)
        if self.activation is not None and not (path / "modules.json").is_file():
            import torch
            from sentence_transformers import CrossEncoder

            CrossEncoder(str(path), device="cpu", activation_fn=getattr(torch.nn, self.activation)()).save(str(path))
        if self.unembedded:
            path = _with_unembedded_tokens(path, self.unembedded)
        return path


def _with_unembedded_tokens(source: Path, tokens: tuple[str, ...]) -> Path:
    """A copy of `source` whose tokenizer has `tokens` added, its embeddings left as they are."""
    import shutil
    import tempfile

    from transformers import AutoTokenizer

    target = source.with_name(source.name + "-unembedded")
    if not (target / "config.json").is_file():
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        tok = AutoTokenizer.from_pretrained(source)
        tok.add_tokens(list(tokens))
        tok.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass(frozen=True)
class SentenceVariant:
    """A directory written by sentence-transformers 6.2 itself (tests/support/st_variants.py): an embedding model."""

    st: st_variants.Variant = field(hash=False)  # (unhashable: its prompts)
    template: None = None
    kind = "embedding"
    decoder = False
    cross_encoder = False

    @property
    def name(self) -> str:
        return self.st.name

    def build(self, out_dir: Path) -> Path:
        return st_variants.build(self.st, out_dir)


def _sentence(name: str) -> SentenceVariant:
    """A variant of tests/support/st_variants.py; those without a small max_seq_length get a tiny model with few
    positions (the maximum then comes from the tokenizer or max_position_embeddings), so that texts reach it."""
    variant = st_variants.VARIANTS[name]
    if variant.max_seq_length is None and variant.positions is None:
        variant = replace(variant, positions=_positions(variant.base))
    return SentenceVariant(variant)


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
    # The activation a cross-encoder declares (/v1/rerank): CrossEncoder 6.x's file, config.json's
    # sentence_transformers (4.x, 5.x), the legacy key; and multi-label classifiers (a sigmoid per class).
    Variant(T.BERT_CROSS, "identity-st6", activation="Identity"),
    Variant(T.ELECTRA_CROSS, "tanh-st6", activation="Tanh"),
    Variant(T.BERT_CROSS, "identity-st5", {"sentence_transformers": {
        "activation_fn": "torch.nn.modules.linear.Identity", "version": "5.1.0"}}),
    Variant(T.XLMR_CROSS, "tanh-legacy", {"sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}),
    Variant(T.ROBERTA_CROSS, "multilabel", {"problem_type": "multi_label_classification"}),
    Variant(T.QWEN3_CLS3, "multilabel", {"problem_type": "multi_label_classification"}),
    # Tokenizers larger than the embedding matrix: a decoder classifier, a causal LM and a cross-encoder.
    Variant(T.QWEN3_CLS3, "oversized", unembedded=("<extra_tok>",)),
    Variant(T.QWEN3_CAUSAL, "oversized", unembedded=("<extra_tok>", "<more_tok>"), positions=TEMPLATE_MAX),
    # Decisions (a chat template's prompt is long): Gemma2's soft-capping and windows behind one.
    Variant(T.GEMMA2_CAUSAL, "decisions", {"sliding_window": WINDOW}, positions=TEMPLATE_MAX),
    Variant(T.BERT_CROSS, "oversized", unembedded=("[EXTRA]",)),
]
SENTENCE_VARIANTS: list[SentenceVariant] = [_sentence(name) for name in st_variants.VARIANTS]
