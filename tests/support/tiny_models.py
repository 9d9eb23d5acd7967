"""Tiny random models + tokenizers for tests, built offline from configs.

Every model is deterministic (fixed seeds; byte-level BPE trained on a fixed corpus, WordPiece vocab built from it by
hand), small enough to build in a fraction of a second, and saved with `save_pretrained` so that it reloads through
`AutoTokenizer` + `AutoModelFor...` exactly like a hub checkpoint would. The server detects the model kind from
`config.architectures`, which `save_pretrained` fills with the class name (see `TinySpec.architecture`).

    from tiny_models import ALL_TINY_MODELS, SPECS, build
    path = build("qwen3-cls3", tmp_dir)            # -> tmp_dir / "qwen3-cls3"

Every architecture × kind of the worker's support matrix (worker/scorekeeper_worker/model/support.py) has a model here
(tests/worker/model/test_support_matrix.py keeps the two in step); tokenizers are in tiny_tokenizers.py.

Design choices that matter for the tests built on top:
- Llama, Gemma2 and Mistral tokenizers add a BOS to single sequences (and before each sequence of a pair, like the
  real ones) so that BOS handling gets exercised; the Qwen tokenizers add nothing; `llama-eos-cls3` also appends an
  EOS, which must land at the end of the joined query + item sequence.
- `initializer_range` is raised from 0.02 to 0.2 so that scores vary by O(0.1-1) across inputs and positions: with
  the default, the tiny BERT cross-encoder's scores for different texts differ by ~1e-4, so a wrong pooling position
  or mask could hide inside test tolerances.
- Decoders get max_position_embeddings=2048 (multi-item scoring packs hundreds of items into one sequence); encoders
  512 (+ 2 for the RoBERTa family, whose positions start after padding_idx=1).
- Gemma2 keeps its real attention logit softcapping (50.0) and final logit softcapping (30.0). Note: transformers
  5.18's default "sdpa" attention silently ignores softcapping, "eager" and "flex_attention" apply it.
- Windows shorter than the test sequences: Mistral's causal window (24), ModernBERT's local layers (4 each side).
- DeBERTa-v2 is configured like DeBERTa-v3 (relative attention only, 8 position buckets).
"""

from __future__ import annotations

import enum
import json
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tiny_tokenizers
from tiny_tokenizers import DECODER_MAX_POSITIONS, ENCODER_MAX_POSITIONS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class TinyModel(enum.StrEnum):
    QWEN3_CLS3 = "qwen3-cls3"
    QWEN3_REWARD = "qwen3-reward"
    QWEN2_CLS3 = "qwen2-cls3"
    QWEN2_REWARD = "qwen2-reward"
    LLAMA_CLS3 = "llama-cls3"
    LLAMA_REWARD = "llama-reward"
    GEMMA2_CLS3 = "gemma2-cls3"
    GEMMA2_REWARD = "gemma2-reward"
    MISTRAL_CLS3 = "mistral-cls3"
    QWEN3_CAUSAL = "qwen3-causal"
    QWEN3_RERANKER = "qwen3-reranker"
    QWEN2_CAUSAL = "qwen2-causal"
    LLAMA_CAUSAL = "llama-causal"
    MISTRAL_CAUSAL = "mistral-causal"
    GEMMA2_CAUSAL = "gemma2-causal"
    QWEN3_EMBED = "qwen3-embed"
    QWEN3_CAUSAL_EMBED = "qwen3-causal-embed"
    LLAMA_EOS_CLS3 = "llama-eos-cls3"
    BERT_CROSS = "bert-cross"
    XLMR_CROSS = "xlmr-cross"
    ROBERTA_CROSS = "roberta-cross"
    ELECTRA_CROSS = "electra-cross"
    MODERNBERT_CROSS = "modernbert-cross"
    MODERNBERT_CROSS_MEAN = "modernbert-cross-mean"
    DEBERTA_CROSS = "deberta-v2-cross"
    BERT_EMBED = "bert-embed"
    XLMR_EMBED = "xlmr-embed"
    ROBERTA_EMBED = "roberta-embed"
    ELECTRA_EMBED = "electra-embed"
    MODERNBERT_EMBED = "modernbert-embed"


# The BOS token each family's tokenizer prepends (None: adds nothing), spelled like the real tokenizers.
DECODER_BOS = {"qwen3": None, "qwen2": None, "llama": "<|begin_of_text|>", "gemma2": "<bos>", "mistral": "<s>"}
ENCODER_FAMILIES = frozenset({"bert", "xlmr", "roberta", "electra", "modernbert", "deberta-v2"})


