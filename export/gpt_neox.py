"""The GPT-NeoX family (transformers' GPTNeoXForCausalLM, model_type "gpt_neox": Pythia): pre-LN blocks with
LayerNorms (biases), rotary positions on the first rotary_pct of each head, a fused QKV with biases laid out
per head, a GELU MLP, an optional parallel residual (h + attn(ln_1 h) + mlp(ln_2 h)) and an untied embed_out.

Its graph reuses the rotary writers (graph_rotary.py) with NeoX's projections: the fused per-head
query_key_value weight is regrouped at export into one packed q | k | v linear (rows moved, no arithmetic).
See base.py for what a family module supplies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from gptedge.runtime.errors import CheckpointError

from .base import Family
from .graph_writer import Weights
from .config import GPTConfig, positive_int
from .graph_attention import AttentionWriter
from .graph_ops import activation as write_activation
from .graph_ops import layer_norm
from .graph_rotary import RotaryGroupQueryAttention, RotaryPlainAttention, dense
from .graph_writer import GraphWriter
from .layers import KV, activation
from .rotary import cos_sin, inv_freq, rope_scaling, rotate

_ACTIVATIONS = {"gelu": "gelu_erf", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
_TO_HF_ACTIVATIONS = {"gelu_erf": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


@dataclass(frozen=True)
class NeoXConfig(GPTConfig):
    rotary_pct: float = 0.25
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    parallel_residual: bool = True
    tie_word_embeddings: bool = False
    attention_bias: bool = True

    @property
    def tied_head(self) -> bool:
        return self.tie_word_embeddings

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.rotary_pct)


def config_from_hf(d: dict[str, Any]) -> NeoXConfig:
    act = d.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"config.json: hidden_act {act!r} is not supported")
    pct = d.get("rotary_pct", d.get("partial_rotary_factor", 0.25))
    if not isinstance(pct, (int, float)) or not 0 < pct <= 1:
        raise CheckpointError(f"config.json: rotary_pct={pct!r} is not in (0, 1]")
    cfg = NeoXConfig(arch="gpt_neox", vocab_size=positive_int(d, "vocab_size", 50432),
                     n_positions=positive_int(d, "max_position_embeddings", 2048),
                     n_embd=positive_int(d, "hidden_size", 6144), n_layer=positive_int(d, "num_hidden_layers", 44),
                     n_head=positive_int(d, "num_attention_heads", 64),
                     n_inner=positive_int(d, "intermediate_size", 24576), activation=_ACTIVATIONS[act],
                     layer_norm_epsilon=float(d.get("layer_norm_eps", 1e-5)), bos_token_id=d.get("bos_token_id", 0),
                     eos_token_id=d.get("eos_token_id", 2), rotary_pct=float(pct),
                     rope_theta=float(d.get("rope_theta", d.get("rotary_emb_base", 10000))),
                     rope_scaling=rope_scaling(d.get("rope_scaling")),
                     parallel_residual=bool(d.get("use_parallel_residual", True)),
                     tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                     attention_bias=bool(d.get("attention_bias", True)))
    if cfg.rotary_dim % 2:
        raise CheckpointError(f"config.json: rotary_pct {pct} gives an odd rotary width {cfg.rotary_dim}")
    return cfg


def config_to_hf(cfg: GPTConfig) -> dict[str, Any]:
    assert isinstance(cfg, NeoXConfig)
    return {"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"], "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.n_positions, "hidden_size": cfg.n_embd, "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head, "intermediate_size": cfg.mlp_dim,
            "hidden_act": _TO_HF_ACTIVATIONS[cfg.activation], "layer_norm_eps": cfg.layer_norm_epsilon,
            "rotary_pct": cfg.rotary_pct, "rotary_emb_base": cfg.rope_theta, "rope_theta": cfg.rope_theta,
            "rope_scaling": dict(cfg.rope_scaling) or None, "use_parallel_residual": cfg.parallel_residual,
            "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "use_cache": True}


class Attention(nn.Module):
    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.cfg, self.n_head, self.head_dim = cfg, cfg.n_head, cfg.head_dim
        self.query_key_value = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.attention_bias)
        self.dense = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.attention_bias)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: KV | None,
                position_ids: torch.Tensor) -> tuple[torch.Tensor, KV]:
        B, S, C = x.shape
        # per head [q | k | v]: (B, nh, S, 3 hs) -> three (B, nh, S, hs)
        q, k, v = self.query_key_value(x).view(B, S, self.n_head, 3 * self.head_dim).transpose(1, 2).chunk(3, dim=-1)
        cos, sin = cos_sin(inv_freq(self.cfg.rotary_dim, self.cfg.rope_theta, self.cfg.rope_scaling), position_ids)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        scores = (q @ k.transpose(-2, -1)) * self.head_dim ** -0.5  # (B, nh, S, T), transformers' scaling
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, S, C)
        return self.dense(y), (k.contiguous(), v.contiguous())


class MLP(nn.Module):
    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.dense_h_to_4h = nn.Linear(cfg.n_embd, cfg.mlp_dim)
        self.dense_4h_to_h = nn.Linear(cfg.mlp_dim, cfg.n_embd)
        self.kind = cfg.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense_4h_to_h(activation(self.dense_h_to_4h(x), self.kind))


class Block(nn.Module):
    """Parallel: h + attn(input_layernorm(h)) + mlp(post_attention_layernorm(h)); sequential: GPT-2's order."""

    def __init__(self, cfg: NeoXConfig):
        super().__init__()
        self.parallel = cfg.parallel_residual
        self.input_layernorm = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.post_attention_layernorm = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attention = Attention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, allowed: torch.Tensor, past: KV | None,
                position_ids: torch.Tensor) -> tuple[torch.Tensor, KV]:
        a, present = self.attention(self.input_layernorm(h), allowed, past, position_ids)
        if self.parallel:
            return self.mlp(self.post_attention_layernorm(h)) + a + h, present
        h = a + h
        return self.mlp(self.post_attention_layernorm(h)) + h, present


