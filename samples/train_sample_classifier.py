"""Fine-tune the sample model into the sample classifier: which Austen novel a passage of 40 words comes from.

Labels are the source file: the five novels the sample model was trained on (Persuasion stays held out of every
training). Each novel's text (chapter and volume headings removed) is split by words: the first 90% gives the
training passages (40-word windows at random offsets, drawn class-balanced), the last 10% the held-out passages
(non-overlapping 40-word windows, an even spread of --eval-per-class of them per novel), never trained on here.

The result is a transformers GPT2ForSequenceClassification checkpoint (config.json with id2label / label2id /
num_labels / pad_token_id, model.safetensors with `transformer.*` and `score.weight`, tokenizer.json) that
`gptedge export --task classification` reads: its rows are `start text extract` (the GPT paper's input
transformation), start = bos_token = <|endoftext|> (id 0, what the sample model already knows as a document
boundary) and extract = cls_token = <|extract|>, a token added here (the embedding grows by one row; it is tied
to the LM head, which a classifier dir does not carry). Loss: cross-entropy of the head on the extract state plus
--lm-weight times the LM loss on the passage's tokens (the GPT paper's auxiliary objective, §3.2).

CPU only, seeded; a few minutes with 2 threads:

    python samples/train_sample_classifier.py --corpus CORPUS --model samples/sample-model \\
        --out samples/sample-classifier --eval-out samples/eval/austen-novel.jsonl --force

CORPUS: a folder with austen/*.txt (Austen's six novels, one file each, from Debian's r-cran-janeaustenr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from gptedge.export.checkpoint import load_checkpoint
from gptedge.export.families import hf_config
from gptedge.export.task_heads import load_task_checkpoint

START, EXTRACT = "<|endoftext|>", "<|extract|>"
HELD_OUT_BOOK = "persuasion.txt"  # the sample model's held-out text: in no training, the classifier's neither
LABELS = {"emma": "emma", "mansfieldpark": "mansfield-park", "northangerabbey": "northanger-abbey",
          "prideprejudice": "pride-and-prejudice", "sensesensibility": "sense-and-sensibility"}  # file stem -> label
HEADING = re.compile(r"^\s*(VOLUME|CHAPTER|Chapter)\b.*$", re.MULTILINE)


def book_words(path: Path) -> list[str]:
    """A novel's words (whitespace-split), without its title lines and chapter / volume headings: a heading's
    number would tell the book by its length, not its prose."""
    text = path.read_text(encoding="utf-8")
    first = HEADING.search(text)
    return HEADING.sub(" ", text[first.start():] if first else text).split()


def split_books(corpus: Path, held_fraction: float) -> dict[str, tuple[list[str], list[str]]]:
    """label -> (training words, held-out words): the held-out part is each book's contiguous tail."""
    out = {}
    for stem, label in LABELS.items():
        words = book_words(corpus / "austen" / f"{stem}.txt")
        cut = int(len(words) * (1 - held_fraction))
        out[label] = (words[:cut], words[cut:])
    return out


def held_out_passages(books: dict, words: int, per_class: int) -> list[dict]:
    """per_class non-overlapping windows of `words` words, spread evenly over each book's tail -> JSONL rows."""
    rows = []
    for label, (_, tail) in books.items():
        windows = len(tail) // words
        if windows < per_class:
            raise SystemExit(f"{label}: its held-out tail holds {windows} passages of {words} words, not {per_class}")
        for i in np.linspace(0, windows - 1, per_class).astype(int):
            rows.append({"text": " ".join(tail[i * words:(i + 1) * words]), "label": label})
    return rows


