"""Load a local Hugging Face directory or a .gguf file as one of the kinds the support matrix lists, or refuse it.

Refused at load, with a message naming what is wrong: an architecture outside the matrix (support.py), weights
that transformers would initialise at random or that do not fit (missing / mismatched parameters, a head saved
under other names), sentence-transformers modules the engine does not apply, and tokenizers whose special tokens are not
`prefix + text + suffix`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from scorekeeper_worker.base.config import Device, DType
from scorekeeper_worker.model import sentence_transformers
from scorekeeper_worker.model.config_keys import check_config
from scorekeeper_worker.model.dtypes import DTypeChoice, choose_dtype, detect_hardware, dtype_name
from scorekeeper_worker.model.kernels.attention import ATTENTION_NAME
from scorekeeper_worker.model.sentence_transformers import SentenceTransformersConfig
from scorekeeper_worker.model.support import (
    ArchitectureSupport,
    Execution,
    HeadStep,
    KindSupport,
    ModelKind,
    Pooling,
    PoolingSource,
    UnsupportedModel,
    resolve,
)
from scorekeeper_worker.model.templates.prompt_template import PromptTemplate
from scorekeeper_worker.model.templates.special_tokens import PairLayout, SpecialTokens, pair_layout, special_tokens
from scorekeeper_worker.model.trunk_patches import RopeTables, install_packed_rotary, install_row_selection
from scorekeeper_worker.model.vocabulary import Vocabulary, check_specials, vocabulary

__all__ = ["HeadModules", "ModelKind", "Pooling", "ScoringModel", "load_model", "refuse_early"]
log = logging.getLogger(__name__)

_AUTO_CLASS = {ModelKind.CAUSAL_LM: AutoModelForCausalLM, ModelKind.EMBEDDING: AutoModel,
               ModelKind.CLASSIFIER: AutoModelForSequenceClassification,
               ModelKind.CROSS_ENCODER: AutoModelForSequenceClassification}

HeadModules = tuple[tuple[torch.nn.Module, bool], ...]  # (module, reads token 0 of a sequence)


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
    pooling: Pooling
    specials: SpecialTokens  # where the tokenizer puts its specials around one sequence
    support: ArchitectureSupport
    pre_head: HeadModules = ()
    head: HeadModules = ()
    pair: PairLayout | None = None  # cross-encoders: the tokenizer's pair template
    # Embedding models and cross-encoders: what sentence-transformers applies around the model (prompts, Normalize,
    # similarity, CrossEncoder's activation; model/sentence_transformers.py).
    sentence_config: SentenceTransformersConfig = field(default_factory=SentenceTransformersConfig)
    rope: RopeTables = field(default_factory=RopeTables)  # the RoPE table of each length (model/trunk_patches.py)
    # Decoder classifiers: the head reads the last token that is not this id (transformers' config.pad_token_id).
    classifier_pad: int | None = None
    # The tokenizer's ids against the embedding rows (model/vocabulary.py); None: not compared (a test's model).
    vocabulary: Vocabulary | None = None
    selects_rows: bool = False  # the trunk can stop computing unpooled rows after the last attention (trunk_patches.py)
    # Set by the service from --prompt-template / --label-tokens (decoders): the prompt every text pair is wrapped
    # in, and the label tokens a request that sends none gets.
    template: PromptTemplate | None = None
    default_labels: list[int] | None = None

    @property
    def is_decoder(self) -> bool:
        return self.kind in (ModelKind.CAUSAL_LM, ModelKind.CLASSIFIER)

    @property
    def multi_label(self) -> bool:
        """transformers' multi_label_classification: one sigmoid per class, not a softmax over them."""
        return getattr(self.model.config, "problem_type", None) == "multi_label_classification"

    @property
    def packed(self) -> bool:
        return self.support.execution == Execution.PACKED

    @property
    def has_pooled_hidden_states(self) -> bool:
        return self.kind != ModelKind.CAUSAL_LM


def _pooling(config: object, kind: KindSupport, sentence_config: SentenceTransformersConfig) -> Pooling:
    if kind.pooling_source == PoolingSource.CLASSIFIER_POOLING:
        return Pooling(getattr(config, "classifier_pooling", kind.pooling.value))
    if kind.pooling_source == PoolingSource.SENTENCE_TRANSFORMERS:
        return sentence_config.pooling or kind.pooling
    return kind.pooling


def _check_weights(info: Mapping[str, Iterable[object]], arch: ArchitectureSupport, kind: KindSupport,
                   prefix: str) -> None:
    """transformers' loading report (`output_loading_info=True`) → refuse anything it initialised at random or could
    not load as saved."""
    unused = arch.unused_in_embedding if kind.kind == ModelKind.EMBEDDING else ()
    missing = sorted(str(k) for k in info.get("missing_keys", ()) if not str(k).startswith(unused))
    mismatched = sorted(str(k) for k in info.get("mismatched_keys", ()))
    unexpected = sorted(str(k) for k in info.get("unexpected_keys", ()))
    problems = []
    if missing:
        problems.append(f"missing from the checkpoint (transformers would initialise them at random): {missing}")
    if mismatched:
        problems.append(f"saved with other shapes: {mismatched}")
    stray = [k for k in unexpected if not k.startswith(prefix + ".")] if kind.head else []
    if stray:  # head weights under names this class does not use: a head saved by another class
        problems.append(f"in the checkpoint but not used by {arch.class_prefix}{kind.class_suffix}: {stray}")
    if problems:
        raise UnsupportedModel("incomplete or mismatched weights: parameters " + "; parameters ".join(problems))
    if unexpected:
        log.warning("checkpoint parameters not used by %s%s: %s", arch.class_prefix, kind.class_suffix, unexpected)


