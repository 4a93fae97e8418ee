"""The Llama-style family (transformers' LlamaForCausalLM, model_type "llama"): GPT-2's pre-norm decoder
with rotary positions instead of a position table, RMSNorm, a gated SiLU MLP (SwiGLU), grouped-query
attention (fewer key/value heads than query heads), optional q/k/v/o biases and an untied LM head.

HF config.json (LlamaConfig) -> LlamaConfig below, refusing what the reference does not implement by name;
weight names (transformers' own under `model.`, layers as our `h.`); the reference block; its ONNX graph
(graph_rotary.py: plain ops on the standard graph, GroupQueryAttention rotating q and k and RMSNorms as ONNX
Runtime's (Skip)SimplifiedLayerNormalization and SiLU as its QuickGelu on kv_buffer; one packed q | k | v projection
on both).
See base.py for what a family module supplies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.modeldir.manifest import ModelShape

from .base import Family
from .graph_writer import Weights
from .config import GPTConfig, positive_int
from .graph_attention import AttentionWriter
from .graph_rotary import RotaryGroupQueryAttention, RotaryPlainAttention, dense, residual_rms_norm, rms_norm
from .graph_writer import MS_DOMAIN, GraphWriter
from .layers import KV
from .rotary import cos_sin, inv_freq, rope_scaling, rotate

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "mistral": "MistralForCausalLM"}
# Fields whose other values change the computation in ways the reference does not implement.
_FIXED = (("hidden_act", "silu"), ("pretraining_tp", 1))


@dataclass(frozen=True)
class LlamaConfig(GPTConfig):
    """GPTConfig plus what a Llama-style checkpoint adds. n_kv_head: key/value heads (n_head without GQA);
    rope_scaling: config.json's object as sorted items (rotary.rope_scaling), () for none; eos_token_ids:
    generation's end-of-sequence ids where there are several (eos_token_id is the first)."""

    n_kv_head: int = 0  # 0: n_head
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] = ()
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q, k and v projections
    o_bias: bool = False  # the output projection (Llama's attention_bias covers both; Qwen2 biases q, k, v only)
    mlp_bias: bool = False
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_head % self.kv_heads:
            raise CheckpointError(f"config: num_attention_heads {self.n_head} is not a multiple of "
                                  f"num_key_value_heads {self.kv_heads}")

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def tied_head(self) -> bool:
        return self.tie_word_embeddings

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self.eos_token_ids if len(self.eos_token_ids) > 1 else ()

    @property
    def rotary_dim(self) -> int:
        return self.head_dim

    def shape(self) -> ModelShape:
        kv = None if self.kv_heads == self.n_head else self.kv_heads
        return ModelShape(self.arch, self.n_layer, self.n_head, self.head_dim, self.vocab_size, self.n_positions, kv)


def _ids(d: dict[str, Any], key: str) -> tuple[int, ...]:
    value = d.get(key)
    values = value if isinstance(value, list) else ([] if value is None else [value])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(f"config.json: {key}={value!r} is not a token id or a list of them")
    return tuple(values)


