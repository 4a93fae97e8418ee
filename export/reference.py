"""The PyTorch reference GPT: the parity oracle for every graph gptedge builds.

Token embeddings (+ learned positions, or rotary ones inside the blocks), the family's blocks
(families.py: GPT-2 pre-LN with a final LN, the original GPT post-LN without, the Llama-style and
GPT-NeoX descendants), the LM head (tied unless the family's config unties it). Parameter names
follow HF's without the model prefix, so checkpoints map onto it by renaming only.
"""

from __future__ import annotations

import torch
from torch import nn

from .config import GPTConfig
from .families import family
from .layers import KV, attention_allowed


def reference_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """position_ids (B, T) for a left-padded mask: cumsum(mask) - 1, clipped at 0. The same rule as the
    runtime's generation.positions, written in torch so the oracle imports nothing of the runtime it checks
    (tests/export/test_reference.py holds the two equal)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        fam = family(cfg.arch)
        self.cfg = cfg
        self.rotary = fam.positions == "rotary"  # blocks take the position ids; no learned table
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.embedding_scale = fam.embedding_scale(cfg) if fam.embedding_scale else None
        self.wpe = None if self.rotary else nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(fam.block(cfg) for _ in range(cfg.n_layer))
        final = fam.norm or (lambda c: nn.LayerNorm(c.n_embd, eps=c.layer_norm_epsilon))
        self.ln_f = final(cfg) if fam.final_norm else None
        self.lm_head = None if cfg.tied_head else nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)

    def init_weights(self, seed: int, std: float = 0.02) -> "GPT":
        """GPT-2's initialisation, seeded; LayerNorms get a little noise so parity tests exercise them."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if ".ln_" in f".{name}" or name.startswith("ln_f") or "norm." in name:
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
        h, presents = self.states(input_ids, attention_mask, position_ids, past)
        head = self.wte if self.lm_head is None else self.lm_head
        logits = h @ head.weight.T  # (B, S, V), the tied LM head unless the family's config unties it
        return logits, presents

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               position_ids: torch.Tensor | None = None, past: list[KV] | None = None,
               ) -> tuple[torch.Tensor, list[KV]]:
        """The last block's output (after ln_f where the family has one) (B, S, C): what the LM head and the
        task heads (task_heads.py) read."""
        B, S = input_ids.shape
        P = past[0][0].shape[2] if past else 0
        if attention_mask is None:
            attention_mask = torch.ones(B, P + S, dtype=torch.long, device=input_ids.device)
        if position_ids is None:  # left padding: the runtime's rule (generation.positions), in torch
            position_ids = reference_positions(attention_mask)[:, P:]
        allowed = attention_allowed(attention_mask, S)  # (B, 1, S, P + S)
        h = self.wte(input_ids)  # (B, S, C)
        if self.embedding_scale is not None:  # the token embeddings alone, as the graph scales its Gather
            h = h * self.embedding_scale
        if not self.rotary:
            h = h + self.wpe(position_ids)
        rotary = (position_ids,) if self.rotary else ()
        presents: list[KV] = []
        for i, block in enumerate(self.h):
            h, present = block(h, allowed, past[i] if past else None, *rotary)
            presents.append(present)
        if self.ln_f is not None:
            h = self.ln_f(h)
        return h, presents


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
        if total >= model.cfg.n_positions or nxt == model.cfg.eos_token_id or nxt in model.cfg.eos_ids:
            break
        mask = torch.ones(1, total, dtype=torch.long)
        logits, past = model(torch.tensor([[nxt]]), mask, torch.tensor([[total - 1]]), past)
    return out
