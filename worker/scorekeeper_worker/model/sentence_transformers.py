"""A model directory's sentence-transformers configuration, read as sentence-transformers 6.2 reads it.

`SentenceTransformer(path)`: modules.json (Transformer, Pooling, an optional Normalize); the Transformer's settings
(sentence_bert_config.json, or an older file name): `max_seq_length`, `do_lower_case`; otherwise the tokenizer's
`model_max_length` (where 6.x saves max_seq_length), capped at `max_position_embeddings`; the Pooling file in either
format (`pooling_mode_*_tokens` flags, or 6.2's `pooling_mode`) with `include_prompt`;
config_sentence_transformers.json: `prompts`, `default_prompt_name`, `similarity_fn_name`, `truncate_dim`.
`CrossEncoder(path)`: its `activation_fn`, from config_sentence_transformers.json (6.x), config.json's
`sentence_transformers` (4.x, 5.x) or `sbert_ce_default_activation_function` (older); sigmoid for one logit by
default. Anything else that would change a score is refused with the file and key named: the engine serves what it
implements, or nothing."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from scorekeeper_worker.model.support import ModelKind, Pooling, UnsupportedModel

PIPELINE_FILE = "config_sentence_transformers.json"
# Transformer settings file names, in the order sentence-transformers tries them.
TRANSFORMER_FILES = ("sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
                     "sentence_camembert_config.json", "sentence_albert_config.json",
                     "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json")
_MODULES = ("Transformer", "Pooling", "Normalize")  # in this order; Pooling and Normalize for embedding models only
_POOLING_MODES = {"cls": Pooling.CLS, "mean": Pooling.MEAN, "lasttoken": Pooling.LAST}
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
_POOLING_KEYS = {"embedding_dimension", "word_embedding_dimension", "pooling_mode", "include_prompt", *_LEGACY_POOLING}
_PIPELINE_KEYS = {"__version__", "model_type", "prompts", "default_prompt_name", "similarity_fn_name", "truncate_dim",
                  "activation_fn", "keep_in_fp32_modules", "requirements"}
# Transformer settings that change no score: loading options (the worker's own flags decide dtype and attention),
# the output feature's name, and FlashAttention unpadding.
_IGNORED_TRANSFORMER_KEYS = {"model_args", "model_kwargs", "module_output_name", "unpad_inputs", "backend"}
_TASKS = {ModelKind.EMBEDDING: "feature-extraction", ModelKind.CROSS_ENCODER: "sequence-classification"}
_TOKENIZER_KEYS = {"model_max_length", "padding_side"}  # padding side: the engine never pads a sequence


class Similarity(StrEnum):
    """`similarity_fn_name`: what /v1/score and /v1/rerank return for a (query, item) pair of embeddings."""

    COSINE = "cosine"
    DOT = "dot"
    EUCLIDEAN = "euclidean"  # minus the distance, as sentence-transformers' euclidean_sim
    MANHATTAN = "manhattan"


class Activation(StrEnum):
    """CrossEncoder's `activation_fn` over a single logit: /v1/rerank's relevance."""

    SIGMOID = "sigmoid"
    IDENTITY = "identity"
    TANH = "tanh"

    def apply(self, logit: float) -> float:
        if self == Activation.IDENTITY:
            return logit
        if self == Activation.TANH:
            return math.tanh(logit)
        tail = math.exp(-abs(logit))  # never overflows
        return 1 / (1 + tail) if logit >= 0 else tail / (1 + tail)


# The dotted paths CrossEncoder saves (fullname of the module) or accepts (torch.nn.X).
_ACTIVATIONS = {"torch.nn.Sigmoid": Activation.SIGMOID, "torch.nn.modules.activation.Sigmoid": Activation.SIGMOID,
                "torch.nn.Identity": Activation.IDENTITY, "torch.nn.modules.linear.Identity": Activation.IDENTITY,
                "torch.nn.Tanh": Activation.TANH, "torch.nn.modules.activation.Tanh": Activation.TANH}


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int  # sentence-transformers' prompt_length: the prompt alone with specials, less a trailing special
    plain: int  # the prompt alone without specials: the leading tokens of a text max_tokens_per_item leaves alone


@dataclass(frozen=True)
class SentenceTransformersConfig:
    """What sentence-transformers applies around the model; the defaults are a directory without its files."""

    pooling: Pooling | None = None  # None: no Pooling module (the support matrix's default applies)
    include_prompt: bool = True  # False: prompt tokens are not pooled
    normalize: bool = False  # a Normalize module: unit-length embeddings
    max_seq_length: int | None = None
    prompts: Mapping[str, Prompt] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity: Similarity = Similarity.COSINE
    truncate_dim: int | None = None  # embeddings cut to their first truncate_dim values (after Normalize)
    activation: Activation = Activation.SIGMOID  # cross-encoders with one logit

    def prompt(self, name: str | None) -> Prompt | None:
        """`encode(prompt_name=name)`: the named prompt, else the default one; None when it is empty or absent.
        KeyError for a name the model does not have."""
        chosen = self.prompts[name] if name is not None else self.prompts.get(self.default_prompt_name or "")
        return chosen if chosen is not None and chosen.text else None


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UnsupportedModel(f"{path.name}: not readable as JSON ({error})") from None


def _modules(path: Path) -> list[dict[str, Any]]:
    file = path / "modules.json"
    return _read(file) if file.is_file() else []


def _pipeline(path: Path) -> dict[str, Any]:
    file = path / PIPELINE_FILE
    settings = _read(file) if file.is_file() else {}
    if unknown := sorted(set(settings) - _PIPELINE_KEYS):
        raise UnsupportedModel(f"{PIPELINE_FILE}: {unknown} not implemented by the engine")
    return settings


def is_embedding_directory(path: Path) -> bool:
    """A SentenceTransformer directory (modules.json with a Pooling module): served as the embedding model it is,
    whatever class config.architectures names (Qwen3-Embedding says `Qwen3ForCausalLM`)."""
    if not path.is_dir() or not any(_type(m) == "Pooling" for m in _modules(path)):
        return False
    return _pipeline(path).get("model_type", "SentenceTransformer") == "SentenceTransformer"


def _type(module: Mapping[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _check_modules(modules: list[dict[str, Any]], kind: ModelKind) -> None:
    allowed = _MODULES if kind == ModelKind.EMBEDDING else _MODULES[:1]
    types = [_type(m) for m in modules]
    for module, name in zip(modules, types, strict=True):
        if name not in allowed:
            raise UnsupportedModel(f"sentence-transformers module {module.get('type')!r} ({module.get('path')}) is "
                                   f"not applied by the engine; supported: {list(allowed)}")
    pipelines = [[], list(_MODULES[:2]), list(_MODULES)] if kind == ModelKind.EMBEDDING else [[], list(_MODULES[:1])]
    if types not in pipelines or (types and modules[0].get("path", "") != ""):
        raise UnsupportedModel(f"modules.json: {types} is not a pipeline the engine implements (the model's own "
                               "directory as the Transformer, then Pooling, then optionally Normalize)")


def _transformer_settings(path: Path, kind: ModelKind) -> dict[str, Any]:
    file = next((path / name for name in TRANSFORMER_FILES if (path / name).is_file()), None)
    if file is None:
        return {}
    settings: dict[str, Any] = _read(file)
    for key, value in settings.items():
        implemented = (
            key in _IGNORED_TRANSFORMER_KEYS | {"max_seq_length", "do_lower_case"}
            or (key == "transformer_task" and value == _TASKS[kind])
            or (key == "modality_config" and list(value) == ["text"] and value["text"].get("method") == "forward")
            or (key in ("tokenizer_args", "processor_kwargs") and set(value or {}) <= _TOKENIZER_KEYS)
            or value in (None, {}, []))  # query_length, processing_kwargs, config_kwargs, ... at their defaults
        if not implemented:
            raise UnsupportedModel(f"{file.name}: {key} = {json.dumps(value)} is not implemented by the engine")
    return settings


def _max_seq_length(settings: Mapping[str, Any], tokenizer_max: int, max_positions: int) -> int:
    """sentence-transformers' order: the tokenizer kwargs' model_max_length, else max_seq_length, else the
    tokenizer's own model_max_length capped at max_position_embeddings."""
    tokenizer_kwargs = settings.get("processor_kwargs") or settings.get("tokenizer_args") or {}
    explicit = tokenizer_kwargs.get("model_max_length", settings.get("max_seq_length"))
    return int(explicit) if explicit is not None else min(tokenizer_max, max_positions)