def config_from_hf(d: dict[str, Any], arch: str = "llama", **fixed: Any) -> LlamaConfig:
    """config.json -> LlamaConfig; arch and `fixed` fields for the Llama-shaped families built on this one
    (qwen2.py, mistral.py)."""
    for name, ok in _FIXED:
        if d.get(name, ok) != ok:
            raise CheckpointError(f"config.json: {name}={d[name]!r} is not supported")
    n_embd, n_head = positive_int(d, "hidden_size", 4096), positive_int(d, "num_attention_heads", 32)
    if d.get("head_dim") not in (None, n_embd // n_head):
        raise CheckpointError(f"config.json: head_dim={d['head_dim']!r} is not hidden_size / num_attention_heads")
    eos = _ids(d, "eos_token_id")
    bos = _ids(d, "bos_token_id")
    bias = bool(d.get("attention_bias", False))
    fields = dict(attention_bias=bias, o_bias=bias)
    fields.update(fixed)
    return LlamaConfig(arch=arch, vocab_size=positive_int(d, "vocab_size", 32000),
                       n_positions=positive_int(d, "max_position_embeddings", 2048), n_embd=n_embd,
                       n_layer=positive_int(d, "num_hidden_layers", 32), n_head=n_head,
                       n_inner=positive_int(d, "intermediate_size", 11008), activation="silu",
                       layer_norm_epsilon=float(d.get("rms_norm_eps", 1e-6)),
                       bos_token_id=bos[0] if bos else None, eos_token_id=eos[0] if eos else None,
                       n_kv_head=positive_int(d, "num_key_value_heads", n_head),
                       rope_theta=float(d.get("rope_theta", 10000.0)), rope_scaling=rope_scaling(d.get("rope_scaling")),
                       tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                       mlp_bias=bool(d.get("mlp_bias", False)), **fields,
                       eos_token_ids=eos)


def config_to_hf(cfg: GPTConfig) -> dict[str, Any]:
    assert isinstance(cfg, LlamaConfig)
    eos = list(cfg.eos_token_ids) if len(cfg.eos_token_ids) > 1 else cfg.eos_token_id
    return {"model_type": cfg.arch, "architectures": [ARCHITECTURES[cfg.arch]], "vocab_size": cfg.vocab_size,
            "max_position_embeddings": cfg.n_positions, "hidden_size": cfg.n_embd, "intermediate_size": cfg.mlp_dim,
            "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
            "num_key_value_heads": cfg.kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
            "rms_norm_eps": cfg.layer_norm_epsilon, "rope_theta": cfg.rope_theta,
            "rope_scaling": dict(cfg.rope_scaling) or None, "attention_bias": cfg.attention_bias,
            "mlp_bias": cfg.mlp_bias, "tie_word_embeddings": cfg.tie_word_embeddings,
            "bos_token_id": cfg.bos_token_id, "eos_token_id": eos, "use_cache": True}


class RMSNorm(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(cfg.n_embd))
        self.eps = cfg.layer_norm_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    """Rotary grouped-query attention over a KV cache that holds the kv heads (B, nkv, T, hs), rotated keys."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg, self.n_head, self.n_kv, self.head_dim = cfg, cfg.n_head, cfg.kv_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.n_embd, cfg.kv_heads * cfg.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.n_embd, cfg.kv_heads * cfg.head_dim, bias=bias)
        self.o_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=cfg.o_bias)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: KV | None,
                position_ids: torch.Tensor) -> tuple[torch.Tensor, KV]:
        B, S, _ = x.shape
        heads = lambda t, n: t.view(B, S, n, self.head_dim).transpose(1, 2)  # noqa: E731 - a one-line reshape helper; (B, n, S, hs)
        # inv_freq is a function of the config, computed here rather than held as a buffer: the reference is
        # built on the meta device and takes only the checkpoint's tensors (checkpoint.py)
        cos, sin = cos_sin(inv_freq(self.cfg.rotary_dim, self.cfg.rope_theta, self.cfg.rope_scaling), position_ids)
        q = rotate(heads(self.q_proj(x), self.n_head), cos, sin)
        k = rotate(heads(self.k_proj(x), self.n_kv), cos, sin)
        v = heads(self.v_proj(x), self.n_kv)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)  # (B, nkv, T, hs)
        rep = self.n_head // self.n_kv  # kv head j serves query heads j * rep .. (transformers' repeat_kv)
        kr, vr = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        scores = (q @ kr.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, nh, S, T)
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)  # as layers.Attention
        y = (F.softmax(scores, dim=-1) @ vr).transpose(1, 2).reshape(B, S, -1)
        return self.o_proj(y), (k, v)


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.n_embd, cfg.mlp_dim, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(cfg.n_embd, cfg.mlp_dim, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.mlp_dim, cfg.n_embd, bias=cfg.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """h + attn(input_layernorm(h)), then h + mlp(post_attention_layernorm(h)); transformers' names."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, allowed: torch.Tensor, past: KV | None,
                position_ids: torch.Tensor) -> tuple[torch.Tensor, KV]:
        a, present = self.self_attn(self.input_layernorm(h), allowed, past, position_ids)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h)), present


def attention_kinds(cfg: GPTConfig) -> tuple[type[AttentionWriter], ...]:
    return (RotaryPlainAttention, RotaryGroupQueryAttention)


def write_norm(g: GraphWriter, x: str, w: Weights, prefix: str, cfg: GPTConfig) -> str:
    return rms_norm(g, x, w, prefix, cfg.layer_norm_epsilon)


def silu(g: GraphWriter, x: str, name: str) -> str:
    """silu(x) = x sigmoid(x): com.microsoft QuickGelu with alpha 1 (x sigmoid(alpha x)) in a contrib graph, one
    node instead of two."""
    if g.contrib:
        return g.one("QuickGelu", [x], name=name, domain=MS_DOMAIN, alpha=1.0)
    return g.one("Mul", [x, g.one("Sigmoid", [x])], name=name)


def write_blocks(g: GraphWriter, h: str, w: Weights, cfg: GPTConfig, attention: AttentionWriter,
                 gate: Callable[[GraphWriter, str, str], str] = silu) -> str:
    """h (B, S, C) token embeddings -> the last block's output (B, S, C), before the final norm. Each residual add
    but the last is written with the RMSNorm after it (graph_rotary.residual_rms_norm: one node in a contrib graph).
    gate: the MLP gate's activation (g, x, node name) -> y (gemma.py's is a GELU)."""
    eps = cfg.layer_norm_epsilon
    x = rms_norm(g, h, w, "h.0.input_layernorm", eps)
    for i in range(cfg.n_layer):
        p = f"h.{i}"
        x, h = residual_rms_norm(g, attention(x, w, i), h, w, f"{p}.post_attention_layernorm", eps,
                                 name=f"{p}.attn.residual")
        act = gate(g, dense(g, x, w, f"{p}.mlp.gate_proj"), f"{p}.mlp.silu")
        mlp = dense(g, g.one("Mul", [act, dense(g, x, w, f"{p}.mlp.up_proj")]), w, f"{p}.mlp.down_proj")
        if i + 1 == cfg.n_layer:
            return g.one("Add", [h, mlp], name=f"{p}.mlp.residual")
        x, h = residual_rms_norm(g, mlp, h, w, f"h.{i + 1}.input_layernorm", eps, name=f"{p}.mlp.residual")
    return h  # no blocks


FAMILY = Family(arch="llama", hf_model_type="llama", config_from_hf=config_from_hf, config_to_hf=config_to_hf,
                weight_names=(("model.embed_tokens.", "wte."), ("model.layers.", "h."), ("model.norm.", "ln_f.")),
                block=Block, final_norm=True, attention_kinds=attention_kinds, write_blocks=write_blocks,
                positions="rotary", norm=RMSNorm, write_norm=write_norm, hf_prefix="")
