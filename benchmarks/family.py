"""The GPT-2 family, measured (issue #14): medium (355M), large (774M) and XL (1.5B), end to end.

    python benchmarks/family.py --sizes medium,large,xl --work .cache/family --threads 2 \\
        --out benchmarks/results/family-$(date -u +%F).md          (or: bash benchmarks/run_family.sh)

For each size it builds a seeded random checkpoint once (transformers' save_pretrained, one
model.safetensors, vocab 50257, context 1024: make_gpt2_small.py; reused from --work), then runs
every step as a process of its own, so each step's wall time and peak RSS (the child's ru_maxrss,
from os.wait4) are that step's alone:

    export (kv_buffer graph, validated) -> quantize dynamic / weight-only 8-bit / weight-only 4-bit
    -> generate (greedy, 32 tokens) per variant -> gptedge bench (batch 1, prompt 32, new 128) per variant

It prints one markdown report (machine, versions, date, command, then the tables) and writes it to
--out after each size, so a later size failing keeps the earlier ones; a .json beside it holds every
figure. Step logs go to WORK/logs. Random weights: speed and memory figures only, never quality.

Memory on a 24 GiB machine: export holds the fp32 weights once (the torch reference; the graph's
weights are streamed to model.onnx.data), then frees them before ONNX Runtime loads the graph for
validation, whose prepacked fp32 weights are about 1.1x the file. Measured (/usr/bin/time, max RSS):
GPT-2 medium exports at 2.12 GB (1.49x its 1.42 GB of fp32 weights; the interpreter, torch and ONNX
Runtime themselves are ~0.5 GB of it), large at 3.86 GB (1.25x its 3.10 GB), so XL (6.23 GB) should
peak near 7.5-8 GB. Quantize peaks at the fp32 session it validates against (one session at a time:
3.50 GB for large); generate and bench on fp32 XL ~7 GB; building the XL checkpoint ~7.5 GB (large:
3.75 GB). Disk: about 2.9x the fp32 bytes per size (checkpoint, fp32 dir, three quantized dirs): ~4 GB
medium, ~9 GB large, ~18 GB XL.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"medium": (24, 1024, 16), "large": (36, 1280, 20), "xl": (48, 1600, 25)}  # n_layer, n_embd, n_head
VOCAB, CONTEXT = 50257, 1024
VARIANTS = {  # name -> gptedge quantize options (None: the fp32 export itself)
    "fp32": None,
    "dynamic": ["--method", "dynamic"],
    "weight-only-8": ["--method", "weight-only"],
    "weight-only-4": ["--method", "weight-only", "--bits", "4"],
}
PROMPT = "It is a truth universally acknowledged"
DISK_PER_FP32_BYTE = 2.9  # checkpoint + fp32 dir + dynamic + weight-only 8 + weight-only 4


def n_params(size: str) -> int:
    n_layer, c, _ = SIZES[size]
    return VOCAB * c + CONTEXT * c + n_layer * (12 * c * c + 13 * c) + 2 * c  # GPT-2, tied LM head


@dataclass
class Step:
    wall_s: float
    peak_rss_mib: float


@dataclass
class VariantResult:
    files_mb: float = 0.0
    quantize: Step | None = None
    generate: Step | None = None
    bench: dict = field(default_factory=dict)  # gptedge bench's row: load_s, ttft_s, decode_tok_s, peak_rss_mb
    bench_step: Step | None = None


@dataclass
class SizeResult:
    size: str
    params: int
    fp32_bytes: int
    checkpoint_built: Step | None = None  # None: reused from --work
    export: Step | None = None
    variants: dict[str, VariantResult] = field(default_factory=dict)


class StepFailed(RuntimeError):
    pass


def run_step(argv: list[str], log: Path, env: dict[str, str]) -> tuple[Step, str]:
    """Run one command in a process of its own -> (its wall time and peak RSS, its stdout)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"$ {shlex.join(argv)}", file=sys.stderr, flush=True)
    with open(log, "w+", encoding="utf-8") as err, open(log.with_suffix(".out"), "w+", encoding="utf-8") as out:
        started = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        stdout = out.read()
        err.seek(0)
        lines = err.read().strip().splitlines()
    if proc.returncode != 0:
        raise StepFailed(f"{shlex.join(argv)} exited {proc.returncode}: {lines[-1] if lines else ''} (log: {log})")
    return Step(round(wall, 2), round(usage.ru_maxrss / 1024, 1)), stdout  # ru_maxrss: KiB on Linux


