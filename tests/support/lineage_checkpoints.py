"""Tiny seeded checkpoints of GPT-2's descendants written by transformers (save_pretrained), for the parity
ladder: Llama-style (LlamaForCausalLM) and GPT-NeoX (GPTNeoXForCausalLM).

Each variant is its family's transformers config keywords. Norm weights and biases get seeded noise
(transformers initialises them to 1 and 0, which would hide a norm or a bias applied in the wrong place).
head_dim is 16 (32 for one): ONNX Runtime's rotary kernels want a multiple of 16. The tokenizer is the kind Llama
checkpoints ship: BPE over Metaspace pieces with byte fallback, <unk>/<s>/</s> special, a post-processor
that puts <s> first.
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 320  # the tokenizer's size: 3 specials + 256 byte tokens + pieces and merges
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
# name -> (family, its config overrides). Llama: GQA ratios 1 / 2 / 4, the three rope kinds, tied / untied,
# biases. GPT-NeoX: partial rotary (1/4, 1/2, whole), parallel and sequential residual, tied / untied.
VARIANTS = {
    "mha-untied": ("llama", dict(num_key_value_heads=4)),
    "gqa2-linear": ("llama", dict(num_key_value_heads=2, rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "gqa4-llama3": ("llama", dict(num_key_value_heads=1, rope_scaling=LLAMA3, rope_theta=500000.0)),
    "gqa2-tied-bias": ("llama", dict(num_key_value_heads=2, tie_word_embeddings=True, attention_bias=True,
                                     mlp_bias=True)),
    "neox-parallel": ("gpt_neox", dict(rotary_pct=0.25)),
    "neox-sequential-tied": ("gpt_neox", dict(rotary_pct=0.5, use_parallel_residual=False, tie_word_embeddings=True)),
    # head_dim 32, a rotary of 16 channels: partial rotary inside GroupQueryAttention (export/graph_rotary.py)
    "neox-partial-wide": ("gpt_neox", dict(num_attention_heads=2, rotary_pct=0.5)),
    "neox-whole-rotary-linear": ("gpt_neox", dict(rotary_pct=1.0, rope_scaling={"rope_type": "linear", "factor": 2.0},
                                                  hidden_act="gelu_new")),
    "qwen2-qkv-bias": ("qwen2", dict(num_key_value_heads=2)),  # q/k/v biases, none on o_proj
    "mistral-gqa4": ("mistral", dict(num_key_value_heads=1, sliding_window=4096)),  # a window wider than the context
    # (1 + w) RMSNorms, embeddings x sqrt(hidden), a tanh-GELU gate, one key/value head (Gemma 2B's MQA), tied
    "gemma-mqa": ("gemma", dict(num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)),
}


def _config(family: str, overrides: dict):
    import transformers

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=64, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                attn_implementation="eager")
    if family == "gpt_neox":
        base.update(layer_norm_eps=1e-5)
        base.update(overrides)
        return transformers.GPTNeoXForCausalLM, transformers.GPTNeoXConfig(**base)
    base.update(num_key_value_heads=2, rms_norm_eps=1e-5)
    base.update(overrides)
    name = {"llama": "Llama", "qwen2": "Qwen2", "mistral": "Mistral", "gemma": "Gemma"}[family]
    return getattr(transformers, f"{name}ForCausalLM"), getattr(transformers, f"{name}Config")(**base)


def variant_model(variant: str, seed: int = 0):
    """The variant's transformers model, seeded: the oracle every rung compares with."""
    import torch

    family, overrides = VARIANTS[variant]
    cls, config = _config(family, overrides)
    torch.manual_seed(seed)
    model = cls(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
    return model


def pieces() -> tuple[dict[str, int], list[tuple[str, str]]]:
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for ch in "▁abcdefghijklmnopqrstuvwxyz":
        vocab[ch] = len(vocab)
    merges = []
    for word in ("▁the", "▁and", "▁hello", "▁world", "▁it", "▁is", "▁in"):
        cur = word[0]
        for ch in word[1:]:
            merges.append((cur, ch))
            cur += ch
            vocab.setdefault(cur, len(vocab))
    return vocab, merges


def write_tokenizer(out: Path, add_bos: bool = True) -> None:
    """tokenizer.json (Metaspace + byte-fallback BPE, Llama's layout) and tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab, merges = pieces()
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    # Llama 2's tokenizer.json decoder: pieces' ▁ back to spaces, bytes to characters, the first space dropped
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    assert tok.get_vocab_size() <= VOCAB, tok.get_vocab_size()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"add_bos_token": add_bos, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizerFast"}), encoding="utf-8")


def write_variant_checkpoint(out: Path, variant: str = "gqa2-linear", seed: int = 0, tokenizer: bool = True,
                           eos: int | list[int] = 2) -> Path:
    """A variant saved by transformers (config.json, generation_config.json, model.safetensors) + tokenizer."""
    model = variant_model(variant, seed)
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    model.save_pretrained(out)
    if tokenizer:
        write_tokenizer(out)
    return out
