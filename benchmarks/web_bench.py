"""gptedge in a web browser against what transformers.js users run today: one headless Chromium, WASM.

For one HF checkpoint it makes (or reuses, under --work) gptedge's dirs (fp32, dynamic INT8, weight-only 8-bit,
4-bit; standard graph) packed with `gptedge pack --target web`, and Optimum's export of the same checkpoint (fp32
and its dynamic INT8, `model_quantized.onnx`: transformers.js' q8) in transformers.js' layout. Then, in one
Chromium (Debian's, driven by Playwright; pages served from 127.0.0.1 with cross-origin isolation, so WASM gets
--threads threads), the playground's own module (transformers.js on onnxruntime-web) loads each graph and
- generates greedily from a --prompt-token prompt for --new tokens (eos held back: a fixed length), --repeat
  times: first-token ms and decode tok/s (the tokens after the first over the time from the first to the last),
  the median;
- generates 3 prompts x 32 tokens greedily: greedy agreement with gptedge's Python runtime on the same graph
  (mean matching prefix; Optimum's rows against gptedge's fp32, as the reference it should agree with);
and reports the graph's download size. KL(fp32||q) and top-1 agreement come from `gptedge compare` (Python,
ONNX Runtime) on --text, Optimum's q8 dir included. The last lines state the target (docs/performance.md#targets): the
recommended web recipe >= 1.5x Optimum q8's tok/s, at no larger size and no higher KL.

    python benchmarks/web_bench.py samples/sample-model --work out/web-bench/sample
    python benchmarks/make_gpt2_small.py --out .cache/gpt2-small-random
    python benchmarks/web_bench.py .cache/gpt2-small-random --work out/web-bench/gpt2-small --markdown FILE
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import http.server
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
from web_clients import CHROMIUM, chromium_args  # noqa: E402  (one launch recipe for the tests and this)

GPTEDGE = [sys.executable, "-m", "gptedge.cli"]
RECIPES = {"fp32": None, "dynamic": ["--method", "dynamic"], "w8": ["--method", "weight-only"],
           "w4": ["--method", "weight-only", "--bits", "4"],
           # dynamic INT8 with one activation scale per tensor: one fused DynamicQuantizeMatMul per linear instead of
           # the per-row scale's handful of ops (batch-1 decode has one row, so its numbers are the same)
           "dynamic-pt": ["--method", "dynamic", "--activation-scale", "per-tensor"]}
PACKED = ("fp32", "dynamic", "w8", "w4")  # site/gptedge; dynamic-pt (also q8) in site/gptedge-pt
AGREE_PROMPTS = ["It is a truth universally acknowledged, that", "The", "Hello"]
MEDIA = {".js": "text/javascript", ".mjs": "text/javascript", ".wasm": "application/wasm", ".json": "application/json",
         ".html": "text/html"}


def run(cmd: list[str]) -> str:
    print("+", " ".join(map(str, cmd)), file=sys.stderr)
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout


def build(checkpoint: Path, work: Path) -> Path:
    """gptedge dirs, their web pack, and Optimum's transformers.js folder under work/ (reused when present)."""
    for name, args in RECIPES.items():
        if not (work / name / "gptedge.json").is_file():
            run(GPTEDGE + (["export", str(checkpoint), "-o", str(work / name), "--force"] if args is None else
                           ["quantize", str(work / "fp32"), "-o", str(work / name), "--force", *args]))
    site = work / "site"
    if not (site / "gptedge" / "gptedge-pack.json").is_file():
        run(GPTEDGE + ["pack", *(str(work / n) for n in PACKED), "--target", "web", "-o", str(site / "gptedge"),
                       "--force"])
    if not (site / "gptedge-pt" / "gptedge-pack.json").is_file():
        run(GPTEDGE + ["pack", str(work / "dynamic-pt"), "--target", "web", "-o", str(site / "gptedge-pt"),
                       "--no-page", "--force"])
    optimum = site / "optimum"
    if not (optimum / "onnx" / "model_quantized.onnx").is_file():
        from gptedge.measure.peers.optimum import optimum_model_dir

        fp32 = optimum_model_dir(checkpoint, False, work / "optimum-export")
        q8 = optimum_model_dir(checkpoint, True, work / "optimum-export")
        (optimum / "onnx").mkdir(parents=True, exist_ok=True)
        for f in fp32.glob("model.onnx*"):  # the graph and, past 2 GB, its data (Optimum names it model.onnx_data,
            shutil.copyfile(f, optimum / "onnx" / f.name)  # as transformers.js does)
        shutil.copyfile(next(q8.glob("*.onnx")), optimum / "onnx" / "model_quantized.onnx")
        shutil.copyfile(fp32 / "config.json", optimum / "config.json")
        for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(site / "gptedge" / name, optimum / name)  # the same tokenizer; Optimum's dir has none
    return site


