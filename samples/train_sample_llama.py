"""Train the shipped Llama sample: a small LlamaForCausalLM on Austen (minus Persuasion), with its own tokenizer.

The tokenizer is the kind Llama checkpoints ship: BPE over Metaspace pieces (▁ for spaces) with byte fallback
(<0x00>..<0xFF> stand for any character outside the vocab), <unk> / <s> / </s> and ChatML's <|im_start|> /
<|im_end|> as special tokens, <s> put first by the post-processor (add_bos_token true). The model: grouped-query
attention (8 query heads over 2 key/value heads), RMSNorm, SwiGLU, rotary positions, an untied head. A quarter of
each batch is chat-shaped text (two consecutive paragraphs as a user turn and an assistant turn, in the ChatML
template shipped in tokenizer_config.json) so that a chat reply ends with <|im_end|>.

CPU, deterministic for a given --seed and --threads, resumable: a checkpoint is written every --save-every steps
into --work-dir and picked up again on restart. Written in the layout transformers saves (config.json,
generation_config.json with eos_token_id [</s>, <|im_end|>], model.safetensors, tokenizer.json,
tokenizer_config.json, special_tokens_map.json, training_log.json) to --out.

    python samples/train_sample_llama.py --corpus CORPUS/austen --out samples/sample-llama
    python samples/train_sample_llama.py --corpus CORPUS/kjv --out /tmp/kjv-llama  # any folder of .txt

CORPUS: a folder with austen/*.txt (Austen's six novels, one file each, from Debian's r-cran-janeaustenr) and
kjv/kjv.txt (the King James Bible, one verse per line, from Debian's bible-kjv-text); public-domain texts.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

HELD_OUT = "persuasion.txt"
UNK, BOS, EOS, IM_START, IM_END = "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"
SPECIALS = (UNK, BOS, EOS, IM_START, IM_END)  # ids 0..4, then the 256 byte tokens, then the learned pieces
# ChatML, as Qwen2 / SmolLM2 ship it, after <s> (the tokenizer adds <s> to plain text; a rendered chat is tokenized
# without special tokens, so the template writes it).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def training_files(corpus: Path) -> list[Path]:
    """Every .txt in the folder but Persuasion (the held-out text)."""
    files = sorted(p for p in corpus.glob("*.txt") if p.name != HELD_OUT)
    if not files:
        raise SystemExit(f"--corpus {corpus}: no .txt files to train on")
    return files


def train_tokenizer(files: list[Path], vocab_size: int, limit_alphabet: int):
    """A BPE trained on the text, rebuilt with the 256 byte tokens Llama's byte fallback needs."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    metaspace = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    learner = Tokenizer(models.BPE(unk_token=UNK))
    learner.pre_tokenizer = metaspace
    # the trainer's vocab counts the specials and the alphabet; the byte tokens come on top of it
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, special_tokens=list(SPECIALS),
                                  limit_alphabet=limit_alphabet, show_progress=False)
    learner.train([str(f) for f in files], trainer)
    learned = json.loads(learner.to_str())["model"]
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    vocab.update({f"<0x{b:02X}>": len(SPECIALS) + b for b in range(256)})
    for piece, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in learned["merges"]]

    tok = Tokenizer(models.BPE(vocab, merges, unk_token=UNK, byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = metaspace
    # Llama's tokenizer.json decoder: ▁ back to spaces, byte tokens to characters, the first space dropped
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, vocab[BOS])])
    return tok


def tokenizer_files(out: Path, context: int) -> None:
    """tokenizer_config.json (with the chat template) and special_tokens_map.json, as transformers writes them."""
    added = {str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                      "special": True} for i, t in enumerate(SPECIALS)}
    config = {"add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added,
              "additional_special_tokens": [IM_START, IM_END], "bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
              "pad_token": None, "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
              "legacy": False, "model_max_length": context, "tokenizer_class": "LlamaTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    special_map = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK,
                   "additional_special_tokens": [IM_START, IM_END]}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2) + "\n", encoding="utf-8")


def render_chat(turns: list[tuple[str, str]]) -> str:
    """CHAT_TEMPLATE by hand (no jinja2 needed to train): <s>, then each (role, content) as a ChatML turn."""
    return BOS + "".join(f"{IM_START}{role}\n{content}{IM_END}\n" for role, content in turns)