def _resolve_directory(path: Path, config: PretrainedConfig) -> tuple[ArchitectureSupport, KindSupport]:
    architecture = (config.architectures or [type(config).__name__])[0]
    return resolve(architecture, config.model_type, sentence_transformers.is_embedding_directory(path))


def refuse_early(path: Path) -> None:
    """What the files alone refuse, before any weights load (the start-up preflight): a path that holds no model,
    and a directory whose config.json names an architecture outside the support matrix. A .gguf file names its
    architecture only once read, so load_model refuses it."""
    _require_model(path)
    if path.suffix != ".gguf":
        _resolve_directory(path, AutoConfig.from_pretrained(path))


def _modules(model: PreTrainedModel, steps: tuple[HeadStep, ...]) -> HeadModules:
    return tuple((model.get_submodule(step.module), step.sequence) for step in steps)


def _load_hf(path: Path, dtype: DType, device: Device) -> tuple[PreTrainedModel, ArchitectureSupport, KindSupport,
                                                               DTypeChoice]:
    config = AutoConfig.from_pretrained(path)
    arch, kind = _resolve_directory(path, config)
    architecture = (config.architectures or [type(config).__name__])[0]
    choice = choose_dtype(dtype, getattr(config, "dtype", None), detect_hardware(device))
    model, info = _AUTO_CLASS[kind.kind].from_pretrained(path, dtype=choice.dtype, output_loading_info=True)
    if type(model).__name__ != arch.class_prefix + kind.loaded_suffix:  # the auto class chose another class
        raise UnsupportedModel(f"{architecture} loaded as {type(model).__name__}; the checkpoint's own class is needed")
    _check_weights(info, arch, kind, model.base_model_prefix)
    return model, arch, kind, choice


class ModelNotFound(FileNotFoundError):
    """The model path holds no model: said plainly, with what is there, never as transformers' "Repo id must be in
    the form ..." (a path that does not exist is otherwise taken for a Hub repository id)."""


def _require_model(path: Path) -> None:
    if path.is_file() or (path / "config.json").is_file():
        return
    found = path
    while not found.is_dir() and found != found.parent:
        found = found.parent
    entries = sorted(entry.name for entry in found.iterdir())[:20] if found.is_dir() else []
    state = "has no config.json" if path.is_dir() else "does not exist"
    raise ModelNotFound(f"{path} {state}; {found} holds: {', '.join(entries) or 'nothing'}")


def load_model(path: Path, dtype: DType, device: str, name: str) -> ScoringModel:
    _require_model(path)
    device_kind = Device(device)
    if path.suffix == ".gguf":
        from scorekeeper_worker.model.files import load_gguf  # checks that every parameter was converted

        choice = choose_dtype(dtype, None, detect_hardware(device_kind))
        model, tokenizer = load_gguf(path, choice.dtype)
        arch, kind = resolve(type(model).__name__, model.config.model_type)
    else:
        model, arch, kind, choice = _load_hf(path, dtype, device_kind)
        tokenizer = AutoTokenizer.from_pretrained(path)
    model = model.to(device=device, dtype=choice.dtype).eval()
    model.requires_grad_(False)
    check_config(arch, model.config)
    tables = RopeTables()
    if arch.execution == Execution.PACKED:
        model.set_attn_implementation(ATTENTION_NAME)
        tables = install_packed_rotary(model)
    config = model.config
    trunk = model if kind.kind == ModelKind.EMBEDDING else model.base_model
    selects_rows = arch.execution == Execution.PACKED and install_row_selection(trunk, arch)
    offset = config.pad_token_id + 1 if arch.position_offset else 0
    if kind.kind == ModelKind.CAUSAL_LM:
        logit_size = model.get_output_embeddings().weight.shape[0]
    else:
        logit_size = getattr(config, "num_labels", 0)
    sentence_config = sentence_transformers.read(path, kind.kind, config, tokenizer)
    pooling = _pooling(config, kind, sentence_config)
    max_positions = config.max_position_embeddings - offset
    if sentence_config.max_seq_length is not None:  # sentence-transformers cuts every text there
        max_positions = min(max_positions, sentence_config.max_seq_length)
    specials = special_tokens(tokenizer)
    pair = pair_layout(tokenizer) if kind.kind == ModelKind.CROSS_ENCODER else None
    vocab = vocabulary(tokenizer, model.get_input_embeddings().num_embeddings)
    check_specials(vocab, specials, pair)
    log.info("loaded %s (%s, %s pooling) from %s; dtype %s (%s)", type(model).__name__, kind.kind, pooling, path,
             dtype_name(choice.dtype), choice.reason)
    return ScoringModel(
        name=name,
        kind=kind.kind,
        model=model,
        trunk=trunk,
        tokenizer=tokenizer,
        dtype=model.dtype,
        device=torch.device(device),
        hidden_size=config.hidden_size,
        logit_size=logit_size,
        max_positions=max_positions,
        position_start=offset,
        uses_token_types=getattr(config, "type_vocab_size", 0) > 1,
        pooling=pooling,
        specials=specials,
        support=arch,
        pre_head=_modules(model, kind.pre_head),
        head=_modules(model, kind.head),
        pair=pair,
        sentence_config=sentence_config,
        rope=tables,
        classifier_pad=config.pad_token_id if kind.kind == ModelKind.CLASSIFIER else None,
        selects_rows=selects_rows,
        vocabulary=vocab,
    )