def _pooling(path: Path) -> tuple[Pooling, bool]:
    file = path / "config.json"
    settings = _read(file)
    where = f"{path.name}/config.json"
    if unknown := sorted(set(settings) - _POOLING_KEYS):
        raise UnsupportedModel(f"{where}: {unknown} not implemented by the engine")
    if "pooling_mode" in settings:
        mode, named = settings["pooling_mode"], f"pooling_mode {settings['pooling_mode']!r}"
    else:  # the classic flags; none set means mean, as sentence-transformers reads them
        flags = [key for key in _LEGACY_POOLING if settings.get(key)]
        mode = [_LEGACY_POOLING[key] for key in flags] or "mean"
        named = ", ".join(flags)
    mode = mode[0] if isinstance(mode, list) and len(mode) == 1 else mode
    if not isinstance(mode, str) or mode not in _POOLING_MODES:
        raise UnsupportedModel(f"{where}: {named} is not implemented by the engine, which pools by one of "
                               f"{list(_POOLING_MODES)}")
    return _POOLING_MODES[mode], bool(settings.get("include_prompt", True))


def _normalize(path: Path) -> None:
    file = path / "config.json"
    settings = _read(file) if file.is_file() else {}
    for key, value in settings.items():
        if key not in ("module_input_name", "module_output_name") or value != "sentence_embedding":
            raise UnsupportedModel(f"{path.name}/config.json: {key} = {value!r} is not implemented by the engine "
                                   "(Normalize of the sentence embedding only)")


