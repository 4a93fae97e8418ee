"""Experiment: does rotating a Llama checkpoint's residual stream (QuaRot-style) lower what 8-bit MatMulNBits costs?

Level 4 rounds each linear's input to int8 per block of `block_size` channels; a rotation spreads a large channel
over its block. The residual stream can be rotated with nothing added to the graph: a seeded random orthogonal Q
(d x d), every RMSNorm's gain folded into the linears that read it (then 1), embeddings E Q, readers' rows
Q^T diag(g) W, writers' (o_proj, down_proj) columns W Q, the head untied. Exact in fp32. Export and quantize the
written checkpoint as any other:

    python benchmarks/rotate_residual.py samples/sample-llama OUT_CKPT
    gptedge export OUT_CKPT -o W/fp32r --graph kv_buffer
    gptedge quantize W/fp32r -o W/wo8r --method weight-only [--block-size 64]

Result (benchmarks/results/8bit-layouts-2026-11-27.md): no gain on the Llama sample (its normalized inputs have no
outlier channels); the input that has them is down's, computed inside the MLP, which `quantize --rotate-down`
rotates online (quantize/rotation.py).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np


def random_orthogonal(d: int, seed: int = 0) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return q * np.sign(np.diag(r))[None, :]


def rotate_residual(src: Path, dst: Path, seed: int) -> float:
    """-> max |logit diff| of the rotated checkpoint against the original on a few ids."""
    import torch
    from transformers import LlamaForCausalLM

    m = LlamaForCausalLM.from_pretrained(src, dtype=torch.float64).eval()
    q = torch.from_numpy(random_orthogonal(m.config.hidden_size, seed))
    ids = torch.arange(1, 17)[None, :]
    with torch.no_grad():
        ref = m(ids).logits
        if m.config.tie_word_embeddings:  # the head gets the final norm's gain, the embedding does not
            m.lm_head.weight = torch.nn.Parameter(m.model.embed_tokens.weight.clone())
            m.config.tie_word_embeddings = False
        m.model.embed_tokens.weight.copy_(m.model.embed_tokens.weight @ q)
        for layer in m.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            for norm, readers in ((layer.input_layernorm, (attn.q_proj, attn.k_proj, attn.v_proj)),
                                  (layer.post_attention_layernorm, (mlp.gate_proj, mlp.up_proj))):
                for lin in readers:  # torch's weight is (out, in): y = x W^T
                    lin.weight.copy_(lin.weight * norm.weight[None, :] @ q)
                norm.weight.fill_(1.0)
            for lin in (attn.o_proj, mlp.down_proj):
                lin.weight.copy_(q.T @ lin.weight)
                if lin.bias is not None:
                    lin.bias.copy_(lin.bias @ q)
        m.lm_head.weight.copy_(m.lm_head.weight * m.model.norm.weight[None, :] @ q)
        m.model.norm.weight.fill_(1.0)
        diff = (m(ids).logits - ref).abs().max().item()
    m.to(torch.float32).save_pretrained(dst, safe_serialization=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("model.safetensors", "config.json"):
            shutil.copy(f, dst / f.name)
    return diff


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    diff = rotate_residual(args.src, args.out, args.seed)
    print(f"rotated {args.src} -> {args.out}: max |logit diff| {diff:.2e}")


if __name__ == "__main__":
    main()
