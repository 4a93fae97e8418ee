"""The PyTorch reference GPT: the parity oracle for every graph gptedge builds.

GPT-2 (pre-LN, final LN) and the original GPT (post-LN, no final LN), learned positions,
tied LM head. Parameter names follow HF GPT-2 without the "transformer." prefix, and
Conv1D weights are [in, out] as in HF, so checkpoints map onto it by renaming only.
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


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.pre_ln = cfg.arch == "gpt2"
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon)
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, allowed: torch.Tensor, past: KV | None) -> tuple[torch.Tensor, KV]:
        if self.pre_ln:  # GPT-2
            a, present = self.attn(self.ln_1(h), allowed, past)
            h = h + a
            return h + self.mlp(self.ln_2(h)), present
        a, present = self.attn(h, allowed, past)  # original GPT: post-LN
        n = self.ln_1(h + a)
        return self.ln_2(n + self.mlp(n)), present


def attention_allowed(attention_mask: torch.Tensor, seq: int) -> torch.Tensor:
    """(B, 1, S, T) bool: query i (absolute position T - S + i) may see key j <= it, and key j is not padding."""
    B, T = attention_mask.shape
    q_pos = torch.arange(T - seq, T, device=attention_mask.device).view(seq, 1)
    k_pos = torch.arange(T, device=attention_mask.device).view(1, T)
    causal = k_pos <= q_pos  # (S, T)
    return causal.view(1, 1, seq, T) & attention_mask.bool().view(B, 1, 1, T)


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """position_ids for a left-padded batch: cumsum(mask) - 1, clipped at 0. (B, T)"""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon) if cfg.arch == "gpt2" else None

    def init_weights(self, seed: int, std: float = 0.02) -> "GPT":
        """GPT-2's initialisation, seeded; LayerNorms get a little noise so parity tests exercise them."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".ln_" in f".{name}" or name.startswith("ln_f"):
                    p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(std * torch.randn(p.shape, generator=g))
        return self

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, S) int64
        attention_mask: torch.Tensor | None = None,  # (B, P + S)
        position_ids: torch.Tensor | None = None,  # (B, S)
        past: list[KV] | None = None,  # n_layer x (B, nh, P, hs)
    ) -> tuple[torch.Tensor, list[KV]]:
        B, S = input_ids.shape
        P = past[0][0].shape[2] if past else 0
        if attention_mask is None:
            attention_mask = torch.ones(B, P + S, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = left_padded_positions(attention_mask)[:, P:]
        allowed = attention_allowed(attention_mask, S)
        h = self.wte(input_ids) + self.wpe(position_ids)  # (B, S, C)
        presents: list[KV] = []
        for i, block in enumerate(self.h):
            h, present = block(h, allowed, past[i] if past else None)
            presents.append(present)
        if self.ln_f is not None:
            h = self.ln_f(h)
        logits = h @ self.wte.weight.T  # (B, S, V), tied LM head
        return logits, presents


@torch.no_grad()
def greedy_ids(model: GPT, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """Greedy continuation with the KV cache; the oracle for runtime generation (rung 4)."""
    ids = torch.tensor([prompt_ids], dtype=torch.long)
    logits, past = model(ids)
    out: list[int] = []
    total = len(prompt_ids)
    for _ in range(max_new_tokens):
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        total += 1
        if total >= model.cfg.n_positions or nxt == model.cfg.eos_token_id:
            break
        mask = torch.ones(1, total, dtype=torch.long)
        logits, past = model(torch.tensor([[nxt]]), mask, torch.tensor([[total - 1]]), past)
    return out
