"""The original GPT family (OpenAI GPT-1): post-LN blocks, no final LayerNorm, learned positions, tied head.

HF config.json (OpenAIGPTConfig), weight names (tokens_embed / positions_embed are our wte /
wpe), the reference block and its ONNX graph, written with plain ops. See families.py for what
a family module supplies.
"""

from __future__ import annotations

from typing import Any

import torch

from gptedge.runtime.errors import CheckpointError

from .config import GPTConfig, positive_int
from .base import Family
from .graph_attention import AttentionWriter, PlainAttention
from .graph_ops import layer_norm, mlp
from .graph_writer import GraphWriter, Weights
from .layers import KV, BlockLayers

# HF afn -> ours: OpenAIGPT's "gelu" is the tanh approximation; it has no exact-erf GELU.
_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu"}
_TO_HF_ACTIVATIONS = {"gelu_tanh": "gelu", "relu": "relu"}


def config_from_hf(d: dict[str, Any]) -> GPTConfig:
    act = d.get("afn", "gelu")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"config.json: afn {act!r} is not supported")
    return GPTConfig(arch="openai-gpt", vocab_size=positive_int(d, "vocab_size", 40478),
                     n_positions=positive_int(d, "n_positions", 512), n_embd=positive_int(d, "n_embd", 768),
                     n_layer=positive_int(d, "n_layer", 12), n_head=positive_int(d, "n_head", 12),
                     activation=_ACTIVATIONS[act], layer_norm_epsilon=float(d.get("layer_norm_epsilon", 1e-5)),
                     bos_token_id=d.get("bos_token_id"), eos_token_id=d.get("eos_token_id"))


def config_to_hf(cfg: GPTConfig) -> dict[str, Any]:
    if cfg.activation not in _TO_HF_ACTIVATIONS:
        raise CheckpointError("config: openai-gpt has no exact-erf GELU in transformers")
    return {"model_type": "openai-gpt", "architectures": ["OpenAIGPTLMHeadModel"], "vocab_size": cfg.vocab_size,
            "n_positions": cfg.n_positions, "n_embd": cfg.n_embd, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
            "layer_norm_epsilon": cfg.layer_norm_epsilon, "afn": _TO_HF_ACTIVATIONS[cfg.activation],
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id}


class Block(BlockLayers):
    """n = ln_1(h + attn(h)), then ln_2(n + mlp(n))."""

    def forward(self, h: torch.Tensor, allowed: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        a, present = self.attn(h, allowed, past)  # (B, S, C)
        n = self.ln_1(h + a)
        return self.ln_2(n + self.mlp(n)), present


def attention_kinds(cfg: GPTConfig) -> tuple[type[AttentionWriter], ...]:
    # Fused attention would fit these blocks too, but has never been validated or measured on them.
    return (PlainAttention,)


def write_blocks(g: GraphWriter, h: str, w: Weights, cfg: GPTConfig, attention: AttentionWriter) -> str:
    """h (B, S, C) embeddings -> the last block's output (B, S, C)."""
    eps = cfg.layer_norm_epsilon
    for i in range(cfg.n_layer):
        n = layer_norm(g, g.one("Add", [h, attention(h, w, i)]), w, f"h.{i}.ln_1", eps)
        h = layer_norm(g, g.one("Add", [n, mlp(g, n, w, f"h.{i}.mlp", cfg.activation)]), w, f"h.{i}.ln_2", eps)
    return h


FAMILY = Family(arch="openai-gpt", hf_model_type="openai-gpt", config_from_hf=config_from_hf,
                config_to_hf=config_to_hf, weight_names=(("tokens_embed.", "wte."), ("positions_embed.", "wpe.")),
                block=Block, final_norm=False, attention_kinds=attention_kinds, write_blocks=write_blocks)