class Handler(http.server.SimpleHTTPRequestHandler):
    def end_headers(self) -> None:
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def guess_type(self, path) -> str:
        return MEDIA.get(Path(str(path)).suffix, "application/octet-stream")

    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def static_server(root: Path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


RUN_JS = """async ([base, dtype, prompt, newTokens, repeat, agreePrompts, threads]) => {
  const m = await import('./playground.js');
  const runtime = await m.configureRuntime({ wasmPaths: new URL('vendor/onnxruntime-web/dist/', location.href).href,
                                              threads });
  const t0 = performance.now();
  const loaded = await m.loadModel(base, { dtype });
  const loadMs = performance.now() - t0;
  await m.generateLocal(loaded, prompt, { maxNewTokens: 4, minNewTokens: 4 });  // warm-up
  const runs = [];
  for (let i = 0; i < repeat; i++) {
    const r = await m.generateLocal(loaded, prompt, { maxNewTokens: newTokens, minNewTokens: newTokens });
    runs.push({ firstTokenMs: r.firstTokenMs, decodeTokPerS: r.decodeTokPerS, tokens: r.ids.length });
  }
  const greedy = [];
  for (const p of agreePrompts) greedy.push((await m.generateLocal(loaded, p, { maxNewTokens: 32 })).ids);
  await loaded.model.dispose();
  return { loadMs, runs, greedy, threads: runtime.threads, userAgent: navigator.userAgent };
}"""


def browser_rows(url: str, plan: list[tuple[str, str, str]], prompt: list[int], new: int, repeat: int,
                 threads: int) -> list[dict]:
    from playwright.sync_api import sync_playwright

    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=chromium_args())
        for label, folder, dtype in plan:
            page = browser.new_page()
            page.goto(f"{url}/gptedge/playground/index.html")
            page.wait_for_selector("body[data-ready=true]", timeout=120_000)
            print(f"  {label} ...", file=sys.stderr)
            result = page.evaluate(RUN_JS, [f"/{folder}/", dtype, prompt, new, repeat, AGREE_PROMPTS, threads])
            rows.append({"label": label, "folder": folder, "dtype": dtype, **result,
                         "first_token_ms": statistics.median(r["firstTokenMs"] for r in result["runs"]),
                         "decode_tok_s": statistics.median(r["decodeTokPerS"] for r in result["runs"])})
            page.close()
        browser.close()
    return rows


def python_greedy(model_dir: Path) -> list[list[int]]:
    import gptedge.runtime

    model = gptedge.runtime.load(model_dir, device="cpu")
    return [model.generate(p, max_new_tokens=32, greedy=True).ids for p in AGREE_PROMPTS]


def agreement(ours: list[list[int]], ref: list[list[int]]) -> float:
    """Mean length of the matching prefix over the reference length (compare's greedy agreement)."""
    def prefix(a, b):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n
    return statistics.mean(prefix(a, b) / max(1, len(b)) for a, b in zip(ours, ref, strict=False))


def graph_bytes(folder: Path, dtype: str) -> int:
    from gptedge.runtime.modeldir.web_ready import DTYPE_SUFFIX

    stem = f"model{DTYPE_SUFFIX[dtype]}.onnx"
    return sum(f.stat().st_size for f in (folder / "onnx").iterdir() if f.name in (stem, stem + "_data"))


def kl_table(work: Path, text: Path, max_tokens: int) -> dict[str, dict]:
    """KL(fp32||q) and top-1 agreement of each quantized dir, Optimum's q8 among them (Python, ONNX Runtime)."""
    optimum = work / "optimum-q8"  # gptedge's runtime reads model.onnx (+ tokenizer.json) of an Optimum dir
    if not (optimum / "model.onnx").is_file():
        optimum.mkdir(exist_ok=True)
        shutil.copyfile(work / "site" / "optimum" / "onnx" / "model_quantized.onnx", optimum / "model.onnx")
        for name in ("config.json", "tokenizer.json", "generation_config.json"):
            shutil.copyfile(work / "site" / "optimum" / name, optimum / name)
    out = run(GPTEDGE + ["compare", str(work / "fp32"), *(str(work / n) for n in ("dynamic", "w8", "w4", "dynamic-pt")),
                         str(optimum), "--text", str(text), "--max-tokens", str(max_tokens), "--prompts", "2",
                         "--new-tokens", "8", "--device", "cpu", "--json"])
    by_dir = {Path(r["model"]).name: r for r in json.loads(out)}
    return {"fp32": by_dir.get("fp32", {}), "q8": by_dir["dynamic"], "int8": by_dir["w8"], "q4": by_dir["w4"],
            "q8 per-tensor": by_dir["dynamic-pt"], "optimum q8": by_dir["optimum-q8"]}


