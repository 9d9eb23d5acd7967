"""Tiny random models + tokenizers for tests, built offline from configs.

Every model is deterministic (fixed seeds; byte-level BPE trained on a fixed corpus, WordPiece vocab built from it by
hand), small enough to build in a fraction of a second, and saved with `save_pretrained` so that it reloads through
`AutoTokenizer` + `AutoModelFor...` exactly like a hub checkpoint would. The server detects the model kind from
`config.architectures`, which `save_pretrained` fills with the class name (see `TinySpec.architecture`).

    from tiny_models import ALL_TINY_MODELS, SPECS, build
    path = build("qwen3-cls3", tmp_dir)            # -> tmp_dir / "qwen3-cls3"

Design choices that matter for the tests built on top:
- Decoder tokenizers are byte-level BPE (any text encodes, no UNK) with the ChatML specials. Llama and Gemma2 add a
  BOS token to single sequences (and before each sequence of a pair, like the real Llama/Gemma tokenizers) so that
  BOS handling gets exercised; the Qwen tokenizers add nothing.
- `initializer_range` is raised from 0.02 to 0.2 so that scores vary by O(0.1-1) across inputs and positions: with
  the default, the tiny BERT cross-encoder's scores for different texts differ by ~1e-4, so a wrong pooling position
  or mask could hide inside test tolerances.
- Decoders get max_position_embeddings=2048 (multi-item scoring packs hundreds of items into one sequence); BERT 512,
  XLM-R 512 + 2 (RoBERTa positions start after padding_idx=1).
- Gemma2 keeps its real attention logit softcapping (50.0). Note: transformers 5.18's default "sdpa" attention silently
  ignores softcapping, "eager" and "flex_attention" apply it.
"""

from __future__ import annotations

import collections
import enum
import json
import os
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    LLAMA_CAUSAL = "llama-causal"
    BERT_CROSS = "bert-cross"
    XLMR_CROSS = "xlmr-cross"
    BERT_EMBED = "bert-embed"


@dataclass(frozen=True)
class TinySpec:
    family: str  # "qwen3" | "qwen2" | "llama" | "gemma2" | "mistral" | "bert" | "xlmr"
    kind: str  # "classifier" | "causal_lm" | "embedding" (reward models are classifiers with num_labels=1)
    architecture: str  # what config.architectures[0] will be after save_pretrained
    num_labels: int | None  # None for causal LMs and embedding models
    adds_bos: bool  # whether tokenizer(text) puts a BOS / CLS token in front


SPECS: dict[TinyModel, TinySpec] = {
    TinyModel.QWEN3_CLS3: TinySpec("qwen3", "classifier", "Qwen3ForSequenceClassification", 3, False),
    TinyModel.QWEN3_REWARD: TinySpec("qwen3", "classifier", "Qwen3ForSequenceClassification", 1, False),
    TinyModel.QWEN2_CLS3: TinySpec("qwen2", "classifier", "Qwen2ForSequenceClassification", 3, False),
    TinyModel.QWEN2_REWARD: TinySpec("qwen2", "classifier", "Qwen2ForSequenceClassification", 1, False),
    TinyModel.LLAMA_CLS3: TinySpec("llama", "classifier", "LlamaForSequenceClassification", 3, True),
    TinyModel.LLAMA_REWARD: TinySpec("llama", "classifier", "LlamaForSequenceClassification", 1, True),
    TinyModel.GEMMA2_CLS3: TinySpec("gemma2", "classifier", "Gemma2ForSequenceClassification", 3, True),
    TinyModel.GEMMA2_REWARD: TinySpec("gemma2", "classifier", "Gemma2ForSequenceClassification", 1, True),
    TinyModel.MISTRAL_CLS3: TinySpec("mistral", "classifier", "MistralForSequenceClassification", 3, True),
    TinyModel.QWEN3_CAUSAL: TinySpec("qwen3", "causal_lm", "Qwen3ForCausalLM", None, False),
    TinyModel.LLAMA_CAUSAL: TinySpec("llama", "causal_lm", "LlamaForCausalLM", None, True),
    TinyModel.BERT_CROSS: TinySpec("bert", "classifier", "BertForSequenceClassification", 1, True),
    TinyModel.XLMR_CROSS: TinySpec("xlmr", "classifier", "XLMRobertaForSequenceClassification", 1, True),
    TinyModel.BERT_EMBED: TinySpec("bert", "embedding", "BertModel", None, True),
}

