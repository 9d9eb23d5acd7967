"""The config keys each architecture's forward depends on, and the values the engine implements: unknown means
refused. Part of the support matrix (support.py lists the architectures; this, per `model_type`, their config
variations); `scripts/gen_support_matrix.py` renders both into docs/support-matrix.md.

A checkpoint whose config holds a listed key with a value outside its list is refused at load, naming the key, the
value and what is implemented: a RoPE type whose tables the engine does not reproduce, a position-embedding type
transformers 5 no longer implements (BERT's `relative_key`), an encoder configured as a decoder. Keys listed with
any value (`values` None) are recorded for the documentation: the engine implements every value (each is
exercised by the conformance suite, tests/conformance/)."""

from __future__ import annotations

from dataclasses import dataclass

from scorekeeper_worker.model.support import ArchitectureSupport, UnsupportedModel
from scorekeeper_worker.model.trunk_patches import SUPPORTED_ROPE_TYPES

Value = str | bool | int | float | None


@dataclass(frozen=True)
class ConfigKey:
    """`key`: a config attribute; `a.b` is key b of the dict a, `a.*.b` key b of every dict value of a (per layer
    type). `values`: those the engine implements (a list value: each element); None: any. `default`: what an
    absent key (or null) means."""

    key: str
    values: tuple[Value, ...] | None
    meaning: str
    default: Value = None


_ROPE = ConfigKey("rope_parameters.rope_type", SUPPORTED_ROPE_TYPES,
                  "the table of each sequence from its own length (longrope: short or long factors); never the "
                  "batch's longest position", "default")
_PAD_READ = ConfigKey("pad_token_id", None, "classifiers read the last token that is not pad_token_id, as "
                      "transformers' `*ForSequenceClassification` (pad = EOS included); none: the last token")
_LAYER_TYPES = ConfigKey("layer_types", ("full_attention", "sliding_attention"),
                         "per layer: full causal attention, or the sliding window")
_SLIDING = ConfigKey("sliding_window", None, "causal window of the sliding layers, from position ids")
_DECODER = (_ROPE, _PAD_READ)
_ABSOLUTE = ConfigKey("position_embedding_type", ("absolute",),
                      "learned absolute positions (transformers 5 implements no other type)", "absolute")
_ENCODER = (_ABSOLUTE, ConfigKey("is_decoder", (False,), "bidirectional attention", False),
            ConfigKey("add_cross_attention", (False,), "no cross-attention", False))
_ROBERTA_POSITIONS = ConfigKey("pad_token_id", None, "position ids from the ids: pad_token_id + 1 onwards; a pad "
                               "token inside a text takes pad_token_id and does not advance them")

CONFIG_KEYS: dict[str, tuple[ConfigKey, ...]] = {
    "qwen2": (*_DECODER, ConfigKey("use_sliding_window", None, "whether layers past max_window_layers slide"),
              _SLIDING, ConfigKey("max_window_layers", None, "the first sliding layer"), _LAYER_TYPES),
    "qwen3": (*_DECODER, ConfigKey("use_sliding_window", None, "whether layers past max_window_layers slide"),
              _SLIDING, ConfigKey("max_window_layers", None, "the first sliding layer"), _LAYER_TYPES),
    "llama": _DECODER,
    "mistral": (*_DECODER, _SLIDING),
    "gemma2": (*_DECODER, _SLIDING, _LAYER_TYPES,
               ConfigKey("attn_logit_softcapping", None, "attention logits soft-capped (explicit float32 path)"),
               ConfigKey("final_logit_softcapping", None, "causal LM logits soft-capped before the label scores"),
               ConfigKey("use_bidirectional_attention", (False,), "causal attention", False)),
    "bert": _ENCODER,
    "roberta": (*_ENCODER, _ROBERTA_POSITIONS),
    "xlm-roberta": (*_ENCODER, _ROBERTA_POSITIONS),
    "electra": _ENCODER,
    "modernbert": (ConfigKey("rope_parameters.*.rope_type", ("default",), "plain RoPE per layer type", "default"),
                   ConfigKey("layer_types", ("full_attention", "sliding_attention"),
                             "global layers, or the symmetric local window"),
                   ConfigKey("local_attention", None, "the local window (half of it on each side)"),
                   ConfigKey("classifier_pooling", ("cls", "mean"), "cross-encoders: the head reads the first token "
                             "or the mean", "cls")),
    "deberta-v2": (ConfigKey("position_biased_input", None, "the model's own embeddings and attention (padded "
                             "execution)"),
                   ConfigKey("relative_attention", None, "the model's own disentangled attention"),
                   ConfigKey("pos_att_type", None, "the model's own disentangled attention"),
                   ConfigKey("position_buckets", None, "the model's own relative position buckets")),
}


def _values(config: object, path: list[str]) -> list[object]:
    """The values at a dotted path (`*`: every dict value); an absent key gives None."""
    if not path:
        return [config]
    head, rest = path[0], path[1:]
    if isinstance(config, dict):
        if head == "*":
            return [v for value in config.values() if isinstance(value, dict) for v in _values(value, rest)]
        return _values(config.get(head), rest)
    return _values(getattr(config, head, None), rest)


def _implemented(value: object, key: ConfigKey) -> bool:
    assert key.values is not None
    value = key.default if value is None else value
    if isinstance(value, list | tuple):
        return all(v in key.values for v in value)
    return value in key.values


def check_config(arch: ArchitectureSupport, config: object) -> None:
    """Refuse a checkpoint whose config holds a value the engine does not implement, naming the key."""
    for key in CONFIG_KEYS[arch.model_type]:
        if key.values is None:
            continue
        for value in _values(config, key.key.split(".")):
            if not _implemented(value, key):
                raise UnsupportedModel(
                    f"config key {key.key} = {value!r} is not implemented by the engine for {arch.model_type} "
                    f"(implemented: {', '.join(repr(v) for v in key.values)}); it would score differently from "
                    "transformers, so the model is refused (docs/support-matrix.md)")
