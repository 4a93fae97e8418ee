"""The GPT-2 family: pre-LN blocks, a final LayerNorm, learned positions, tied LM head.

HF config.json (GPT2Config), weight names (HF's own, after the `transformer.` prefix), the
reference block and its ONNX graph, written with plain ops, MultiHeadAttention or (kv_buffer)
GroupQueryAttention. See families.py for what a family module supplies.
"""

from __future__ import annotations

from typing import Any

import torch

from gptedge.runtime.errors import CheckpointError

from .config import GPTConfig, positive_int
from .base import Family
from .graph_attention import AttentionWriter, GroupQueryAttention, MultiHeadAttention, PlainAttention
from .graph_ops import layer_norm, mlp
from .graph_writer import GraphWriter, Weights
from .layers import KV, BlockLayers

# HF activation_function -> ours. "gelu_new" is the tanh approximation, "gelu" the exact erf.
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_erf", "relu": "relu"}
_TO_HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu_erf": "gelu", "relu": "relu"}
# Fields gptedge's reference does not implement, with the only value it accepts.
_FIXED = (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
          ("add_cross_attention", False), ("tie_word_embeddings", True))


def config_from_hf(d: dict[str, Any]) -> GPTConfig:
    act = d.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"config.json: activation_function {act!r} is not supported")
    for name, ok in _FIXED:
        if d.get(name, ok) != ok:
            raise CheckpointError(f"config.json: {name}={d[name]!r} is not supported")
    return GPTConfig(arch="gpt2", vocab_size=positive_int(d, "vocab_size", 50257),
                     n_positions=positive_int(d, "n_positions", 1024), n_embd=positive_int(d, "n_embd", 768),
                     n_layer=positive_int(d, "n_layer", 12), n_head=positive_int(d, "n_head", 12),
                     n_inner=d.get("n_inner"), activation=_ACTIVATIONS[act],
                     layer_norm_epsilon=float(d.get("layer_norm_epsilon", 1e-5)),
                     bos_token_id=d.get("bos_token_id", 50256), eos_token_id=d.get("eos_token_id", 50256))


def config_to_hf(cfg: GPTConfig) -> dict[str, Any]:
    return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": cfg.vocab_size,
            "n_positions": cfg.n_positions, "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "layer_norm_epsilon": cfg.layer_norm_epsilon, "n_inner": cfg.n_inner,
            "activation_function": _TO_HF_ACTIVATIONS[cfg.activation], "bos_token_id": cfg.bos_token_id,
            "eos_token_id": cfg.eos_token_id, "tie_word_embeddings": True, "use_cache": True}


class Block(BlockLayers):
    """h + attn(ln_1(h)), then h + mlp(ln_2(h))."""

    def forward(self, h: torch.Tensor, allowed: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        a, present = self.attn(self.ln_1(h), allowed, past)  # (B, S, C)
        h = h + a
        return h + self.mlp(self.ln_2(h)), present


def attention_kinds(cfg: GPTConfig) -> tuple[type[AttentionWriter], ...]:
    # ONNX Runtime's kernels come as a set, fused attention with FastGelu (the tanh GELU and its bias
    # in one op): other activations are written with plain ops throughout.
    if cfg.activation != "gelu_tanh":
        return (PlainAttention,)
    return (PlainAttention, MultiHeadAttention, GroupQueryAttention)


def write_blocks(g: GraphWriter, h: str, w: Weights, cfg: GPTConfig, attention: AttentionWriter) -> str:
    """h (B, S, C) embeddings -> the last block's output (B, S, C), before ln_f.

    Each residual Add and the LayerNorm after it stay two plain ops: ONNX Runtime 1.31's CPU
    SkipLayerNormalization is 2.8x slower than Add + LayerNormalization at 512 positions (1.96 vs
    0.71 ms) and no faster at one: a 512-token int8 prefill is ~10 % faster."""
    eps = cfg.layer_norm_epsilon
    x = layer_norm(g, h, w, "h.0.ln_1", eps)
    for i in range(cfg.n_layer):
        h = g.one("Add", [h, attention(x, w, i)], name=f"h.{i}.attn.residual")
        x = layer_norm(g, h, w, f"h.{i}.ln_2", eps)
        h = g.one("Add", [h, mlp(g, x, w, f"h.{i}.mlp", cfg.activation, fast_gelu=attention.contrib)],
                  name=f"h.{i}.mlp.residual")
        if i + 1 < cfg.n_layer:
            x = layer_norm(g, h, w, f"h.{i + 1}.ln_1", eps)
    return h


FAMILY = Family(arch="gpt2", hf_model_type="gpt2", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                weight_names=(), block=Block, final_norm=True, attention_kinds=attention_kinds,
                write_blocks=write_blocks)