def _activation(path: Path, config: Any, pipeline: Mapping[str, Any], modules: list[dict[str, Any]]) -> Activation:
    """CrossEncoder's order: config_sentence_transformers.json (a 6.x CrossEncoder directory), config.json's
    sentence_transformers.activation_fn, sbert_ce_default_activation_function; sigmoid for one logit."""
    sources = [(f"{PIPELINE_FILE} activation_fn", pipeline.get("activation_fn")
                if modules and pipeline.get("model_type") == "CrossEncoder" else None),
               ("sentence_transformers.activation_fn", (getattr(config, "sentence_transformers", None) or {}).get(
                   "activation_fn")),
               ("sbert_ce_default_activation_function", getattr(config, "sbert_ce_default_activation_function", None))]
    for key, declared in sources:
        if declared is not None:
            if declared not in _ACTIVATIONS:
                raise UnsupportedModel(f"{key} {declared!r} is not implemented by the engine; supported: "
                                       f"{sorted(_ACTIVATIONS)}")
            return _ACTIVATIONS[declared]
    return Activation.SIGMOID if getattr(config, "num_labels", 1) == 1 else Activation.IDENTITY


def _lowercase(tokenizer: Any) -> None:
    """do_lower_case as sentence-transformers applies it: a Lowercase normalizer in front of the tokenizer's own,
    so every text (prompt included) is lower-cased exactly where its tokenizer would."""
    from tokenizers.normalizers import Lowercase
    from tokenizers.normalizers import Sequence as NormalizerSequence

    backend = tokenizer.backend_tokenizer
    normalizer = backend.normalizer
    if isinstance(normalizer, Lowercase) or (isinstance(normalizer, NormalizerSequence)
                                             and any(isinstance(n, Lowercase) for n in normalizer)):
        return
    rest = list(normalizer) if isinstance(normalizer, NormalizerSequence) else [normalizer] if normalizer else []
    backend.normalizer = NormalizerSequence([Lowercase(), *rest])