def setup_lines(rows: list[dict], threads: int) -> list[str]:
    from gptedge.pack.js_deps import versions

    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    flags = Path("/proc/cpuinfo").read_text()
    isa = [f for f in ("avx2", "avx512_vnni", "amx_tile") if f" {f}" in flags]
    chromium = subprocess.run([CHROMIUM, "--version"], capture_output=True, text=True).stdout.strip()
    return [f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
            f"machine: {cpu}, {os.cpu_count()} cpus, ISA {' '.join(isa) or 'baseline'}",
            f"browser: {chromium} (headless, WASM, {threads} threads asked, {rows[0]['threads']} used)",
            f"packages: {', '.join(f'{k} {v}' for k, v in versions().items())}",
            f"command: {' '.join(sys.argv)}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", type=Path, help="HF checkpoint dir (gpt2)")
    ap.add_argument("--work", type=Path, required=True, help="where the dirs are made (and reused)")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="WASM threads (the page is cross-origin isolated)")
    ap.add_argument("--text", type=Path, default=ROOT / "samples/eval/persuasion_ch1-7.txt")
    ap.add_argument("--kl-tokens", type=int, default=8192, help="tokens of --text for KL (gptedge compare)")
    ap.add_argument("--markdown", type=Path, help="also write the table and setup here")
    args = ap.parse_args()
    site = build(args.checkpoint, args.work)
    with open(site / "gptedge" / "config.json") as f:
        vocab = json.load(f)["vocab_size"]
    prompt = [(7 * i + 11) % vocab for i in range(args.prompt_tokens)]  # bench_prompts' kind: fixed, in-vocab ids
    plan = [("Optimum fp32", "optimum", "fp32"), ("Optimum q8", "optimum", "q8")] + [
        (f"gptedge {d}", "gptedge", d) for d in ("fp32", "q8", "int8", "q4")] + [
        ("gptedge q8 per-tensor", "gptedge-pt", "q8")]
    kl = kl_table(args.work, args.text, args.kl_tokens)
    with static_server(site) as url:
        rows = browser_rows(url, plan, prompt, args.new, args.repeat, args.threads)
    (args.work / "browser-rows.json").write_text(json.dumps(rows, indent=1))
    ref = {"fp32": python_greedy(args.work / "fp32"), "q8": python_greedy(args.work / "dynamic"),
           "int8": python_greedy(args.work / "w8"), "q4": python_greedy(args.work / "w4"),
           "q8 per-tensor": python_greedy(args.work / "dynamic-pt")}
    lines = ["| engine | graph | download MB | first token ms | decode tok/s | greedy agreement with gptedge Python | "
             "KL(fp32‖q) | top-1 |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        key = {"gptedge": r["dtype"], "gptedge-pt": "q8 per-tensor"}.get(r["folder"])
        r["bytes"] = graph_bytes(site / r["folder"], r["dtype"])
        r["agreement"] = agreement(r["greedy"], ref[key or "fp32"])
        k = kl.get(key or ("optimum q8" if r["dtype"] == "q8" else "fp32"), {})
        r["kl"], r["top1"] = k.get("kl", 0.0), k.get("top1_agreement", 1.0)
        lines.append(f"| {r['label']} | {r['dtype']} | {r['bytes'] / 1e6:.1f} | {r['first_token_ms']:.0f} | "
                     f"{r['decode_tok_s']:.1f} | {r['agreement']:.1%} | {r['kl']:.5f} | {r['top1']:.2%} |")
    anchor = next(r for r in rows if r["label"] == "Optimum q8")
    recommended = json.loads((site / "gptedge" / "gptedge-pack.json").read_text())["recommended"]
    lines.append("")
    for best in (next(r for r in rows if r["folder"] == "gptedge" and r["dtype"] == recommended),
                 next(r for r in rows if r["folder"] == "gptedge-pt")):
        ratio = best["decode_tok_s"] / anchor["decode_tok_s"]
        met = ratio >= 1.5 and best["bytes"] <= anchor["bytes"] and best["kl"] <= anchor["kl"]
        lines.append(f"target: {best['label']} (web dtype {recommended}) >= 1.5x Optimum q8's decode tok/s at no "
                     f"larger size and no higher KL: {ratio:.2f}x, {best['bytes'] / 1e6:.1f} vs "
                     f"{anchor['bytes'] / 1e6:.1f} MB, KL {best['kl']:.5f} vs {anchor['kl']:.5f}: "
                     f"{'MET' if met else 'MISSED'}")
    text = "\n".join(setup_lines(rows, args.threads) + [""] + lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
