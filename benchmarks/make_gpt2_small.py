"""Write a GPT-2-small-shaped checkpoint (124M, random seeded weights) with transformers' save_pretrained;
`--size medium|large|xl` writes the 355M / 774M / 1.5B shapes (24 x 1024, 36 x 1280, 48 x 1600; vocab
50257, context 1024), always as one model.safetensors (XL's 6.2 GB would otherwise be sharded).

Random weights are fine for speed: every figure in benchmarks/ that uses this model is a
speed figure or a parity figure, never a quality one.

    python benchmarks/make_gpt2_small.py --out .cache/gpt2-small-random [--size medium]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

SIZES = {"small": {"n_layer": 12, "n_embd": 768, "n_head": 12}, "medium": {"n_layer": 24, "n_embd": 1024, "n_head": 16},
         "large": {"n_layer": 36, "n_embd": 1280, "n_head": 20}, "xl": {"n_layer": 48, "n_embd": 1600, "n_head": 25}}
TOKENIZER = Path(__file__).resolve().parents[1] / "samples" / "tokenizers" / "gpt2"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--size", choices=sorted(SIZES), default="small")
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(GPT2Config(**SIZES[args.size])).eval()  # vocab 50257, context 1024
    model.save_pretrained(args.out, max_shard_size="100GB")  # one file: gptedge reads model.safetensors
    # GPT-2's original tokenizer files, under the names transformers and CTranslate2 read.
    shutil.copyfile(TOKENIZER / "encoder.json", args.out / "vocab.json")
    shutil.copyfile(TOKENIZER / "vocab.bpe", args.out / "merges.txt")
    print(f"wrote {args.out} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters)")


if __name__ == "__main__":
    main()
