"""Experiment: does ordering a GPT-2 checkpoint's channels by activation magnitude lower what quantization costs?

MatMulNBits at accuracy level 4 quantizes each linear's input per block of `block_size` channels (int8, one scale
a block), so a block holding one large channel rounds its small ones coarsely. Permuting channels is exact in
fp32 and costs nothing at run time when it is folded into the weights: the residual stream's channels (wte, wpe,
every LayerNorm, the rows of c_attn / c_fc, the columns of both c_proj), each MLP's hidden channels (c_fc's
columns, mlp.c_proj's rows) and each head's value channels (c_attn's v columns, attn.c_proj's rows). Each is
sorted by its largest |activation| on a calibration text, so blocks group channels of like size. This writes the
permuted checkpoint (checked: same logits); export and quantize it as any other and compare against the
unpermuted fp32 export:

    python benchmarks/channel_order.py samples/sample-model OUT_CKPT samples/calibration/emma_ch1-4.txt
    gptedge export OUT_CKPT -o W/fp32p --graph kv_buffer
    gptedge quantize W/fp32p -o W/wo8p --method weight-only [--block-size 128]
    gptedge compare W/fp32 W/wo8 W/wo8p --text samples/eval/persuasion_ch1-7.txt --max-tokens 2048 ...

Results: benchmarks/results/8bit-decode-2026-11-26.md (two checkpoints, blocks of 32 to 128: KL 11-31 % lower at
8 bits, 2-58 % higher at 4 bits; not adopted).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from transformers import GPT2LMHeadModel


def largest_activations(model, ids: list[int], sequences: int = 32) -> dict[str, torch.Tensor]:
    """name -> (channels,) the largest |value| seen: every LayerNorm's output, each block's c_proj inputs."""
    seen: dict[str, torch.Tensor] = {}

    def hook(name: str, of_input: bool):
        def record(module, inputs, output):
            x = (inputs[0] if of_input else output).detach()
            m = x.reshape(-1, x.shape[-1]).abs().amax(0)
            seen[name] = torch.maximum(seen[name], m) if name in seen else m
        return record

    for i, block in enumerate(model.transformer.h):
        block.ln_1.register_forward_hook(hook(f"ln.{i}.1", False))
        block.ln_2.register_forward_hook(hook(f"ln.{i}.2", False))
        block.mlp.c_proj.register_forward_hook(hook(f"mlp.{i}", True))
        block.attn.c_proj.register_forward_hook(hook(f"attn.{i}", True))
    model.transformer.ln_f.register_forward_hook(hook("ln.f", False))
    ctx = model.config.n_positions
    with torch.no_grad():
        for start in range(0, min(len(ids), sequences * ctx), ctx):
            if len(ids[start:start + ctx]) >= 8:
                model(torch.tensor([ids[start:start + ctx]]))
    return seen


def permuted(sd: dict[str, torch.Tensor], seen: dict[str, torch.Tensor], n_layer: int, n_embd: int,
             n_head: int) -> dict[str, torch.Tensor]:
    key = {k.removeprefix("transformer."): k for k in sd}
    t = {short: sd[full].clone() for short, full in key.items()}
    # the residual stream: one order for every LayerNorm's output, by the log-mean over them of each channel's max
    order = torch.argsort(sum(torch.log(v + 1e-6) for n, v in seen.items() if n.startswith("ln.")))
    for name in ("wte.weight", "wpe.weight"):
        t[name] = t[name][:, order]
    for norm in ["ln_f"] + [f"h.{i}.ln_{j}" for i in range(n_layer) for j in (1, 2)]:
        for part in ("weight", "bias"):
            t[f"{norm}.{part}"] = t[f"{norm}.{part}"][order]
    hs = n_embd // n_head
    for i in range(n_layer):  # Conv1D weights are (in, out)
        p = f"h.{i}"
        for lin in ("attn.c_attn", "mlp.c_fc"):
            t[f"{p}.{lin}.weight"] = t[f"{p}.{lin}.weight"][order]
        for lin in ("attn.c_proj", "mlp.c_proj"):
            t[f"{p}.{lin}.weight"] = t[f"{p}.{lin}.weight"][:, order]
            t[f"{p}.{lin}.bias"] = t[f"{p}.{lin}.bias"][order]
        hidden = torch.argsort(seen[f"mlp.{i}"])  # the MLP's hidden channels
        t[f"{p}.mlp.c_fc.weight"], t[f"{p}.mlp.c_fc.bias"] = t[f"{p}.mlp.c_fc.weight"][:, hidden], \
            t[f"{p}.mlp.c_fc.bias"][hidden]
        t[f"{p}.mlp.c_proj.weight"] = t[f"{p}.mlp.c_proj.weight"][hidden]
        size = seen[f"attn.{i}"].reshape(n_head, hs)  # each head's value channels, within the head
        values = torch.cat([h * hs + torch.argsort(size[h]) for h in range(n_head)])
        columns = torch.cat([torch.arange(2 * n_embd), 2 * n_embd + values])  # c_attn's output is q | k | v
        t[f"{p}.attn.c_attn.weight"], t[f"{p}.attn.c_attn.bias"] = t[f"{p}.attn.c_attn.weight"][:, columns], \
            t[f"{p}.attn.c_attn.bias"][columns]
        t[f"{p}.attn.c_proj.weight"] = t[f"{p}.attn.c_proj.weight"][values]
    if "lm_head.weight" in t:  # an untied head reads the final LayerNorm's output
        t["lm_head.weight"] = t["lm_head.weight"][:, order]
    return {key[short]: v.contiguous() for short, v in t.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("calibration", type=Path)
    args = ap.parse_args()
    model = GPT2LMHeadModel.from_pretrained(args.checkpoint).eval()
    ids = Tokenizer.from_file(str(args.checkpoint / "tokenizer.json")).encode(args.calibration.read_text()).ids
    seen = largest_activations(model, ids)
    cfg = model.config
    sd = permuted(load_file(args.checkpoint / "model.safetensors"), seen, cfg.n_layer, cfg.n_embd, cfg.n_head)
    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.checkpoint.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, args.out)
    save_file(sd, args.out / "model.safetensors", metadata={"format": "pt"})
    again = GPT2LMHeadModel.from_pretrained(args.out).eval()
    x = torch.tensor([ids[:64]])
    with torch.no_grad():
        diff = (model(x).logits - again(x).logits).abs().max().item()
    print(f"wrote {args.out}: max |logit diff| vs {args.checkpoint} {diff:.2e}")
    for name in ("ln.0.1", "mlp.0", "attn.0", "ln.f"):
        print(f"  {name}: largest |activation| {seen[name].max():.2f}, median channel's {seen[name].median():.3f}")


if __name__ == "__main__":
    main()