class _NeoXProjections:
    """NeoX's fused per-head QKV as one packed q | k | v linear: rows (nh, 3, hs, C) regrouped to (3, nh, hs, C)."""

    n_head: int
    head_dim: int

    def qkv_name(self, i: int) -> str:
        return f"h.{i}.attention.qkv"

    def packed_qkv(self, w: Weights, i: int) -> Weights:
        p, name = f"h.{i}.attention", self.qkv_name(i)
        rows = w[f"{p}.query_key_value.weight"]
        packed = {f"{name}.weight": np.ascontiguousarray(
            rows.reshape(self.n_head, 3, self.head_dim, -1).transpose(1, 0, 2, 3).reshape(rows.shape))}
        bias = w.get(f"{p}.query_key_value.bias")
        if bias is not None:
            packed[f"{name}.bias"] = np.ascontiguousarray(
                bias.reshape(self.n_head, 3, self.head_dim).transpose(1, 0, 2).reshape(-1))
        return packed

    def output(self, g: GraphWriter, y: str, w: Weights, i: int) -> str:
        return dense(g, y, w, f"h.{i}.attention.dense")


class NeoXPlainAttention(_NeoXProjections, RotaryPlainAttention):
    pass


class NeoXGroupQueryAttention(_NeoXProjections, RotaryGroupQueryAttention):
    pass


def attention_kinds(cfg: GPTConfig) -> tuple[type[AttentionWriter], ...]:
    return (NeoXPlainAttention, NeoXGroupQueryAttention)


def write_blocks(g: GraphWriter, h: str, w: Weights, cfg: GPTConfig, attention: AttentionWriter) -> str:
    assert isinstance(cfg, NeoXConfig)
    eps = cfg.layer_norm_epsilon

    def mlp(x: str, p: str) -> str:
        up = write_activation(g, dense(g, x, w, f"{p}.mlp.dense_h_to_4h"), cfg.activation)
        return dense(g, up, w, f"{p}.mlp.dense_4h_to_h")

    for i in range(cfg.n_layer):
        p = f"h.{i}"
        a = attention(layer_norm(g, h, w, f"{p}.input_layernorm", eps), w, i)
        if cfg.parallel_residual:
            m = mlp(layer_norm(g, h, w, f"{p}.post_attention_layernorm", eps), p)
            h = g.one("Add", [g.one("Add", [m, a]), h], name=f"{p}.residual")
        else:
            h = g.one("Add", [a, h], name=f"{p}.attn.residual")
            h = g.one("Add", [mlp(layer_norm(g, h, w, f"{p}.post_attention_layernorm", eps), p), h],
                      name=f"{p}.mlp.residual")
    return h


FAMILY = Family(arch="gpt_neox", hf_model_type="gpt_neox", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                weight_names=(("gpt_neox.embed_in.", "wte."), ("gpt_neox.layers.", "h."),
                              ("gpt_neox.final_layer_norm.", "ln_f."), ("embed_out.", "lm_head.")),
                block=Block, final_norm=True, attention_kinds=attention_kinds, write_blocks=write_blocks,
                positions="rotary", hf_prefix="")