ALL_TINY_MODELS: list[TinyModel] = list(TinyModel)

SEED = 1234
INIT_RANGE = 0.2
DECODER_MAX_POSITIONS = 2048
BERT_MAX_POSITIONS = 512
CLS3_LABELS = {0: "negative", 1: "neutral", 2: "positive"}

# ChatML specials, in the order Qwen uses (ids 0, 1, 2 in the trained vocab).
CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# transformers.models.qwen2.tokenization_qwen2.PRETOKENIZE_REGEX (Qwen2/2.5/3)
QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# The BOS token each family's tokenizer prepends (None: adds nothing), spelled like the real tokenizers.
DECODER_BOS = {"qwen3": None, "qwen2": None, "llama": "<|begin_of_text|>", "gemma2": "<bos>", "mistral": "<s>"}
# Mistral's window is far below the longest test sequences, so sliding-window masking is really exercised.
MISTRAL_SLIDING_WINDOW = 24


def _corpus() -> list[str]:
    """A fixed, varied corpus (~140 lines) so that the vocabularies cover everyday test strings in few tokens."""
    subjects = ["Paris", "Berlin", "Sacramento", "Los Angeles", "the model", "a banana", "my dog", "the server"]
    facts = [
        "is the capital of France.",
        "is a large city in California.",
        "is the capital of California.",
        "scores every item in the batch.",
        "likes to run in the park.",
        "is yellow and sweet.",
        "answers yes or no.",
        "returns a list of numbers.",
    ]
    questions = [
        "What is the capital of France?",
        "What is the capital of California?",
        "Is this review positive or negative?",
        "How many people live in Berlin?",
        "How do I sort a list in Python?",
        "Answer with yes or no:",
        "I pledge allegiance to the flag.",
        "The quick brown fox jumps over the lazy dog.",
    ]
    lines = [f"{s} {f}" for s in subjects for f in facts]
    lines += [f"{q} {s.capitalize()} {f}" for q in questions for s, f in zip(subjects, facts, strict=True)]
    lines += ["Yes", "No", "yes", "no", "true", "false", "0 1 2 3 4 5 6 7 8 9 10 100 1000", "Hello world!"]
    lines += ["Ünïcödé, émojis 🙂 and ümlauts: straße, naïve, café.", "def f(x): return [x * 2 for x in range(10)]"]
    return lines


def _train_byte_bpe(bos: str | None) -> PreTrainedTokenizerBase:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = CHATML_SPECIALS + ([bos] if bos else [])
    backend = Tokenizer(models.BPE())
    # Exactly the normalizer + pre-tokenizer that transformers' Qwen2Tokenizer builds: for model_type "qwen2"
    # AutoTokenizer ignores tokenizer_class and rebuilds the tokenizer from vocab + merges, and the result must
    # equal the saved tokenizer.json (a server may load that file directly with the `tokenizers` library).
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer)
    # ByteLevel(trim_offsets=False) keeps offsets exact; the template adds BOS like Llama/Gemma tokenizers do.
    byte_level = processors.ByteLevel(trim_offsets=False)
    if bos:
        template = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos}:1 $B:1", special_tokens=[(bos, backend.token_to_id(bos))]
        )
        backend.post_processor = processors.Sequence([byte_level, template])
    else:
        backend.post_processor = byte_level
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=DECODER_MAX_POSITIONS,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def _wordpiece_vocab(specials: list[str], normalizer: Any, pre_tokenizer: Any, size: int = 300) -> dict[str, int]:
    """A WordPiece vocab built by hand: tokenizers' WordPieceTrainer orders the "##x" pieces by hash-set iteration,
    so its ids change from run to run. Specials, then every corpus character alone and as a "##" continuation, then
    the most frequent whole words (ties alphabetical) up to `size`."""
    words: collections.Counter[str] = collections.Counter()
    for line in _corpus():
        words.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)))
    chars = sorted({c for word in words for c in word})
    tokens = specials + chars + [f"##{c}" for c in chars]
    tokens += [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if len(w) > 1][: size - len(tokens)]
    return {token: i for i, token in enumerate(tokens)}