def graph_mb(model_dir: Path) -> float:
    return sum(p.stat().st_size for p in (model_dir / "model.onnx", model_dir / "model.onnx.data") if p.exists()) / 1e6


def checkpoint(size: str, work: Path, seed: int, env: dict[str, str]) -> tuple[Path, Step | None]:
    """WORK/ckpt-SIZE-seedS, built once (into a partial dir renamed when complete) and reused after."""
    ck = work / f"ckpt-{size}-seed{seed}"
    n_layer, n_embd, n_head = SIZES[size]
    if (ck / "model.safetensors").is_file():
        cfg = json.loads((ck / "config.json").read_text(encoding="utf-8"))
        if (cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"]) != (n_layer, n_embd, n_head, VOCAB):
            raise StepFailed(f"{ck} holds another shape; remove it")
        return ck, None
    partial = ck.with_name(ck.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    step, _ = run_step([sys.executable, str(ROOT / "benchmarks" / "make_gpt2_small.py"), "--out", str(partial),
                        "--size", size, "--seed", str(seed)], work / "logs" / f"{size}-checkpoint.log", env)
    partial.rename(ck)
    return ck, step


def check_disk(work: Path, size: str) -> None:
    need = DISK_PER_FP32_BYTE * 4 * n_params(size)
    free = shutil.disk_usage(work).free
    if free < need:
        raise StepFailed(f"{size} needs about {need / 1e9:.0f} GB free in {work}, {free / 1e9:.0f} GB are")


def run_size(size: str, args: argparse.Namespace, env: dict[str, str]) -> SizeResult:
    gptedge = [sys.executable, "-m", "gptedge.cli"]
    threads = ["--threads", str(args.threads)] if args.threads else []
    logs = args.work / "logs"
    check_disk(args.work, size)
    result = SizeResult(size, n_params(size), 4 * n_params(size))
    ck, result.checkpoint_built = checkpoint(size, args.work, args.seed, env)
    dirs = {v: args.work / size / v for v in VARIANTS}
    result.export, _ = run_step(gptedge + ["export", str(ck), "-o", str(dirs["fp32"]), "--graph", "kv_buffer",
                                           "--force"], logs / f"{size}-export.log", env)
    for variant, options in VARIANTS.items():
        r = result.variants[variant] = VariantResult()
        if options is not None:
            r.quantize, _ = run_step(gptedge + ["quantize", str(dirs["fp32"]), "-o", str(dirs[variant]), *options,
                                                "--force"], logs / f"{size}-quantize-{variant}.log", env)
        r.files_mb = round(graph_mb(dirs[variant]), 1)
        r.generate, _ = run_step(gptedge + ["generate", str(dirs[variant]), "-p", PROMPT, "-n", "32", "--greedy",
                                            *threads], logs / f"{size}-generate-{variant}.log", env)
        r.bench_step, out = run_step(gptedge + ["bench", str(dirs[variant]), "--prompt", "32", "--new", "128",
                                                "--batch", "1", "--repeat", str(args.repeat), *threads, "--json"],
                                     logs / f"{size}-bench-{variant}.log", env)
        r.bench = json.loads(out)["rows"][0]
    return result


def machine_facts(args: argparse.Namespace) -> list[str]:
    cpu = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        cpu = fields.get("Model name", cpu).strip()
        flags = set(fields.get("Flags", "").split())
    except (OSError, subprocess.CalledProcessError):
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8") if f in flags]

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "absent"

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [f"- date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
            f"- command: `{shlex.join([Path(sys.executable).name, *sys.argv])}`",
            f"- CPU: {cpu}; {os.cpu_count()} logical CPUs; ISA: {', '.join(isa) or 'none of avx2/avx512/vnni/amx'}; "
            f"memory {mem:.1f} GiB",
            f"- python {platform.python_version()}, torch {version('torch')}, onnxruntime {version('onnxruntime')}, "
            f"transformers {version('transformers')}, onnx {version('onnx')}",
            f"- threads: {args.threads or f'gptedge default ({os.cpu_count()})'}; bench median of {args.repeat}; "
            f"checkpoints: random weights, seed {args.seed}"]


def gib(mib: float) -> str:
    return f"{mib / 1024:.2f}"


def report(results: list[SizeResult], facts: list[str]) -> str:
    lines = ["# GPT-2 family: export, quantize, generate, bench", "", *facts, "",
             "## Export (kv_buffer graph, validated), one process", "",
             "| size | parameters | fp32 weights GB | export wall s | export peak RSS GiB | peak RSS / fp32 weights |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        ratio = r.export.peak_rss_mib * 2**20 / r.fp32_bytes
        lines.append(f"| {r.size} | {r.params / 1e6:.0f}M | {r.fp32_bytes / 1e9:.2f} | {r.export.wall_s:.1f} | "
                     f"{gib(r.export.peak_rss_mib)} | {ratio:.2f}x |")
    lines += ["", "## Variants: files, quantize, generate (greedy, 32 tokens), bench (batch 1, prompt 32, new 128)", "",
              "| size | variant | files MB | quantize wall s | quantize peak RSS GiB | generate peak RSS GiB | "
              "load s | first token ms | decode tok/s | bench peak RSS GiB |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        for name, v in r.variants.items():
            q = (f"{v.quantize.wall_s:.1f} | {gib(v.quantize.peak_rss_mib)}") if v.quantize else "- | -"
            b = v.bench
            lines.append(f"| {r.size} | {name} | {v.files_mb:.1f} | {q} | {gib(v.generate.peak_rss_mib)} | "
                         f"{b['load_s']:.2f} | {1000 * b['ttft_s']:.0f} | {b['decode_tok_s']:.1f} | "
                         f"{gib(v.bench_step.peak_rss_mib)} |")
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="medium,large,xl", help="comma-separated: medium, large, xl")
    ap.add_argument("--work", type=Path, default=ROOT / ".cache" / "family", help="checkpoints (reused) and model dirs")
    ap.add_argument("--threads", type=int, default=None, help="ONNX Runtime / torch threads (default: every CPU)")
    ap.add_argument("--repeat", type=int, default=3, help="bench repeats (median)")
    ap.add_argument("--seed", type=int, default=0, help="checkpoint seed")
    ap.add_argument("--out", type=Path, required=True, help="markdown report (a .json with every figure beside it)")
    args = ap.parse_args(argv)
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    bad = [s for s in args.sizes if s not in SIZES]
    if bad or not args.sizes:
        ap.error(f"--sizes: {', '.join(bad) or 'none given'}: choose from {', '.join(SIZES)}")
    if args.threads is not None and not 1 <= args.threads <= (os.cpu_count() or 1):
        ap.error(f"--threads must be in 1..{os.cpu_count()}")
    if args.repeat < 1:
        ap.error("--repeat must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.threads:  # export and quantize run torch / numpy: the same thread count as ONNX Runtime
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    facts = machine_facts(args)
    results: list[SizeResult] = []
    try:
        for size in args.sizes:
            results.append(run_size(size, args, env))
            text = report(results, facts)
            write_atomic(args.out, text)
            write_atomic(args.out.with_suffix(".json"), json.dumps([asdict(r) for r in results], indent=2) + "\n")
    except StepFailed as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    print(report(results, facts), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
