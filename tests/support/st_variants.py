"""sentence-transformers configurations as real checkpoints carry them, on the tiny models' weights.

Each variant is written by sentence-transformers itself (`SentenceTransformer(modules=...).save`, the 6.2 file
format: `"pooling_mode": "mean"`, max_seq_length as the tokenizer's `model_max_length`), then optionally rewritten
into the classic layout older versions saved (`pooling_mode_*_tokens` flags, `max_seq_length` in
sentence_bert_config.json), or with the architecture Qwen3-Embedding ships (`Qwen3ForCausalLM` over base-model
weights). Tests compare the server with `SentenceTransformer(path)` loaded from the same directory; the conformance
suite can draw from `VARIANTS`.

    from st_variants import VARIANTS, build
    path = build(VARIANTS["bert-prompt-excluded"], tmp_dir)
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tiny_models
from tiny_models import TinyModel

QUERY_PROMPT = "query: "
DOCUMENT_PROMPT = "passage: "
# Qwen3-Embedding's published query prompt (config_sentence_transformers.json), no default prompt.
QWEN3_QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
LEGACY_POOLING_KEYS = {"cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
                       "mean": "pooling_mode_mean_tokens", "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
                       "weightedmean": "pooling_mode_weightedmean_tokens", "lasttoken": "pooling_mode_lasttoken"}


@dataclass(frozen=True)
class Variant:
    name: str
    base: TinyModel  # the tiny model whose weights and tokenizer are used
    pooling: str = "mean"  # "cls" | "mean" | "lasttoken"
    include_prompt: bool = True
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    max_seq_length: int | None = None
    normalize: bool = False
    similarity: str | None = None  # similarity_fn_name; None: cosine
    truncate_dim: int | None = None  # embeddings cut to their first values
    legacy_pooling: bool = False  # rewrite 1_Pooling/config.json with the classic pooling_mode_* flags
    # Rewrite sentence_bert_config.json the classic way ({"max_seq_length", "do_lower_case"}; the tokenizer keeps
    # its own model_max_length), as Qwen3-Embedding and MiniLM ship it.
    legacy_transformer: bool = False
    lowercase: bool = False  # do_lower_case (6.x saves it inside the tokenizer's normalizer)
    architecture: str | None = None  # overwrite config.architectures (Qwen3-Embedding: Qwen3ForCausalLM)
    # Keep the base's whole *ForCausalLM weights (`model.` prefix, an untied lm_head), as checkpoints converted from
    # the causal LM ship them; sentence-transformers itself saves the base model's only.
    causal_weights: bool = False
    # max_position_embeddings of the tiny model (its tokenizer's model_max_length follows, as real checkpoints
    # declare it), so that texts reach the maximum; None: the tiny model's own (512 encoders, 2048 decoders).
    positions: int | None = None


_PROMPTS = {"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT, "classification": "classify this: "}

VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("bert-default-prompt", TinyModel.BERT_EMBED, prompts=_PROMPTS, default_prompt_name="query"),
    Variant("bert-prompt-excluded", TinyModel.BERT_EMBED, prompts=_PROMPTS, default_prompt_name="classification",
            include_prompt=False),
    Variant("bert-cls-prompt-excluded-legacy", TinyModel.BERT_EMBED, pooling="cls", prompts=_PROMPTS,
            default_prompt_name="query", include_prompt=False, legacy_pooling=True),
    Variant("bert-max-length-tokenizer", TinyModel.BERT_EMBED, max_seq_length=40, normalize=True),
    Variant("bert-max-length-legacy", TinyModel.BERT_EMBED, max_seq_length=40, legacy_transformer=True,
            legacy_pooling=True, prompts=_PROMPTS, default_prompt_name="query"),
    Variant("bert-dot-truncated", TinyModel.BERT_EMBED, similarity="dot", truncate_dim=16),
    Variant("xlmr-cls-euclidean", TinyModel.XLMR_EMBED, pooling="cls", similarity="euclidean",
            prompts=_PROMPTS, default_prompt_name="document"),
    Variant("qwen3-embedding", TinyModel.QWEN3_EMBED, pooling="lasttoken", normalize=True,
            prompts={"query": QWEN3_QUERY_PROMPT, "document": ""}, architecture="Qwen3ForCausalLM",
            legacy_transformer=True, max_seq_length=64),
    Variant("qwen3-lowercase-legacy", TinyModel.QWEN3_EMBED, pooling="lasttoken", legacy_pooling=True,
            legacy_transformer=True, lowercase=True, prompts={"query": "Query: "}, default_prompt_name="query"),
    Variant("qwen3-embedding-default-prompt", TinyModel.QWEN3_EMBED, pooling="lasttoken", normalize=True,
            prompts={"query": QWEN3_QUERY_PROMPT, "document": ""}, default_prompt_name="query",
            architecture="Qwen3ForCausalLM", max_seq_length=48, similarity="manhattan"),
    Variant("qwen3-embedding-causal-weights", TinyModel.QWEN3_CAUSAL_EMBED, pooling="lasttoken", normalize=True,
            prompts={"query": QWEN3_QUERY_PROMPT, "document": ""}, default_prompt_name="query", include_prompt=False,
            causal_weights=True, max_seq_length=96),
    Variant("bert-no-max-length-legacy", TinyModel.BERT_EMBED, pooling="cls", legacy_transformer=True,
            legacy_pooling=True, positions=64, prompts={"query": QUERY_PROMPT}),
)}


def _position_offset(base: TinyModel) -> int:
    """RoBERTa's positions start after padding_idx (1): two fewer tokens than max_position_embeddings."""
    return 2 if tiny_models.SPECS[base].family in ("xlmr", "roberta") else 0


