"""The Gemma family (transformers' GemmaForCausalLM, model_type "gemma": Gemma 1 / 1.1 2B, CodeGemma 2B): the
Llama-style decoder (llama.py) with three differences, each written here:
- RMSNorm multiplies by (1 + w): checkpoints store w (zeros at initialisation). The reference keeps w and adds 1
  in its forward, as transformers does; the graph's norm initializers hold 1 + w, so the graph is Llama's
  (SimplifiedLayerNormalization / its Skip form on kv_buffer) and every tool reading gammas (AWQ's fold) sees the
  scale that is applied.
- The token embeddings are multiplied by sqrt(hidden_size) before the first block (`Family.embedding_scale`); the
  tied LM head reads the unscaled table.
- The MLP's gate is a GELU, not a SiLU: config.json's hidden_act as transformers' GemmaMLP reads it
  ("gelu_pytorch_tanh": the tanh form; "gelu": the exact one).
The head is tied unless config.json unties it. Gemma 7B's head_dim (256 x 16 heads over hidden 3,072) is not
hidden / heads and is refused by llama.py's config; Gemma 2 and 3 (soft-capping, sliding windows, more norms) are
other model types.
"""

from __future__ import annotations

import dataclasses
import math
from collections import ChainMap
from typing import Any

import numpy as np
import torch

from gptedge.runtime.errors import CheckpointError

from . import llama
from .config import GPTConfig
from .graph_attention import AttentionWriter
from .graph_ops import activation as write_activation
from .graph_rotary import rms_norm
from .graph_writer import GraphWriter, Weights
from .layers import activation

# config.json hidden_act -> GPTConfig.activation (transformers' ACT2FN names)
_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu_erf"}
_TO_HF = {"gelu_tanh": "gelu_pytorch_tanh", "gelu_erf": "gelu"}


def config_from_hf(d: dict[str, Any]) -> llama.LlamaConfig:
    act = d.get("hidden_act", "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"config.json: hidden_act={act!r} is not supported (one of {', '.join(_ACTIVATIONS)})")
    tied = d.get("tie_word_embeddings", True)  # GemmaConfig's default, unlike Llama's
    cfg = llama.config_from_hf({**d, "hidden_act": "silu", "tie_word_embeddings": tied}, arch="gemma")
    return dataclasses.replace(cfg, activation=_ACTIVATIONS[act])


def config_to_hf(cfg: GPTConfig) -> dict[str, Any]:
    assert isinstance(cfg, llama.LlamaConfig)
    d = llama.config_to_hf(dataclasses.replace(cfg, arch="llama", activation="silu"))
    return {**d, "model_type": "gemma", "architectures": ["GemmaForCausalLM"], "hidden_act": _TO_HF[cfg.activation]}


def embedding_scale(cfg: GPTConfig) -> float:
    return math.sqrt(cfg.n_embd)


class RMSNorm(llama.RMSNorm):
    """(1 + w) x / sqrt(mean(x^2) + eps): the checkpoint's w, one added here (transformers' GemmaRMSNorm)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (1.0 + self.weight) * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class MLP(llama.MLP):
    """down(gelu(gate(x)) * up(x))."""

    def __init__(self, cfg: llama.LlamaConfig):
        super().__init__(cfg)
        self.kind = cfg.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(activation(self.gate_proj(x), self.kind) * self.up_proj(x))


class Block(llama.Block):
    def __init__(self, cfg: llama.LlamaConfig):
        super().__init__(cfg)
        self.input_layernorm, self.post_attention_layernorm, self.mlp = RMSNorm(cfg), RMSNorm(cfg), MLP(cfg)


def _shifted(w: Weights) -> Weights:
    """The norms' w as the graph applies them, 1 + w (B, S, C scaled per channel); every other weight as is."""
    return ChainMap({k: v + np.float32(1.0) for k, v in w.items()
                     if k.endswith(("layernorm.weight", "ln_f.weight"))}, w)  # type: ignore[return-value]


def write_norm(g: GraphWriter, x: str, w: Weights, prefix: str, cfg: GPTConfig) -> str:
    return rms_norm(g, x, _shifted(w), prefix, cfg.layer_norm_epsilon)


def write_blocks(g: GraphWriter, h: str, w: Weights, cfg: GPTConfig, attention: AttentionWriter) -> str:
    return llama.write_blocks(g, h, _shifted(w), cfg, attention,
                              gate=lambda g, x, name: write_activation(g, x, cfg.activation))


FAMILY = dataclasses.replace(llama.FAMILY, arch="gemma", hf_model_type="gemma", config_from_hf=config_from_hf,
                             config_to_hf=config_to_hf, block=Block, norm=RMSNorm, write_norm=write_norm,
                             write_blocks=write_blocks, embedding_scale=embedding_scale)