@dataclass(frozen=True)
class TinySpec:
    family: str  # a decoder family of DECODER_BOS, or one of ENCODER_FAMILIES
    kind: str  # "classifier" | "causal_lm" | "embedding" (reward models are classifiers with num_labels=1)
    architecture: str  # what config.architectures[0] will be after save_pretrained
    num_labels: int | None  # None for causal LMs and embedding models
    adds_bos: bool  # whether tokenizer(text) puts a BOS / CLS token in front
    adds_eos: bool = False  # whether tokenizer(text) puts an EOS after the text (decoders)
    pooling: str = "mean"  # embedding models: sentence-transformers pooling; ModernBERT: classifier_pooling
    vocab_size: int = 300  # byte-level BPE vocabularies (decoders, ModernBERT)
    added_tokens: tuple[str, ...] = ()  # decoders: tokens added after training (not special)

    @property
    def encoder(self) -> bool:
        return self.family in ENCODER_FAMILIES

    @property
    def loaded_class(self) -> str:
        """The class AutoModel gives an embedding model (sentence-transformers loads a *ForCausalLM's base model)."""
        return self.architecture.replace("ForCausalLM", "Model") if self.kind == "embedding" else self.architecture

    @property
    def token_types(self) -> bool:
        """Whether the model reads token_type_ids (type_vocab_size > 1)."""
        return self.family in ("bert", "electra")


def _spec(family: str, kind: str, architecture: str, num_labels: int | None = None, **extra: Any) -> TinySpec:
    adds_bos = family in ENCODER_FAMILIES or DECODER_BOS.get(family) is not None
    return TinySpec(family, kind, architecture, num_labels, adds_bos, **extra)


SPECS: dict[TinyModel, TinySpec] = {
    TinyModel.QWEN3_CLS3: _spec("qwen3", "classifier", "Qwen3ForSequenceClassification", 3),
    TinyModel.QWEN3_REWARD: _spec("qwen3", "classifier", "Qwen3ForSequenceClassification", 1),
    TinyModel.QWEN2_CLS3: _spec("qwen2", "classifier", "Qwen2ForSequenceClassification", 3),
    TinyModel.QWEN2_REWARD: _spec("qwen2", "classifier", "Qwen2ForSequenceClassification", 1),
    TinyModel.LLAMA_CLS3: _spec("llama", "classifier", "LlamaForSequenceClassification", 3),
    TinyModel.LLAMA_REWARD: _spec("llama", "classifier", "LlamaForSequenceClassification", 1),
    TinyModel.GEMMA2_CLS3: _spec("gemma2", "classifier", "Gemma2ForSequenceClassification", 3),
    TinyModel.GEMMA2_REWARD: _spec("gemma2", "classifier", "Gemma2ForSequenceClassification", 1),
    TinyModel.MISTRAL_CLS3: _spec("mistral", "classifier", "MistralForSequenceClassification", 3),
    TinyModel.QWEN3_CAUSAL: _spec("qwen3", "causal_lm", "Qwen3ForCausalLM"),
    # Qwen3-Reranker's tokenizer shape: ChatML specials and <think>/</think> as added tokens, and a vocabulary large
    # enough that "yes" and "no" (its labels) are single tokens.
    TinyModel.QWEN3_RERANKER: _spec("qwen3", "causal_lm", "Qwen3ForCausalLM", vocab_size=512,
                                    added_tokens=("<think>", "</think>")),
    TinyModel.QWEN2_CAUSAL: _spec("qwen2", "causal_lm", "Qwen2ForCausalLM"),
    TinyModel.LLAMA_CAUSAL: _spec("llama", "causal_lm", "LlamaForCausalLM"),
    TinyModel.MISTRAL_CAUSAL: _spec("mistral", "causal_lm", "MistralForCausalLM"),
    TinyModel.GEMMA2_CAUSAL: _spec("gemma2", "causal_lm", "Gemma2ForCausalLM"),
    TinyModel.QWEN3_EMBED: _spec("qwen3", "embedding", "Qwen3Model", adds_eos=True, pooling="lasttoken"),
    # Qwen3-Embedding's shape: saved as Qwen3ForCausalLM, a sentence-transformers last-token pipeline around it.
    TinyModel.QWEN3_CAUSAL_EMBED: _spec("qwen3", "embedding", "Qwen3ForCausalLM", adds_eos=True, pooling="lasttoken"),
    TinyModel.LLAMA_EOS_CLS3: _spec("llama", "classifier", "LlamaForSequenceClassification", 3, adds_eos=True),
    TinyModel.BERT_CROSS: _spec("bert", "classifier", "BertForSequenceClassification", 1),
    TinyModel.XLMR_CROSS: _spec("xlmr", "classifier", "XLMRobertaForSequenceClassification", 1),
    TinyModel.ROBERTA_CROSS: _spec("roberta", "classifier", "RobertaForSequenceClassification", 2),
    TinyModel.ELECTRA_CROSS: _spec("electra", "classifier", "ElectraForSequenceClassification", 1),
    TinyModel.MODERNBERT_CROSS: _spec("modernbert", "classifier", "ModernBertForSequenceClassification", 1,
                                      pooling="cls"),
    TinyModel.MODERNBERT_CROSS_MEAN: _spec("modernbert", "classifier", "ModernBertForSequenceClassification", 2,
                                           pooling="mean"),
    TinyModel.DEBERTA_CROSS: _spec("deberta-v2", "classifier", "DebertaV2ForSequenceClassification", 1),
    TinyModel.BERT_EMBED: _spec("bert", "embedding", "BertModel"),
    TinyModel.XLMR_EMBED: _spec("xlmr", "embedding", "XLMRobertaModel", pooling="cls"),
    TinyModel.ROBERTA_EMBED: _spec("roberta", "embedding", "RobertaModel"),
    TinyModel.ELECTRA_EMBED: _spec("electra", "embedding", "ElectraModel"),
    TinyModel.MODERNBERT_EMBED: _spec("modernbert", "embedding", "ModernBertModel"),
}

