"""The GPU benchmark (benchmarks/run_gpu.sh): gptedge fp16 and weight-only INT8 (fp16 activations) against
transformers (eager, torch.compile), Optimum and ONNX Runtime GenAI on one GPU.

Per size: a seeded checkpoint (make_gpt2_small.py), exported to a kv_buffer fp32 dir on the CPU, halved
(quantize --method fp16) and weight-only quantized (--float16); then one process per (engine, batch)
row (gpu_peers.py), while this process samples that process's GPU memory with nvidia-smi.

    python benchmarks/gpu_bench.py --work /tmp/gpu --sizes small --batches 1,8,64 --out results.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}


def sh(*cmd: str, timeout: float = 1800) -> str:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=timeout)
    if r.returncode:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... failed: {r.stderr.strip().splitlines()[-1:]}")
    print(f"  {time.perf_counter() - t0:6.1f}s  {' '.join(cmd[1:5])}", file=sys.stderr, flush=True)
    return r.stdout


def gpu_mib(pid: int) -> float:
    """GPU memory that process `pid` holds now (MiB), from nvidia-smi; 0 when it holds none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0.0
    return sum(float(m) for p, m in (line.split(",") for line in out.splitlines() if "," in line) if int(p) == pid)


def row(args: list[str], timeout: float) -> dict:
    """Run one gpu_peers.py row; -> its JSON with the peak GPU memory sampled every 0.2 s."""
    proc = subprocess.Popen([sys.executable, str(HERE / "gpu_peers.py"), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    peak = [0.0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], gpu_mib(proc.pid))
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return {"error": f"timed out after {timeout:.0f}s"}
    sampler.join()
    if proc.returncode:
        return {"error": (err.strip().splitlines() or ["?"])[-1][:300]}
    warnings = [line[:300] for line in err.splitlines() if "WARNING" in line or "CUDA graph" in line][-3:]
    return {**json.loads(out.strip().splitlines()[-1]), "gpu_peak_mib": peak[0],
            **({"warnings": warnings} if warnings else {})}


def prepare(size: str, work: Path, targets: tuple[str, ...] = ("fp16", "int8 weight-only")) -> dict[str, Path]:
    ck, fp32 = work / f"{size}-ckpt", work / f"{size}-fp32"
    dirs = {"fp16": work / f"{size}-fp16", "int8 weight-only": work / f"{size}-wo8-fp16"}
    if not ck.is_dir():
        sh(sys.executable, str(HERE / "make_gpt2_small.py"), "--out", str(ck), "--size", size)
    cli = [sys.executable, "-m", "gptedge.cli"]
    if not fp32.is_dir():
        sh(*cli, "export", str(ck), "-o", str(fp32), "--graph", "kv_buffer")
    if not dirs["fp16"].is_dir():
        sh(*cli, "quantize", str(fp32), "-o", str(dirs["fp16"]), "--method", "fp16")
    if "int8 weight-only" in targets and not dirs["int8 weight-only"].is_dir():
        sh(*cli, "quantize", str(fp32), "-o", str(dirs["int8 weight-only"]), "--method", "weight-only", "--float16")
    return {"ckpt": ck, **dirs}


def machine() -> dict:
    import onnxruntime

    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    smi = run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
    cuda = run("nvidia-smi")
    cuda = next((line.split("CUDA Version:")[1].split("|")[0].strip() for line in cuda.splitlines()
                 if "CUDA Version" in line), "?")
    return {"gpu": smi, "cuda_driver_api": cuda, "onnxruntime": onnxruntime.__version__,
            "python": platform.python_version(), "date": time.strftime("%Y-%m-%d"), "cpu": platform.processor()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/gpu-bench"))
    ap.add_argument("--sizes", default="small")
    ap.add_argument("--batches", default="1,8,64")
    ap.add_argument("--engines", default="gptedge,genai,optimum,torch,torch-compile")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--row-timeout", type=float, default=300)
    ap.add_argument("--targets", default="fp16,int8 weight-only",
                    help="gptedge's dirs to time (XL on a short lease: fp16 only; its int8 quantize takes minutes)")
    ap.add_argument("--out", type=Path, required=True, help="JSON lines, one per row (appended)")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    with a.out.open("a") as f:
        f.write(json.dumps({"machine": machine(), "argv": sys.argv}) + "\n")
    for size in a.sizes.split(","):
        wanted = tuple(a.targets.split(","))
        dirs = prepare(size, a.work, wanted)
        for batch in map(int, a.batches.split(",")):
            for engine in a.engines.split(","):
                targets = {"gptedge": list(wanted), "gptedge-eager": list(wanted),
                           "genai": ["fp16"]}.get(engine, ["ckpt"])
                for target in targets:
                    args = [engine, "--batch", str(batch), "--repeat", str(a.repeat), "--work", str(a.work / size),
                            "--source", str(dirs["ckpt"]), "--model-dir", str(dirs.get(target, dirs["fp16"]))]
                    result = {"size": size, "engine": engine, "target": target, **row(args, a.row_timeout)}
                    print(json.dumps(result), flush=True)
                    with a.out.open("a") as f:
                        f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