def _make_wordpiece(family: str) -> PreTrainedTokenizerBase:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if family == "bert":
        cls, sep, pad, unk, mask = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"
        specials = [pad, unk, cls, sep, mask]
    else:  # XLM-R spelling and ids: <s>=0, <pad>=1 (= padding_idx of the position embeddings), </s>=2, <unk>=3
        cls, sep, pad, unk, mask = "<s>", "</s>", "<pad>", "<unk>", "<mask>"
        specials = [cls, pad, sep, unk, mask]
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend = Tokenizer(models.WordPiece(vocab=_wordpiece_vocab(specials, normalizer, pre_tokenizer), unk_token=unk))
    backend.normalizer = normalizer
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.WordPiece()
    ids = [(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))]
    if family == "bert":
        template = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=ids
        )
        input_names = ["input_ids", "token_type_ids", "attention_mask"]
    else:  # XLM-R has a single token type; its pair template doubles the separator
        template = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}", special_tokens=ids
        )
        input_names = ["input_ids", "attention_mask"]
    backend.post_processor = template
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=cls if family == "xlmr" else None,
        eos_token=sep if family == "xlmr" else None,
        cls_token=cls,
        sep_token=sep,
        pad_token=pad,
        unk_token=unk,
        mask_token=mask,
        model_input_names=input_names,
        model_max_length=BERT_MAX_POSITIONS,
    )


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


def _encoder_config(family: str, tok: PreTrainedTokenizerBase, num_labels: int | None) -> Any:
    from transformers import BertConfig, XLMRobertaConfig

    common: dict[str, Any] = {
        "vocab_size": len(tok),
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "initializer_range": INIT_RANGE,
        "pad_token_id": tok.pad_token_id,
    }
    if num_labels is not None:
        common["num_labels"] = num_labels
    if family == "bert":
        return BertConfig(max_position_embeddings=BERT_MAX_POSITIONS, type_vocab_size=2, **common)
    # RoBERTa position ids start at padding_idx + 1 = 2, hence the +2.
    return XLMRobertaConfig(
        max_position_embeddings=BERT_MAX_POSITIONS + 2,
        type_vocab_size=1,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        **common,
    )


def _make_model(spec: TinySpec, config: Any) -> PreTrainedModel:
    import transformers

    cls = getattr(transformers, spec.architecture)
    model = cls(config)
    return model.eval()


def _write_sentence_transformers_files(out: Path, dim: int) -> None:
    """The files that make sentence-transformers (and our server) treat a BertModel dir as a mean-pooling bi-encoder."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    pooling = {
        "word_embedding_dimension": dim,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True,
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": BERT_MAX_POSITIONS, "do_lower_case": False})
    )


def _save(name: TinyModel, out: Path) -> None:
    import torch

    spec = SPECS[name]
    if spec.family in DECODER_BOS:
        tok = _train_byte_bpe(DECODER_BOS[spec.family])
        config = _decoder_config(spec.family, tok, spec.num_labels)
    else:
        tok = _make_wordpiece(spec.family)
        config = _encoder_config(spec.family, tok, spec.num_labels)
    # A seed derived from the name (not the list position), so adding a model never changes the others' weights.
    torch.manual_seed(SEED + zlib.crc32(name.value.encode()))
    model = _make_model(spec, config)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    if spec.kind == "embedding":
        _write_sentence_transformers_files(out, config.hidden_size)


def build(name: TinyModel | str, out_dir: Path | str) -> Path:
    """Build the tiny model `name` into `out_dir / name` and return that directory.

    Reuses an existing complete build (the output is deterministic); writes to a temporary sibling directory first and
    renames it, so a crashed or concurrent build never leaves a half-written model behind.
    """
    name = TinyModel(name)
    target = Path(out_dir) / name.value
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name.value}-", dir=target.parent))
    try:
        _save(name, tmp)
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


def build_all(out_dir: Path | str) -> dict[TinyModel, Path]:
    """Build every tiny model under `out_dir` (~ a few seconds in total)."""
    return {name: build(name, out_dir) for name in ALL_TINY_MODELS}


if __name__ == "__main__":
    import sys

    for model_name, path in build_all(sys.argv[1] if len(sys.argv) > 1 else "tiny-models").items():
        print(f"{model_name}\t{path}")
