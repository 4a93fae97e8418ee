"""lm-evaluation-harness through `gptedge serve` against lm-eval's own `hf` backend, on one checkpoint.

Usage:
    python benchmarks/lm_eval_compare.py CHECKPOINT [--docs 40] [--out benchmarks/results/lm-eval-DATE.md]

CHECKPOINT: a local HF checkpoint dir (the sample model, samples/sample-model, by default). The script exports
its fp32 model dir, starts `gptedge serve` on it, writes a local multiple-choice task from committed text
(samples/eval/austen-novel.jsonl: a passage's first words, and its true ending among CHOICES endings, the others
taken from the next passages; `--docs` passages, the five novels in turn), and runs that task twice with
lm-eval's Python API: `local-completions` against the server (each choice a loglikelihood request,
`echo: true` + `logprobs: 1` + `max_tokens: 1`) and `hf` on the checkpoint (fp32, CPU, batch size 1). It
compares every request's log-likelihood and the task's metrics, and writes a markdown record. Offline only:
HF_HUB_OFFLINE and HF_DATASETS_OFFLINE are set before lm-eval loads.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "samples" / "sample-model"
PASSAGES = ROOT / "samples" / "eval" / "austen-novel.jsonl"
TASK = "austen_endings_mc"
NOVELS = ["emma", "mansfield-park", "northanger-abbey", "pride-and-prejudice", "sense-and-sensibility"]
CHOICES = 4  # endings per passage: its own and three others'
ENDING_WORDS = 8  # words in each ending

TASK_YAML = """task: {task}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: context
doc_to_choice: endings
doc_to_target: gold
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def offline() -> None:
    """No network for lm-eval, datasets or the Hub (set before they are imported)."""
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def task_docs(docs: int) -> list[dict]:
    """docs passages (the novels in turn), each split into a context and its last ENDING_WORDS words; the
    choices are its ending and the next passages' endings, the true one at position i % CHOICES."""
    rows = [json.loads(line) for line in PASSAGES.read_text().splitlines() if line.strip()]
    by_label = {n: [r for r in rows if r["label"] == n] for n in NOVELS}
    picked = [by_label[NOVELS[i % len(NOVELS)]][i // len(NOVELS)]["text"].split() for i in range(docs + CHOICES)]
    out = []
    for i in range(docs):
        others = [" " + " ".join(picked[i + k][-ENDING_WORDS:]) for k in range(1, CHOICES)]
        gold = i % CHOICES
        endings = others[:gold] + [" " + " ".join(picked[i][-ENDING_WORDS:])] + others[gold:]
        out.append({"context": " ".join(picked[i][:-ENDING_WORDS]), "endings": endings, "gold": gold})
    return out


def write_task(folder: Path, docs: int) -> Path:
    """The task's yaml and its data (task_docs) in folder -> folder."""
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "passages.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in task_docs(docs)))
    (folder / f"{TASK}.yaml").write_text(TASK_YAML.format(task=TASK, data=data))
    return folder


def start_serve(model_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """`gptedge serve` on a free port -> (process, base URL) once /health answers."""
    import httpx

    cmd = [sys.executable, "-m", "gptedge.cli", "serve", str(model_dir), "--port", "0", "--host", "127.0.0.1",
           "--device", "cpu", "--model-name", "sample", "--threads", "1"]
    env = {k: v for k, v in os.environ.items() if k != "GPTEDGE_API_KEY"}
    with open(log, "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        found = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
        if found:
            try:
                if httpx.get(f"{found.group(1)}/health", timeout=5).status_code == 200:
                    return proc, found.group(1)
            except httpx.TransportError:
                pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"gptedge serve did not come up:\n{log.read_text()[-2000:]}")


def evaluate(model: str, model_args: str, task_dir: Path) -> dict:
    """One lm-eval run of the task -> its results dict (samples logged)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=[TASK], batch_size=1,
                                   task_manager=TaskManager(include_path=str(task_dir)), log_samples=True)


def loglikelihoods(results: dict) -> list[float]:
    """Every request's log-likelihood, in (doc, choice) order."""
    out = []
    for sample in sorted(results["samples"][TASK], key=lambda s: s["doc_id"]):
        out.extend(float(r[0][0]) for r in sample["resps"])
    return out


def metrics(results: dict) -> dict[str, float]:
    return {k.split(",")[0]: v for k, v in results["results"][TASK].items()
            if k.split(",")[0] in ("acc", "acc_norm")}


def compare(checkpoint: Path, model_dir: Path, docs: int, work: Path) -> dict:
    """Serve model_dir, run both backends -> {requests, max_diff, served, hf} (served / hf: the metrics)."""
    offline()
    task_dir = write_task(work / "task", docs)
    proc, url = start_serve(model_dir, work / "serve.log")
    try:
        served = evaluate("local-completions", f"model=sample,base_url={url}/v1/completions,tokenizer_backend="
                          f"huggingface,tokenizer={checkpoint},tokenized_requests=True,max_length=256,"
                          "num_concurrent=1,max_retries=1", task_dir)
    finally:
        proc.kill()
        proc.wait(30)
    hf = evaluate("hf", f"pretrained={checkpoint},dtype=float32,device=cpu", task_dir)
    a, b = loglikelihoods(served), loglikelihoods(hf)
    if len(a) != len(b):
        raise RuntimeError(f"{len(a)} requests through the server, {len(b)} through hf")
    return {"requests": len(a), "max_diff": max(abs(x - y) for x, y in zip(a, b, strict=True)),
            "served": metrics(served), "hf": metrics(hf)}


def record(result: dict, checkpoint: Path, docs: int, command: str) -> str:
    import lm_eval

    rows = "\n".join(f"| {m} | {result['served'][m]:.4f} | {result['hf'][m]:.4f} |" for m in result["served"])
    return f"""# lm-evaluation-harness through gptedge serve vs lm-eval's hf backend ({time.strftime('%Y-%m-%d')})

lm-eval {lm_eval.__version__}, checkpoint `{checkpoint.relative_to(ROOT) if checkpoint.is_relative_to(ROOT)
                                            else checkpoint.name}` (fp32 export for the server; fp32 PyTorch for
`hf`), CPU, offline. Task `{TASK}`: a local multiple-choice task written from `samples/eval/austen-novel.jsonl`
({docs} passages, the five novels in turn; each passage's first words as the context and {CHOICES} endings of
{ENDING_WORDS} words as the choices: its own and the next passages'), so
{result['requests']} loglikelihood requests; `local-completions` sends each as `echo: true`, `logprobs: 1`,
`max_tokens: 1` with token ids as the prompt.

| metric | gptedge serve (local-completions) | hf |
|---|---|---|
{rows}

Every request's log-likelihood: max |served - hf| = {result['max_diff']:.2e} over {result['requests']} requests
(target 1e-4). Metrics equal: {result['served'] == result['hf']}.

Command: `{command}`
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", type=Path, default=SAMPLE)
    parser.add_argument("--docs", type=int, default=40)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" /
                        f"lm-eval-{time.strftime('%Y-%m-%d')}.md")
    args = parser.parse_args()
    checkpoint = args.checkpoint.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = work / "fp32"
        subprocess.run([sys.executable, "-m", "gptedge.cli", "export", str(checkpoint), "-o", str(model_dir)],
                       check=True, stdout=subprocess.DEVNULL)
        result = compare(checkpoint, model_dir, args.docs, work)
    print(json.dumps(result, indent=1))
    text = record(result, checkpoint, args.docs, "python " + " ".join(sys.argv))
    part = args.out.with_suffix(".part")
    part.write_text(text)
    os.replace(part, args.out)  # written whole or not at all
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
