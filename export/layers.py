"""PyTorch layers the reference families share: HF's Conv1D, multi-head attention over a KV cache, the MLP.

Parameter names and layouts follow HF GPT-2 (Conv1D weights are [in, out]), so checkpoints map
onto them by renaming only (each family's weight-name table).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .config import GPTConfig

KV = tuple[torch.Tensor, torch.Tensor]  # (key, value), each (B, nh, T, hs)


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    if kind == "gelu_erf":
        return F.gelu(x)
    return F.relu(x)


class Conv1D(nn.Module):
    """y = x @ W + b with W stored [in, out] (HF's GPT Conv1D layout)."""

    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        B, S, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)  # each (B, S, C)
        q, k, v = (t.view(B, S, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, nh, S, hs)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # (B, nh, T, hs), T = past + S
            v = torch.cat([past[1], v], dim=2)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, nh, S, T)
        # Replace (not add) masked scores: a fully masked row (a left-padding query) stays finite.
        scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
        y = F.softmax(scores, dim=-1) @ v  # (B, nh, S, hs)
        y = y.transpose(1, 2).reshape(B, S, C)
        return self.c_proj(y), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, cfg.mlp_dim)
        self.c_proj = Conv1D(cfg.mlp_dim, cfg.n_embd)
        self.kind = cfg.activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(activation(self.c_fc(x), self.kind))


class BlockLayers(nn.Module):
    """A transformer block's parameters (ln_1, attn, ln_2, mlp, under HF's names); each family's Block
    subclasses it and writes forward(h (B, S, C), allowed, past) -> (h, present) in its own LN order."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)


def attention_allowed(attention_mask: torch.Tensor, seq: int) -> torch.Tensor:
    """(B, 1, S, T) bool: query i (absolute position T - S + i) may see key j <= it, and key j is not padding."""
    B, T = attention_mask.shape
    q_pos = torch.arange(T - seq, T, device=attention_mask.device).view(seq, 1)
    k_pos = torch.arange(T, device=attention_mask.device).view(1, T)
    causal = k_pos <= q_pos  # (S, T)
    return causal.view(1, 1, seq, T) & attention_mask.bool().view(B, 1, 1, T)
