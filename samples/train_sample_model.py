"""Train the shipped sample model: a small GPT-2 on Austen (minus Persuasion) and the King James Bible.

CPU only, resumable: a checkpoint is written every --save-every steps into --work-dir and
picked up again on restart. The result is written in HF GPT-2 layout (config.json,
model.safetensors, tokenizer.json) to --out.

    python samples/train_sample_model.py --corpus CORPUS --out samples/sample-model

CORPUS: a folder with austen/*.txt (Austen's six novels, one file each, from Debian's r-cran-janeaustenr) and
kjv/kjv.txt (the King James Bible, one verse per line, from Debian's bible-kjv-text); public-domain texts.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from gptedge.export.checkpoint import save_checkpoint
from gptedge.export.config import GPTConfig
from gptedge.export.reference import GPT

EOT = "<|endoftext|>"
HELD_OUT = "persuasion.txt"


def training_files(corpus: Path, texts: tuple[str, ...] = ("austen", "kjv")) -> list[Path]:
    """The training text: Austen's novels but Persuasion, and / or the KJV."""
    files = []
    if "austen" in texts:
        files += sorted(p for p in (corpus / "austen").glob("*.txt") if p.name != HELD_OUT)
    if "kjv" in texts:
        files.append(corpus / "kjv" / "kjv.txt")
    return files


def load_tokenizer(source: Path):
    """An existing tokenizer: a tokenizer.json, or a folder with GPT-2's encoder.json / vocab.bpe."""
    from tokenizers import Tokenizer

    from gptedge.export.tokenizer_files import byte_level_bpe, find_tokenizer_source

    if source.is_file():
        return Tokenizer.from_file(str(source))
    found = find_tokenizer_source(source)
    if found is None:
        raise SystemExit(f"--tokenizer {source}: no tokenizer.json or encoder.json + vocab.bpe there")
    return Tokenizer.from_file(str(found[0])) if len(found) == 1 else byte_level_bpe(*found)


def train_tokenizer(files: list[Path], vocab_size: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(f) for f in files], trainer)
    tok.save(str(out))
    return tok


def encode_files(tok, files: list[Path], eot: int) -> np.ndarray:
    ids: list[int] = []
    for f in files:
        ids += tok.encode(f.read_text(encoding="utf-8")).ids + [eot]
    return np.array(ids, dtype=np.int32)


def batch(data: np.ndarray, rng: np.random.Generator, bsz: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
    starts = rng.integers(0, len(data) - T - 1, size=bsz)
    x = np.stack([data[s:s + T] for s in starts]).astype(np.int64)
    y = np.stack([data[s + 1:s + T + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(x), torch.from_numpy(y)


@torch.no_grad()
def held_out_loss(model: GPT, data: np.ndarray, T: int, max_windows: int = 64) -> float:
    """Mean next-token loss over non-overlapping windows of the held-out text."""
    model.eval()
    n = min(max_windows, (len(data) - 1) // T)
    losses = []
    for i in range(n):
        x = torch.from_numpy(data[i * T:(i + 1) * T].astype(np.int64))[None]
        y = torch.from_numpy(data[i * T + 1:(i + 1) * T + 1].astype(np.int64))[None]
        logits, _ = model(x)
        losses.append(F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1)).item())
    model.train()
    return float(np.mean(losses))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.1 * peak + 0.9 * peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="folder with austen/*.txt and kjv/kjv.txt")
    ap.add_argument("--out", type=Path, required=True, help="where the HF-layout model is written")
    ap.add_argument("--work-dir", type=Path, default=Path(".cache/train"), help="checkpoints for resuming")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=8192, help="size of the BPE trained on the text")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="use this tokenizer (tokenizer.json, or a folder with GPT-2's encoder.json / vocab.bpe) "
                         "instead of training one")
    ap.add_argument("--texts", default="austen,kjv",
                    help="comma-separated: austen (all but Persuasion), kjv; Persuasion is always held out")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=192)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save-every", type=int, default=100)
    ap.add_argument("--max-minutes", type=float, default=60.0, help="stop (and save) when this budget is spent")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    texts = tuple(t.strip() for t in args.texts.split(",") if t.strip())
    if not texts or set(texts) - {"austen", "kjv"}:
        raise SystemExit(f"--texts {args.texts!r}: name austen and / or kjv")
    files = training_files(args.corpus, texts)
    tok_path = args.work_dir / "tokenizer.json"
    if args.tokenizer is not None and not tok_path.exists():
        load_tokenizer(args.tokenizer).save(str(tok_path))
    if tok_path.exists():
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tok_path))
    else:
        tok = train_tokenizer(files, args.vocab, tok_path)
    eot = tok.token_to_id(EOT)
    train = encode_files(tok, files, eot)
    held = encode_files(tok, [args.corpus / "austen" / HELD_OUT], eot)
    print(f"train tokens {len(train):,}  held-out tokens {len(held):,}  vocab {tok.get_vocab_size()}", flush=True)

    cfg = GPTConfig(arch="gpt2", vocab_size=tok.get_vocab_size(), n_positions=args.context, n_embd=args.n_embd,
                    n_layer=args.n_layer, n_head=args.n_head, bos_token_id=eot, eos_token_id=eot)
    torch.manual_seed(args.seed)
    model = GPT(cfg)
    with torch.no_grad():  # GPT-2 init: N(0, 0.02), LayerNorms at identity
        for name, p in model.named_parameters():
            if "ln" in name:
                p.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                p.normal_(0.0, 0.02 / (math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj.weight") else 1.0))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    ckpt_path = args.work_dir / "checkpoint.pt"
    step, log = 0, []
    rng = np.random.default_rng(args.seed)
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        step, log = ck["step"], ck["log"]
        rng.bit_generator.state = ck["rng"]
        print(f"resumed at step {step}", flush=True)

    def save() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log,
                    "rng": rng.bit_generator.state, "args": vars(args) | {"corpus": str(args.corpus)}}, tmp)
        tmp.replace(ckpt_path)

    started = time.time()
    model.train()
    while step < args.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x, y = batch(train, rng, args.batch, args.context)
        logits, _ = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0:
            elapsed = time.time() - started
            print(f"step {step}/{args.steps} loss {loss.item():.3f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"{elapsed / 60:.1f} min", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            held_loss = held_out_loss(model, held, args.context)
            log.append({"step": step, "train_loss": round(loss.item(), 4), "held_out_loss": round(held_loss, 4)})
            print(f"step {step}: held-out loss {held_loss:.3f} (ppl {math.exp(held_loss):.1f})", flush=True)
            save()
        if (time.time() - started) / 60 > args.max_minutes:
            print("time budget spent; stopping early", flush=True)
            save()
            break

    model.eval()
    args.out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, args.out)
    (args.out / "tokenizer.json").write_bytes(tok_path.read_bytes())
    (args.out / "generation_config.json").write_text(json.dumps({"bos_token_id": eot, "eos_token_id": eot}) + "\n")
    plain_args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}  # paths as JSON strings
    (args.out / "training_log.json").write_text(json.dumps({"args": plain_args, "steps": step, "log": log},
                                                           indent=1) + "\n")
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