def _save(variant: Variant, base: Path, out: Path) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = Transformer(str(base), max_seq_length=variant.max_seq_length, do_lower_case=variant.lowercase)
    tokenizer_max = json.loads((base / "tokenizer_config.json").read_text())["model_max_length"]
    if variant.positions is not None:
        tokenizer_max = variant.positions - _position_offset(variant.base)
        if variant.max_seq_length is None:
            transformer.tokenizer.model_max_length = tokenizer_max
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=variant.pooling,
                                    include_prompt=variant.include_prompt)]
    if variant.normalize:
        modules.append(Normalize())
    encoder = SentenceTransformer(modules=modules, device="cpu", prompts=dict(variant.prompts),
                                  default_prompt_name=variant.default_prompt_name,
                                  similarity_fn_name=variant.similarity, truncate_dim=variant.truncate_dim)
    encoder.save(str(out), create_model_card=False)
    transformer_config = json.loads((out / "sentence_bert_config.json").read_text())
    if variant.legacy_transformer:
        transformer_config = {"max_seq_length": variant.max_seq_length, "do_lower_case": variant.lowercase}
        _edit(out / "tokenizer_config.json", model_max_length=tokenizer_max)
        shutil.copy(base / "tokenizer.json", out / "tokenizer.json")  # without the Lowercase normalizer 6.x adds
    else:  # 6.2 also offers a chat-template "message" modality for tokenizers with a chat template: text only here
        transformer_config["modality_config"].pop("message", None)
    (out / "sentence_bert_config.json").write_text(json.dumps(transformer_config, indent=2))
    if variant.legacy_pooling:
        settings = json.loads((out / "1_Pooling" / "config.json").read_text())
        legacy = {"word_embedding_dimension": settings["embedding_dimension"],
                  **{key: mode == variant.pooling for mode, key in LEGACY_POOLING_KEYS.items()},
                  "include_prompt": settings["include_prompt"]}
        (out / "1_Pooling" / "config.json").write_text(json.dumps(legacy, indent=2))
    if variant.architecture is not None:
        _edit(out / "config.json", architectures=[variant.architecture])
    if variant.causal_weights:
        shutil.copy(base / "model.safetensors", out / "model.safetensors")


def _edit(path: Path, **changes: object) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes, indent=2))


def build(variant: Variant, out_dir: Path) -> Path:
    """The variant's directory under `out_dir` (built once; written to a temporary sibling, then renamed)."""
    target = Path(out_dir) / variant.name
    if (target / "modules.json").is_file():
        return target
    edits: dict[str, object] = {"max_position_embeddings": variant.positions} if variant.positions else {}
    if variant.causal_weights:  # an lm_head of its own, which the embedding model must leave out
        edits["tie_word_embeddings"] = False
    label = "-".join(f"{key}{value}" for key, value in edits.items()).replace("_", "") or None
    base = tiny_models.build(variant.base, Path(out_dir) / "tiny", label, edits or None)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{variant.name}-", dir=target.parent))
    try:
        _save(variant, base, tmp)
        for path in [tmp, *tmp.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