ALL_TINY_MODELS: list[TinyModel] = list(TinyModel)

SEED = 1234
INIT_RANGE = 0.2
CLS3_LABELS = {0: "negative", 1: "neutral", 2: "positive"}
# Windows far below the longest test sequences, so sliding-window masking is really exercised: Mistral's causal
# window, and ModernBERT's local layers (`local_attention` 8: each token sees 4 positions on either side).
MISTRAL_SLIDING_WINDOW = 24
MODERNBERT_LOCAL_ATTENTION = 8


def _decoder_config(family: str, tok: PreTrainedTokenizerBase, num_labels: int | None) -> Any:
    from transformers import Gemma2Config, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common: dict[str, Any] = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": DECODER_MAX_POSITIONS,
        "initializer_range": INIT_RANGE,
        # SeqCls pools at the last non-pad token, so pad_token_id must be set for batches > 1.
        "pad_token_id": tok.pad_token_id,
        "eos_token_id": tok.eos_token_id,
        "bos_token_id": tok.bos_token_id,
        "tie_word_embeddings": True,
    }
    if num_labels == 3:
        common |= {"num_labels": 3, "id2label": CLS3_LABELS, "label2id": {v: k for k, v in CLS3_LABELS.items()}}
    elif num_labels is not None:
        common["num_labels"] = num_labels
    if family == "qwen3":
        return Qwen3Config(head_dim=8, **common)
    if family == "qwen2":
        return Qwen2Config(**common)  # head_dim = hidden / heads = 8
    if family == "llama":
        return LlamaConfig(head_dim=8, **common)
    if family == "mistral":
        return MistralConfig(head_dim=8, sliding_window=MISTRAL_SLIDING_WINDOW, **common)
    if family == "gemma2":
        # query_pre_attn_scalar defaults to 256 (the real head_dim); scale attention like an 8-dim head instead.
        # sliding_window (4096) > max positions: sliding layers behave like global ones at every allowed length.
        return Gemma2Config(head_dim=8, query_pre_attn_scalar=8, sliding_window=4096, **common)
    raise ValueError(f"unknown decoder family {family!r}")


def _encoder_config(spec: TinySpec, tok: PreTrainedTokenizerBase) -> Any:
    import transformers

    common: dict[str, Any] = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "initializer_range": INIT_RANGE,
        "pad_token_id": tok.pad_token_id,
    }
    if spec.num_labels is not None:
        common["num_labels"] = spec.num_labels
    family = spec.family
    if family in ("bert", "electra"):
        extra = {"embedding_size": 16} if family == "electra" else {}  # ELECTRA projects embeddings up
        config = transformers.ElectraConfig if family == "electra" else transformers.BertConfig
        return config(max_position_embeddings=ENCODER_MAX_POSITIONS, type_vocab_size=2, **extra, **common)
    if family in ("xlmr", "roberta"):
        # RoBERTa position ids start at padding_idx + 1 = 2, hence the +2.
        config = transformers.XLMRobertaConfig if family == "xlmr" else transformers.RobertaConfig
        return config(max_position_embeddings=ENCODER_MAX_POSITIONS + 2, type_vocab_size=1,
                      bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id, **common)
    if family == "modernbert":
        # Global, local, global layers (ModernBERT alternates them); GLU MLP; rotary positions; no token types.
        return transformers.ModernBertConfig(
            num_hidden_layers=3, layer_types=["full_attention", "sliding_attention", "full_attention"],
            local_attention=MODERNBERT_LOCAL_ATTENTION, max_position_embeddings=ENCODER_MAX_POSITIONS,
            classifier_pooling=spec.pooling if spec.kind == "classifier" else "cls",
            cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id, bos_token_id=tok.cls_token_id,
            eos_token_id=tok.sep_token_id, **{k: v for k, v in common.items() if k != "num_hidden_layers"})
    if family == "deberta-v2":
        # DeBERTa-v3's shape: relative attention only (no absolute positions, no token types), log-bucketed
        # relative positions (8 buckets, so test sequences cross bucket boundaries), shared attention keys.
        return transformers.DebertaV2Config(
            max_position_embeddings=ENCODER_MAX_POSITIONS, relative_attention=True, position_buckets=8,
            max_relative_positions=-1, pos_att_type=["p2c", "c2p"], position_biased_input=False, type_vocab_size=0,
            norm_rel_ebd="layer_norm", share_att_key=True, pooler_hidden_size=32, pooler_hidden_act="gelu", **common)
    raise ValueError(f"unknown encoder family {family!r}")


