"""One benchmark row on a GPU, as a JSON line on stdout: gptedge or a peer, one batch size.

Every engine gets the same seeded prompt ids (runtime.bench.bench_prompts), greedy, past eos, and is
timed the same way as `gptedge bench --peers` times its peers: the time to generate 1 token is the
first-token time; decode tok/s = batch x (new - 1) / (time for `new` tokens - first-token time);
the median of --repeat runs after a warm-up. CUDA work is synchronised before each clock read.

    python benchmarks/gpu_peers.py ENGINE --source CKPT --model-dir DIR --batch 8 [--device cuda]

ENGINE: gptedge (CUDA graphs where the dir allows) | gptedge-eager (without) | torch | torch-compile | optimum |
genai. Run by benchmarks/gpu_bench.py, one process
per row, so each row's GPU memory is its own.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gptedge.measure.bench import bench_gptedge, bench_prompts  # noqa: E402 - after the sys.path line above
from gptedge.measure.peers.base import timed as peer_timing  # noqa: E402 - after the sys.path line above
from gptedge.measure.peers.genai import bench_genai  # noqa: E402 - after the sys.path line above


def timed(generate, new_tokens: int, batch: int, repeat: int, sync=lambda: None) -> dict:
    """`gptedge bench --peers`' own timing (gptedge.measure.peers.base.timed), as this script's JSON fields."""
    ttft, rate, runs = peer_timing(generate, new_tokens, batch, repeat, sync)
    return {"ttft_ms": 1000 * ttft, "decode_tok_s": rate, "runs": runs}


def gptedge_row(a, prompts, cuda_graph: bool = True) -> dict:
    row = bench_gptedge(a.model_dir, prompts, a.new, repeat=a.repeat, device=a.device,
                        cuda_graph=cuda_graph)  # `gptedge bench` itself
    graphs = "CUDA graphs" in row.notes
    return {"engine": f"{row.name} ({'CUDA graphs' if graphs else 'no CUDA graphs'})", "load_s": row.load_s,
            "ttft_ms": 1000 * row.ttft_s, "decode_tok_s": row.decode_tok_s, "runs": row.runs, "providers": row.notes}


def torch_row(a, prompts, compile_: bool) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.source, torch_dtype=torch.float16).to(a.device).eval()
    if compile_:  # a static cache and a compiled forward: the transformers recipe for torch.compile
        model.generation_config.cache_implementation = "static"
        # mode="reduce-overhead" (CUDA graphs) fails inside generate here ("accessing tensor output of
        # CUDAGraphs that has been overwritten by a subsequent run"): the default mode
        model.forward = torch.compile(model.forward, fullgraph=True)
    load_s = time.perf_counter() - t0
    ids = torch.tensor(prompts, device=a.device)

    def generate(n: int) -> None:
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0)

    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    row = timed(generate, a.new, len(prompts), a.repeat, sync)
    return {"engine": f"transformers fp16 {'torch.compile' if compile_ else 'eager'}", "load_s": load_s, **row,
            "versions": f"torch {torch.__version__}"}


def optimum_row(a, prompts) -> dict:
    import torch
    from optimum.exporters.onnx import main_export
    from optimum.onnxruntime import ORTModelForCausalLM

    out = Path(a.work) / "optimum-fp16"
    if not (out / "model.onnx").is_file():  # Optimum's own dtype="fp16" export fails to load (LayerNormalization
        # bound to float and float16): export fp32, then ONNX Runtime's fp16 converter, as Optimum's O4 level does
        import shutil

        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        fp32 = Path(a.work) / "optimum-fp32"
        main_export(a.source, fp32, task="text-generation-with-past", device=a.device)
        shutil.copytree(fp32, out, ignore=shutil.ignore_patterns("model.onnx*"))
        half = convert_float_to_float16(onnx.load(str(fp32 / "model.onnx")), keep_io_types=True)
        onnx.save(half, str(out / "model.onnx"))
    t0 = time.perf_counter()
    model = ORTModelForCausalLM.from_pretrained(out, provider="CUDAExecutionProvider" if a.device == "cuda"
                                                else "CPUExecutionProvider", use_io_binding=a.device == "cuda")
    load_s = time.perf_counter() - t0
    ids = torch.tensor(prompts, device=a.device)

    def generate(n: int) -> None:
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0)

    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    return {"engine": "Optimum ORTModelForCausalLM fp16", "load_s": load_s, **timed(generate, a.new, len(prompts),
                                                                                       a.repeat, sync)}


def genai_row(a, prompts) -> dict:
    row = bench_genai(Path(a.model_dir), prompts, a.new, None, a.repeat, device=a.device)
    return {"engine": row.name, "load_s": row.load_s, "ttft_ms": 1000 * row.ttft_s, "decode_tok_s": row.decode_tok_s,
            "runs": row.runs, "versions": row.notes}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("engine", choices=["gptedge", "gptedge-eager", "torch", "torch-compile", "optimum", "genai"])
    ap.add_argument("--source", help="HF checkpoint (torch, optimum)")
    ap.add_argument("--model-dir", help="gptedge model dir (gptedge, genai)")
    ap.add_argument("--work", default="/tmp/gpu-bench", help="scratch (Optimum's export)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vocab", type=int, default=50257)
    a = ap.parse_args()
    prompts = bench_prompts(a.vocab, a.batch, a.prompt)
    rows = {"gptedge": lambda: gptedge_row(a, prompts), "gptedge-eager": lambda: gptedge_row(a, prompts, False),
            "torch": lambda: torch_row(a, prompts, False),
            "torch-compile": lambda: torch_row(a, prompts, True), "optimum": lambda: optimum_row(a, prompts),
            "genai": lambda: genai_row(a, prompts)}
    row = rows[a.engine]()
    print(json.dumps({"batch": a.batch, **row}), flush=True)


if __name__ == "__main__":
    main()