class Rows:
    """Text -> the classification row `start text extract` as token ids; batches right-padded with pad 0."""

    def __init__(self, tok, context: int):
        self.tok, self.context = tok, context
        self.start, self.extract = tok.token_to_id(START), tok.token_to_id(EXTRACT)

    def row(self, text: str) -> list[int]:
        return [self.start] + self.tok.encode(text, add_special_tokens=False).ids[: self.context - 2] + [self.extract]

    def batch(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [self.row(t) for t in texts]
        width = max(map(len, rows))
        ids = torch.zeros(len(rows), width, dtype=torch.long)  # (B, S), pad 0 (masked)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)], mask[i, :len(r)] = torch.tensor(r), 1
        return ids, mask


def forward(body, score: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-> label logits (B, L) at each row's extract token, and the LM loss on its text tokens (a scalar)."""
    pos = (mask.cumsum(1) - 1).clamp(min=0)  # (B, S)
    h, _ = body.states(ids, mask, pos)  # (B, S, C)
    last = mask.sum(1) - 1  # (B,) the extract token, the last real one (rows are right-padded)
    logits = h[torch.arange(ids.shape[0]), last] @ score.T  # (B, L)
    # next-token loss from start..second-to-last text token: targets are the text tokens (never extract, never pad)
    target = ids[:, 1:].clone()
    keep = mask[:, 1:].bool() & (torch.arange(1, ids.shape[1]) < last[:, None])
    target[~keep] = -100
    lm = F.cross_entropy((h[:, :-1] @ body.wte.weight.T).flatten(0, 1), target.flatten(), ignore_index=-100)
    return logits, lm


@torch.no_grad()
def predict(model_logits, rows: Rows, texts: list[str], batch: int = 64) -> np.ndarray:
    """-> label logits (N, L) for texts, in batches."""
    return np.concatenate([model_logits(*rows.batch(texts[i:i + batch])).numpy() for i in range(0, len(texts), batch)])


def sample_batch(books: dict, labels: list[str], rng: np.random.Generator, bsz: int, words: int):
    """Class-balanced: a label drawn uniformly, then a window of `words` words at a random offset in its
    training part -> (texts, label ids)."""
    y = rng.integers(0, len(labels), size=bsz)
    texts = []
    for k in y:
        train = books[labels[k]][0]
        s = int(rng.integers(0, len(train) - words))
        texts.append(" ".join(train[s:s + words]))
    return texts, torch.from_numpy(y.astype(np.int64))


def add_extract_token(model_dir: Path):
    """The sample model's tokenizer plus <|extract|> (a special token, the next id) -> the tokenizer."""
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(EXTRACT, special=True, normalized=False)])
    return tok


def grow_embedding(body, new_vocab: int, seed: int) -> None:
    """wte (V, C) -> (new_vocab, C): new rows are the mean embedding plus N(0, 0.02) noise (trained with the rest)."""
    old = body.wte.weight.data
    g = torch.Generator().manual_seed(seed)
    extra = old.mean(0, keepdim=True) + 0.02 * torch.randn(new_vocab - old.shape[0], old.shape[1], generator=g)
    body.wte = torch.nn.Embedding(new_vocab, old.shape[1])
    body.wte.weight.data = torch.cat([old, extra])
    body.cfg = dataclasses.replace(body.cfg, vocab_size=new_vocab)


