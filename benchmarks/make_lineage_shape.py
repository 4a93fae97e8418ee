"""Write a seeded random checkpoint at the shape of a small decoder people put on devices, for speed figures only:
`smollm2-135m` (LlamaForCausalLM: 30 layers, hidden 576, 9 heads / 3 key-value heads, SwiGLU 1536, rope_theta
100000, tied head) or `pythia-160m` (GPTNeoXForCausalLM: 12 layers, hidden 768, 12 heads, rotary on 25 % of each
head, parallel residual, untied embed_out), both with context 2048, saved by transformers' save_pretrained as one
model.safetensors.

The tokenizer is GPT-2's original BPE (samples/tokenizers/gpt2, as tokenizer.json), so the vocabulary is 50,257 for
both shapes: Pythia's real one is 50,304 (padding rows), SmolLM2's 49,152 (+0.6 M parameters here, +0.5 %). Random
weights: every figure from this checkpoint is a speed figure, never a quality one.

    python benchmarks/make_lineage_shape.py --shape smollm2-135m --out .cache/smollm2-135m-random
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import GPT2TokenizerFast, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig, LlamaForCausalLM

TOKENIZER = Path(__file__).resolve().parents[1] / "samples" / "tokenizers" / "gpt2"
VOCAB, CONTEXT = 50257, 2048
SHAPES = {
    "smollm2-135m": (LlamaForCausalLM, LlamaConfig(
        vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=CONTEXT, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)),
    "pythia-160m": (GPTNeoXForCausalLM, GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
        max_position_embeddings=CONTEXT, rotary_pct=0.25, use_parallel_residual=True, tie_word_embeddings=False,
        bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    cls, config = SHAPES[args.shape]
    model = cls(config).eval()
    model.save_pretrained(args.out, max_shard_size="100GB")  # one file: gptedge reads model.safetensors
    tokenizer = GPT2TokenizerFast(vocab_file=str(TOKENIZER / "encoder.json"), merges_file=str(TOKENIZER / "vocab.bpe"))
    tokenizer.save_pretrained(args.out)  # tokenizer.json + vocab.json / merges.txt: every peer finds its files
    print(f"wrote {args.out} ({args.shape}, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)")


if __name__ == "__main__":
    main()