def _prompts(pipeline: Mapping[str, Any], tokenizer: Any, max_seq_length: int, kind: ModelKind,
             ) -> tuple[dict[str, Prompt], str | None]:
    texts = {"query": "", "document": ""} if kind == ModelKind.EMBEDDING else {}  # SentenceTransformer's defaults
    texts |= {name: text or "" for name, text in (pipeline.get("prompts") or {}).items()}
    default = pipeline.get("default_prompt_name")
    if default is not None and default not in texts:
        raise UnsupportedModel(f"{PIPELINE_FILE}: default_prompt_name {default!r} is not one of its prompts "
                               f"{sorted(texts)} (sentence-transformers refuses it too)")
    if kind != ModelKind.EMBEDDING and default is not None and texts[default]:
        raise UnsupportedModel(f"{PIPELINE_FILE}: default_prompt_name {default!r}: the engine applies prompts to "
                               "embedding models only")
    prompts = {}
    for name, text in texts.items():
        ids = list(tokenizer(text, truncation=True, max_length=max_seq_length)["input_ids"]) if text else []
        trailing_special = bool(ids) and ids[-1] in set(tokenizer.all_special_ids)
        plain = len(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else 0
        prompts[name] = Prompt(text, len(ids) - trailing_special, plain)
    return prompts, default


def read(path: Path, kind: ModelKind, config: Any, tokenizer: Any) -> SentenceTransformersConfig:
    """The configuration of a local directory for a model of `kind` (causal LMs: none; decoder classifiers: the
    activation). With do_lower_case the tokenizer is given sentence-transformers' Lowercase normalizer."""
    if kind == ModelKind.CAUSAL_LM or not path.is_dir():
        return SentenceTransformersConfig()
    modules = _modules(path)
    _check_modules(modules, kind)
    pipeline = _pipeline(path) if modules else {}
    if kind == ModelKind.CLASSIFIER:  # decoder classifiers: only what CrossEncoder would apply to their logits
        return SentenceTransformersConfig(activation=_activation(path, config, pipeline, modules))
    settings = _transformer_settings(path, kind) if modules else {}
    positions = getattr(config, "max_position_embeddings", -1)
    max_seq_length = _max_seq_length(settings, tokenizer.model_max_length,
                                     positions if positions != -1 else tokenizer.model_max_length)
    if settings.get("do_lower_case"):
        _lowercase(tokenizer)
    prompts, default = _prompts(pipeline, tokenizer, max_seq_length, kind)
    common = {"max_seq_length": max_seq_length, "prompts": prompts, "default_prompt_name": default}
    if kind == ModelKind.CROSS_ENCODER:
        if pipeline.get("keep_in_fp32_modules"):
            raise UnsupportedModel(f"{PIPELINE_FILE}: keep_in_fp32_modules is not implemented by the engine")
        return SentenceTransformersConfig(activation=_activation(path, config, pipeline, modules), **common)
    pooling, include_prompt = (None, True)
    by_type = {_type(m): path / m.get("path", "") for m in modules}
    if "Pooling" in by_type:
        pooling, include_prompt = _pooling(by_type["Pooling"])
    if "Normalize" in by_type:
        _normalize(by_type["Normalize"])
    similarity = pipeline.get("similarity_fn_name") or Similarity.COSINE
    if similarity not in set(Similarity):
        raise UnsupportedModel(f"{PIPELINE_FILE}: similarity_fn_name {similarity!r} is not one of "
                               f"{[s.value for s in Similarity]}")
    return SentenceTransformersConfig(pooling=pooling, include_prompt=include_prompt, normalize="Normalize" in by_type,
                                      similarity=Similarity(similarity), truncate_dim=pipeline.get("truncate_dim"),
                                      **common)