def save(body, score: torch.Tensor, tok, labels: list[str], out: Path, log: dict) -> None:
    """A GPT2ForSequenceClassification checkpoint, written beside `out` and renamed into place."""
    from safetensors.torch import save_file

    tmp = out.with_name(f".{out.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {f"transformer.{k}": v.detach().float().contiguous() for k, v in body.state_dict().items()}
    state["score.weight"] = score.detach().float().contiguous()  # (L, C), no bias: transformers' score
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    config = {**hf_config(body.cfg), "architectures": ["GPT2ForSequenceClassification"], "num_labels": len(labels),
              "id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)},
              "pad_token_id": tok.token_to_id(START), "problem_type": "single_label_classification"}
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tok.save(str(tmp / "tokenizer.json"))
    special = {"bos_token": START, "eos_token": START, "pad_token": START, "cls_token": EXTRACT}
    (tmp / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")
    (tmp / "tokenizer_config.json").write_text(json.dumps({**special, "model_max_length": body.cfg.n_positions,
                                                           "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2)
                                               + "\n", encoding="utf-8")
    (tmp / "training_log.json").write_text(json.dumps(log, indent=1) + "\n", encoding="utf-8")
    for name in ("README.md",):  # kept across retraining: written by hand
        if (out / name).is_file():
            shutil.copyfile(out / name, tmp / name)
    old = out.with_name(f".{out.name}.old")
    if out.exists():
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)


def check_outputs(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Before minutes of training: --out / --eval-out never replace or land inside an input, and replace an
    existing output only with --force (the checkpoint is swapped in whole at the end)."""
    inputs = [args.model.resolve(), args.corpus.resolve()]
    for name, out in (("--out", args.out), ("--eval-out", args.eval_out)):
        o = out.resolve()
        for i in inputs:
            if o == i or i in o.parents or o in i.parents:
                ap.error(f"{name} {out} overlaps the input {i}")
        if out.exists() and not args.force:
            ap.error(f"{name} {out} exists (--force replaces it)")
    if args.out.resolve() == args.eval_out.resolve() or args.out.resolve() in args.eval_out.resolve().parents:
        ap.error("--eval-out must lie outside --out")


def write_jsonl(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.partial")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * max(0.0, (steps - step) / max(1, steps - warmup))  # linear decay, as the GPT paper's fine-tuning


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="folder with austen/*.txt")
    ap.add_argument("--model", type=Path, default=Path("samples/sample-model"), help="the LM to fine-tune")
    ap.add_argument("--out", type=Path, required=True, help="where the classifier checkpoint is written")
    ap.add_argument("--eval-out", type=Path, required=True, help="the held-out labelled set (JSONL) written here")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--words", type=int, default=40, help="words a passage")
    ap.add_argument("--held-fraction", type=float, default=0.1, help="each book's tail kept for evaluation")
    ap.add_argument("--eval-per-class", type=int, default=100)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--lm-weight", type=float, default=0.5, help="the auxiliary LM loss's weight (0: none)")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="replace an existing --out / --eval-out")
    args = ap.parse_args()
    check_outputs(ap, args)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    books = split_books(args.corpus, args.held_fraction)
    labels = list(books)
    held = held_out_passages(books, args.words, args.eval_per_class)
    held_texts, held_y = [r["text"] for r in held], np.array([labels.index(r["label"]) for r in held])

    body, cfg = load_checkpoint(args.model)
    tok = add_extract_token(args.model)
    grow_embedding(body, tok.get_vocab_size(), args.seed)
    rows = Rows(tok, cfg.n_positions)
    score = torch.nn.Parameter(0.02 * torch.randn(len(labels), cfg.n_embd))  # (L, C), transformers' init
    body.train()
    params = [p for p in body.parameters()] + [score]
    decay = [p for p in params if p.dim() >= 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}], lr=args.lr)
    print(f"{len(labels)} labels; training words {sum(len(b[0]) for b in books.values()):,}, held-out passages "
          f"{len(held)}; vocab {tok.get_vocab_size()}", flush=True)

    def held_out() -> tuple[float, float]:
        body.eval()
        logits = predict(lambda i, m: forward(body, score, i, m)[0], rows, held_texts)
        body.train()
        loss = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(held_y)).item()
        return float((logits.argmax(1) == held_y).mean()), loss

    curve, started = [], time.time()
    for step in range(1, args.steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr_at(step - 1, args.steps, args.lr, args.warmup)
        texts, y = sample_batch(books, labels, rng, args.batch, args.words)
        logits, lm = forward(body, score, *rows.batch(texts))
        cls = F.cross_entropy(logits, y)
        loss = cls + args.lm_weight * lm
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 20 == 0:
            print(f"step {step}/{args.steps} cls {cls.item():.3f} lm {lm.item():.3f} "
                  f"{(time.time() - started) / 60:.1f} min", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            acc, held_loss = held_out()
            curve.append({"step": step, "train_cls_loss": round(cls.item(), 4), "train_lm_loss": round(lm.item(), 4),
                          "held_out_cls_loss": round(held_loss, 4), "held_out_accuracy": round(acc, 4)})
            print(f"step {step}: held-out accuracy {acc:.4f}, loss {held_loss:.3f}", flush=True)

    body.eval()
    log = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}, "labels": labels,
           "held_out": {"examples": len(held), "per_class": args.eval_per_class, "file": str(args.eval_out)},
           "minutes": round((time.time() - started) / 60, 2), "log": curve}
    save(body, score, tok, labels, args.out, log)
    write_jsonl(held, args.eval_out)
    # the saved checkpoint as the exporter reads it (its reference TaskModel) must score what training measured
    reference, _ = load_task_checkpoint(args.out)
    logits = predict(reference, rows, held_texts)
    print(f"wrote {args.out} and {args.eval_out}: reloaded held-out accuracy "
          f"{(logits.argmax(1) == held_y).mean():.4f} ({len(held)} passages)", flush=True)


if __name__ == "__main__":
    main()