def paragraphs(text: str) -> list[str]:
    """The text's paragraphs with their line wraps undone, as a user would type them (a text with few blank lines,
    the KJV, has a paragraph a line)."""
    lines = text.split("\n")
    if sum(not line.strip() for line in lines) * 20 < len(lines):  # few blank lines (the KJV): a verse a line
        return [" ".join(line.split()) for line in lines if line.strip()]
    blocks = re.split(r"\n\s*\n", text)
    return [" ".join(p.split()) for p in blocks if p.strip()]


def chat_stream(tok, files: list[Path], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Conversations made of consecutive paragraphs (user, then assistant; Austen's dialogue alternates speakers),
    one after another as ids, and where each starts."""
    ids: list[int] = []
    starts: list[int] = []
    for f in files:
        paras = [p for p in paragraphs(f.read_text(encoding="utf-8")) if 20 <= len(p) <= 600 and not p.isupper()]
        for i in range(0, len(paras) - 1, 2):
            turns = [("user", paras[i]), ("assistant", paras[i + 1])]
            if rng.random() < 0.2:  # some with a system turn, as chat clients send one
                turns.insert(0, ("system", "You are a helpful assistant."))
            starts.append(len(ids))
            ids += tok.encode(render_chat(turns), add_special_tokens=False).ids
    return np.array(ids, dtype=np.int32), np.array(starts, dtype=np.int64)


def encode_files(tok, files: list[Path]) -> np.ndarray:
    """The plain text as one stream of ids, each file ending with </s>."""
    ids: list[int] = []
    for f in files:
        ids += tok.encode(f.read_text(encoding="utf-8"), add_special_tokens=False).ids + [tok.token_to_id(EOS)]
    return np.array(ids, dtype=np.int32)


def batch(text: np.ndarray, chat: np.ndarray, chat_starts: np.ndarray, rng: np.random.Generator, bsz: int, T: int,
          bos: int, chat_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bsz rows of T + 1 ids -> (x, y) of (bsz, T): plain rows are <s> then text from a random point (as a prompt
    is encoded), chat rows start at a conversation (which carries its own <s>)."""
    rows = []
    for s in rng.integers(0, len(text) - T, size=bsz - chat_rows):
        rows.append(np.concatenate([[bos], text[s:s + T]]))
    for c in rng.choice(chat_starts[chat_starts < len(chat) - T - 1], size=chat_rows):
        rows.append(chat[c:c + T + 1])
    ids = torch.from_numpy(np.stack(rows).astype(np.int64))
    return ids[:, :-1], ids[:, 1:]


@torch.no_grad()
def held_out_loss(model, data: np.ndarray, T: int, bos: int, max_windows: int = 64) -> float:
    """Mean next-token loss over non-overlapping windows of the held-out text, each after <s>."""
    model.eval()
    losses = []
    for i in range(min(max_windows, (len(data) - 1) // (T - 1))):
        window = torch.from_numpy(np.concatenate([[bos], data[i * (T - 1):(i + 1) * (T - 1)]]).astype(np.int64))
        window = window.to(next(model.parameters()).device)
        logits = model(window[None, :-1]).logits[0]  # (T - 1, vocab)
        losses.append(F.cross_entropy(logits[1:], window[2:]).item())  # the text's tokens predicted from text
    model.train()
    return float(np.mean(losses))


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return 0.1 * peak + 0.9 * peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def build_model(args, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=args.hidden, intermediate_size=args.mlp,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=args.context,
                         rope_theta=args.rope_theta, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         bos_token_id=SPECIALS.index(BOS), eos_token_id=SPECIALS.index(EOS),
                         attn_implementation="eager")
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="folder of .txt files (persuasion.txt is held out)")
    ap.add_argument("--held-out", type=Path, default=None,
                    help="text whose loss is logged (default: --corpus/persuasion.txt where there is one)")
    ap.add_argument("--out", type=Path, required=True, help="where the checkpoint is written")
    ap.add_argument("--work-dir", type=Path, default=Path(".cache/train-llama"), help="checkpoints for resuming")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=4096, help="tokenizer size, the 256 byte tokens included")
    ap.add_argument("--limit-alphabet", type=int, default=80,
                    help="characters kept as pieces; rarer ones are spelled with byte tokens")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--mlp", type=int, default=512)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--chat-rows", type=int, default=2, help="rows of each batch that are chat-shaped")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on cores other jobs share, two threads spend their time waiting on "
                         "each other)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the shipped sample was trained on cpu)")
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--max-minutes", type=float, default=60.0, help="stop (and save) when this budget is spent")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    if args.device != "cpu":  # cuBLAS is deterministic only with a fixed workspace
        import os
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    files = training_files(args.corpus)
    held_path = args.held_out or args.corpus / HELD_OUT
    tok_path = args.work_dir / "tokenizer.json"
    if tok_path.exists():
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(str(tok_path))
    else:
        tok = train_tokenizer(files, args.vocab, args.limit_alphabet)
        tok.save(str(tok_path))
    bos = tok.token_to_id(BOS)
    ids_path = args.work_dir / "ids.npz"  # the encoded corpus, kept for restarts (encoding takes minutes)
    if ids_path.exists():
        cached = np.load(ids_path)
        text, chat, chat_starts, held = (cached[k] for k in ("text", "chat", "chat_starts", "held"))
    else:
        text = encode_files(tok, files)
        chat, chat_starts = chat_stream(tok, files, np.random.default_rng(args.seed))
        held = encode_files(tok, [held_path]) if held_path.is_file() else text[-64 * args.context:]
        np.savez(ids_path, text=text, chat=chat, chat_starts=chat_starts, held=held)
    print(f"text tokens {len(text):,}  chat tokens {len(chat):,} ({len(chat_starts):,} conversations)  "
          f"held-out tokens {len(held):,}  vocab {tok.get_vocab_size()}", flush=True)

    model = build_model(args, tok.get_vocab_size()).to(args.device)
    print(f"parameters {sum(p.numel() for p in model.parameters()):,}", flush=True)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    ckpt_path = args.work_dir / "checkpoint.pt"
    step, log = 0, []
    rng = np.random.default_rng(args.seed)
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False, map_location=args.device)
        model.load_state_dict(ck["model"])
        if "opt" in ck:  # a finished run's weights alone carry no optimizer state
            opt.load_state_dict(ck["opt"])
        step, log = ck["step"], ck["log"]
        rng.bit_generator.state = ck["rng"]
        print(f"resumed at step {step}", flush=True)

    def save() -> None:
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": log,
                    "rng": rng.bit_generator.state}, tmp)
        tmp.replace(ckpt_path)

    started = time.time()
    model.train()
    while step < args.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        x, y = batch(text, chat, chat_starts, rng, args.batch, args.context, bos, args.chat_rows)
        x, y = x.to(args.device), y.to(args.device)
        logits = model(x).logits  # (batch, context, vocab)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step}/{args.steps} loss {loss.item():.3f} lr {opt.param_groups[0]['lr']:.2e} "
                  f"{(time.time() - started) / 60:.1f} min", flush=True)
        if step % args.save_every == 0 or step == args.steps:
            held_loss = held_out_loss(model, held, args.context, bos)
            log.append({"step": step, "train_loss": round(loss.item(), 4), "held_out_loss": round(held_loss, 4)})
            print(f"step {step}: held-out loss {held_loss:.3f} (ppl {math.exp(held_loss):.1f})", flush=True)
            save()
        if (time.time() - started) / 60 > args.max_minutes:
            print("time budget spent; stopping early", flush=True)
            save()
            break

    model.eval().to("cpu")
    eos_ids = [tok.token_to_id(EOS), tok.token_to_id(IM_END)]
    model.generation_config.bos_token_id = bos
    # both files say the list, as Llama 3.1's instruct checkpoints do (transformers reads generation_config.json,
    # gptedge's export config.json)
    model.config.eos_token_id = model.generation_config.eos_token_id = eos_ids
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    (args.out / "tokenizer.json").write_bytes(tok_path.read_bytes())
    tokenizer_files(args.out, args.context)
    plain_args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}  # paths as JSON strings
    (args.out / "training_log.json").write_text(json.dumps({"args": plain_args, "steps": step, "log": log},
                                                           indent=1) + "\n")
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
