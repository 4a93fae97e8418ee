"""The interface every model family module implements (gpt2.py, openai_gpt.py): `FAMILY = Family(...)`.

What differs between GPT-2 and the original GPT lives in one module each; families.py finds them by the
name the registry (runtime/registry.py) gives them. A family module supplies:

- `config_from_hf(d) -> GPTConfig` / `config_to_hf(cfg) -> dict`: its config.json, unsupported
  fields refused by name (a family with more hyper-parameters subclasses GPTConfig);
- `weight_names`: one (HF key prefix, reference name prefix) table, read both ways by
  `hf_name` / `our_name` below;
- `block`: the reference block, an nn.Module `(h, allowed, past) -> (h, present)` built from
  layers.py, and `final_norm` (an `ln_f` after the blocks);
- `attention_kinds(cfg)`: the attention writers (graph_attention.py) its blocks are written
  with for this config, and `write_blocks(g, h, weights, cfg, attention) -> h`: the blocks as
  ONNX nodes, mirroring `block` op for op.

Shared by every family: the token embedding, learned positions (or, `positions="rotary"`, q and k rotated
inside the blocks: llama.py, gpt_neox.py), the LM head (tied unless the config's `tied_head` says not), the
KV cache I/O contract (reference.py, onnx_graph.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from .config import GPTConfig
    from .graph_attention import AttentionWriter
    from .graph_writer import GraphWriter, Weights

HF_PREFIX = "transformer."  # the LM-head models' base model; bare base-model checkpoints omit it


@dataclass(frozen=True)
class Family:
    arch: str  # GPTConfig.arch and the manifest's shape.arch
    hf_model_type: str  # config.json "model_type"
    config_from_hf: Callable[[dict[str, Any]], GPTConfig]
    config_to_hf: Callable[[GPTConfig], dict[str, Any]]
    weight_names: tuple[tuple[str, str], ...]  # (HF prefix, reference prefix), after HF_PREFIX
    block: type[nn.Module]
    final_norm: bool
    attention_kinds: Callable[[GPTConfig], tuple[type[AttentionWriter], ...]]
    write_blocks: Callable[[GraphWriter, str, Weights, GPTConfig, AttentionWriter], str]
    # Rotary families (llama.py): no learned position table; each block takes the position ids, and the final
    # norm is the family's own (`norm` in the reference, `write_norm` in the graph) instead of a LayerNorm.
    positions: str = "learned"  # "learned" (wpe) or "rotary" (Block.forward gets position_ids)
    norm: Callable[[GPTConfig], nn.Module] | None = None  # the reference's ln_f; None: LayerNorm
    write_norm: Callable[[GraphWriter, str, Weights, str, GPTConfig], str] | None = None  # ln_f in the graph
    hf_prefix: str = HF_PREFIX  # the checkpoints' prefix before weight_names ("" where they name it in full)
    # A constant the token embeddings are multiplied by before the first block (gemma.py: sqrt(n_embd)); the tied
    # LM head reads the unscaled table. None: no scale.
    embedding_scale: Callable[[GPTConfig], float] | None = None

    def our_name(self, key: str) -> str:
        """HF key -> reference parameter name ('transformer.h.0.attn.c_attn.weight' -> 'h.0.attn.c_attn.weight')."""
        prefix = self.hf_prefix
        key = key[len(prefix):] if prefix and key.startswith(prefix) else key
        for hf, ours in self.weight_names:
            if key.startswith(hf):
                return ours + key[len(hf):]
        return key

    def hf_name(self, name: str) -> str:
        """Reference parameter name -> the key transformers' save_pretrained writes."""
        for hf, ours in self.weight_names:
            if name.startswith(ours):
                return self.hf_prefix + hf + name[len(ours):]
        return self.hf_prefix + name
