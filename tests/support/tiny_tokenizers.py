"""Tokenizers for the tiny test models, built offline and deterministically from a fixed corpus.

- Decoders: byte-level BPE (any text encodes, no UNK) with the ChatML specials; optionally a BOS before every
  sequence (Llama, Gemma2, Mistral) and an EOS after it (the "eos" variants, like tokenizers configured with
  add_eos_token, e.g. some Gemma/Llama reward-model tokenizers).
- BERT-style encoders (BERT, ELECTRA, DeBERTa-v2): WordPiece, `[CLS] A [SEP] B [SEP]` with token types.
- RoBERTa-style encoders (RoBERTa, XLM-R): WordPiece with RoBERTa's ids and `<s> A </s></s> B </s>`, no token types.
- ModernBERT: byte-level BPE with `[CLS] A [SEP] B [SEP]` and no token types, like its real tokenizer.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

DECODER_MAX_POSITIONS = 2048
ENCODER_MAX_POSITIONS = 512

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
MODERNBERT_SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def corpus() -> list[str]:
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


def _byte_bpe_backend(specials: list[str], vocab_size: int = 300) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

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
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus(), trainer)
    return backend


def byte_bpe(bos: str | None, eos: bool = False, vocab_size: int = 300,
             added: tuple[str, ...] = ()) -> PreTrainedTokenizerBase:
    """Decoder tokenizer: ChatML specials, `bos` before each sequence, and with `eos` an `<|im_end|>` after it;
    `added`: tokens added after training, not special (like Qwen3's `<think>`, `</think>`)."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    eos_token = "<|im_end|>"
    backend = _byte_bpe_backend(CHATML_SPECIALS + ([bos] if bos else []), vocab_size)
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in added])
    # ByteLevel(trim_offsets=False) keeps offsets exact; the template adds BOS like Llama/Gemma tokenizers do.
    byte_level = processors.ByteLevel(trim_offsets=False)
    if bos or eos:
        parts = ([bos] if bos else []) + ["$A"] + ([eos_token] if eos else [])
        pair = parts + [part.replace("$A", "$B") + ":1" for part in parts]
        used = [t for t in (bos, eos_token if eos else None) if t]
        template = processors.TemplateProcessing(single=" ".join(parts), pair=" ".join(pair),
                                                 special_tokens=[(t, backend.token_to_id(t)) for t in used])
        backend.post_processor = processors.Sequence([byte_level, template])
    else:
        backend.post_processor = byte_level
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=eos_token,
        pad_token="<|endoftext|>",
        model_max_length=DECODER_MAX_POSITIONS,
    )
    tok.chat_template = CHATML_TEMPLATE
    return tok


def modernbert_bpe() -> PreTrainedTokenizerBase:
    """ModernBERT's tokenizer shape: byte-level BPE, `[CLS] A [SEP] B [SEP]`, inputs without token types."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    backend = _byte_bpe_backend(MODERNBERT_SPECIALS)
    ids = [(t, backend.token_to_id(t)) for t in ("[CLS]", "[SEP]")]
    backend.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=ids),
    ])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
        mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"],
        model_max_length=ENCODER_MAX_POSITIONS,
    )


def _wordpiece_vocab(specials: list[str], normalizer: Any, pre_tokenizer: Any, size: int = 300) -> dict[str, int]:
    """A WordPiece vocab built by hand: tokenizers' WordPieceTrainer orders the "##x" pieces by hash-set iteration,
    so its ids change from run to run. Specials, then every corpus character alone and as a "##" continuation, then
    the most frequent whole words (ties alphabetical) up to `size`."""
    words: collections.Counter[str] = collections.Counter()
    for line in corpus():
        words.update(word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line)))
    chars = sorted({c for word in words for c in word})
    tokens = specials + chars + [f"##{c}" for c in chars]
    tokens += [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if len(w) > 1][: size - len(tokens)]
    return {token: i for i, token in enumerate(tokens)}


def wordpiece(roberta_style: bool) -> PreTrainedTokenizerBase:
    """BERT-style (`[CLS]`, token types) or RoBERTa-style (`<s>`, pad id 1, doubled separator, no token types)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if not roberta_style:
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
    if not roberta_style:
        template = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1", special_tokens=ids
        )
        input_names = ["input_ids", "token_type_ids", "attention_mask"]
    else:  # a single token type; the pair template doubles the separator
        template = processors.TemplateProcessing(
            single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} {sep} $B {sep}", special_tokens=ids
        )
        input_names = ["input_ids", "attention_mask"]
    backend.post_processor = template
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=cls if roberta_style else None,
        eos_token=sep if roberta_style else None,
        cls_token=cls,
        sep_token=sep,
        pad_token=pad,
        unk_token=unk,
        mask_token=mask,
        model_input_names=input_names,
        model_max_length=ENCODER_MAX_POSITIONS,
    )


def sentencepiece(model: str) -> PreTrainedTokenizerBase:
    """SentencePiece-style tokenizers as transformers converts them: "unigram" (T5, XLM-R, ALBERT: Unigram over
    Metaspace words) or "bpe" (Llama, Mistral: a byte-fallback BPE over the whole text with spaces replaced by "▁" and
    one prepended, no pre-tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    if model == "unigram":
        backend = Tokenizer(models.Unigram())
        backend.normalizer = normalizers.NFKC()
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        trainer: Any = trainers.UnigramTrainer(vocab_size=400, special_tokens=specials, unk_token="<unk>",
                                               show_progress=False)
        backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    else:
        backend = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        # Trained over Metaspace words (SentencePiece never learns a piece across "▁"); served without a
        # pre-tokenizer, as transformers' Llama conversion does.
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
        trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials + [f"<0x{b:02X}>" for b in range(256)],
                                      show_progress=False)
        backend.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    backend.train_from_iterator(corpus(), trainer)
    if model == "bpe":
        backend.pre_tokenizer = None
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=ENCODER_MAX_POSITIONS)