def _make_model(spec: TinySpec, config: Any) -> PreTrainedModel:
    import transformers

    cls = getattr(transformers, spec.architecture)
    model = cls(config)
    return model.eval()


_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                 "lasttoken": "pooling_mode_lasttoken"}


def _write_sentence_transformers_files(out: Path, dim: int, pooling: str,
                                       max_seq_length: int = ENCODER_MAX_POSITIONS) -> None:
    """The files that make sentence-transformers (and our server) treat a *Model dir as a bi-encoder."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    settings = {"word_embedding_dimension": dim, "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False}
    settings |= {key: name == pooling for name, key in _POOLING_KEYS.items()}
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps(settings, indent=2))
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
    )


def tokenizer_for(spec: TinySpec) -> PreTrainedTokenizerBase:
    if spec.family == "modernbert":
        return tiny_tokenizers.modernbert_bpe()
    if spec.encoder:
        return tiny_tokenizers.wordpiece(roberta_style=spec.family in ("xlmr", "roberta"))
    return tiny_tokenizers.byte_bpe(DECODER_BOS[spec.family], eos=spec.adds_eos, vocab_size=spec.vocab_size,
                                    added=spec.added_tokens)


def _save(name: TinyModel, out: Path, config_edits: dict[str, Any] | None = None) -> None:
    import torch

    spec = SPECS[name]
    tok = tokenizer_for(spec)
    config = _encoder_config(spec, tok) if spec.encoder else _decoder_config(spec.family, tok, spec.num_labels)
    if config_edits:  # rebuilt from the merged settings, so derived fields (layer types, RoPE) follow the edits
        config = type(config).from_dict(config.to_dict() | config_edits)
    # A seed derived from the name (not the list position), so adding a model never changes the others' weights.
    torch.manual_seed(SEED + zlib.crc32(name.value.encode()))
    model = _make_model(spec, config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    if spec.kind == "embedding":
        offset = config.pad_token_id + 1 if spec.family in ("xlmr", "roberta") else 0
        _write_sentence_transformers_files(out, config.hidden_size, spec.pooling,
                                           min(ENCODER_MAX_POSITIONS, config.max_position_embeddings - offset))


def build(name: TinyModel | str, out_dir: Path | str, variant: str | None = None,
          config_edits: dict[str, Any] | None = None) -> Path:
    """Build the tiny model `name` into `out_dir / name` and return that directory; with `variant`, into
    `out_dir / name-variant`, its config built with `config_edits` (weights of the edited shapes, same seed).

    Reuses an existing complete build (the output is deterministic); writes to a temporary sibling directory first and
    renames it, so a crashed or concurrent build never leaves a half-written model behind.
    """
    name = TinyModel(name)
    target = Path(out_dir) / (name.value if variant is None else f"{name.value}-{variant}")
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name.value}-", dir=target.parent))
    try:
        _save(name, tmp, config_edits)
        # mkdtemp and transformers' weight writes are owner-only; a server under test may run as another user.
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # not a concurrent build of the same model: a real error
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def unembedded(name: TinyModel | str, out_dir: Path | str, tokens: tuple[str, ...] = ("<extra_tok>",)) -> Path:
    """The tiny model `name` with `tokens` added to its tokenizer only, without resize_token_embeddings (a common
    mistake in fine-tuned checkpoints): the tokenizer produces ids past the model's embedding rows."""
    from transformers import AutoTokenizer

    source = build(name, out_dir)
    target = Path(out_dir) / f"{TinyModel(name).value}-unembedded"
    if (target / "config.json").is_file():
        return target
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
        tok = AutoTokenizer.from_pretrained(source)
        tok.add_tokens(list(tokens))
        tok.save_pretrained(tmp)
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def build_all(out_dir: Path | str) -> dict[TinyModel, Path]:
    """Build every tiny model under `out_dir` (~ a few seconds in total)."""
    return {name: build(name, out_dir) for name in ALL_TINY_MODELS}


if __name__ == "__main__":
    import sys

    for model_name, path in build_all(sys.argv[1] if len(sys.argv) > 1 else "tiny-models").items():
        print(f"{model_name}\t{path}")
