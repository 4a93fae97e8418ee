"""The floor memory bandwidth sets under batch-1 decode: the bytes a model dir's linears read per step in ONNX
Runtime's packed layout, the rate this machine streams memory at, and so the shortest step that layout allows
whatever the kernel; beside it llama.cpp's GGUF bytes, and (--per-channel) the dir's linear shapes timed through
MatMulNBits 8-bit and through DynamicQuantizeMatMul (one byte a weight, one activation scale per row) with
seeded random weights: what the one int8 op that reads fewer bytes than MatMulNBits would give.

    python benchmarks/byte_floor.py DIR [DIR...] [--gguf FILE...] [--threads 2] [--per-channel]

Why these bytes: at accuracy level 4 ONNX Runtime (MLAS) prepacks each MatMulNBits block as its bits plus an fp32
scale and an fp32 block sum (8 bytes a block, zero points folded in), so 8-bit blocks of 32 read 40 bytes per 32
weights (1.25 a weight) where llama.cpp's Q8_0 reads 34. A decode step at batch 1 reads every weight once, so
bytes / streaming rate is a floor on the linears' time. A tied GGUF reads about its whole file a step (the
embedding is the head); an untied one reads one embedding row, which this count includes in full.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
from genai_builder_bench import cpu_line, versions  # noqa: E402 - after sys.path

from gptedge.runtime.modeldir.manifest import read_manifest  # noqa: E402 - after sys.path

PACKED_BLOCK_EXTRA = 8  # bytes MLAS adds to each prepacked block: an fp32 scale and an fp32 block sum


def packed_bytes(k: int, n: int, bits: int, block: int) -> int:
    """Bytes ONNX Runtime's prepacked B of one MatMulNBits (K x N, blocks of `block` along K) holds at level 4."""
    return n * math.ceil(k / block) * (block * bits // 8 + PACKED_BLOCK_EXTRA)


def linear_bytes(model: onnx.ModelProto) -> tuple[int, int, dict[str, int]]:
    """-> (bytes a decode step's linears read, their weights, uncounted op types -> count) of a graph: each
    MatMulNBits in its packed layout, each MatMul / Gemm on a float initializer at its element size."""
    inits = {t.name: t for t in model.graph.initializer}
    total = weights = 0
    skipped: dict[str, int] = {}
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "MatMulNBits":
            k, n = attrs["K"], attrs["N"]
            total += packed_bytes(k, n, attrs.get("bits", 4), attrs["block_size"])
            weights += k * n
        elif node.op_type in ("MatMul", "Gemm") and len(node.input) > 1 and node.input[1] in inits:
            t = inits[node.input[1]]
            if len(t.dims) == 2:  # a linear's (K, N) weight; the rotation's (1, b, b) is not one
                count = math.prod(t.dims)
                total += count * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
                weights += count
        elif node.op_type in ("DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulInteger", "QLinearMatMul"):
            skipped[node.op_type] = skipped.get(node.op_type, 0) + 1
    return total, weights, skipped


def stream_gbs(threads: int, mib: int = 512, runs: int = 10) -> float:
    """Median GB/s of a `threads`-thread sum over `mib` MiB of fp32 (torch): the rate the memory streams at."""
    import torch
    torch.set_num_threads(threads)
    x = torch.ones(mib * 2**20 // 4)
    for _ in range(3):
        x.sum()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - started)
    return x.numel() * 4 / float(np.median(times)) / 1e9


def shapes_of(model: onnx.ModelProto) -> list[tuple[int, int]]:
    return [(a["K"], a["N"]) for a in ({x.name: helper.get_attribute_value(x) for x in n.attribute}
                                       for n in model.graph.node if n.op_type == "MatMulNBits")]


def shapes_model(shapes: list[tuple[int, int]], op: str, block: int = 32) -> onnx.ModelProto:
    """One session's worth of linears over `shapes` (K, N), seeded random weights, each fed its (1, K) input:
    op "nbits" (MatMulNBits 8-bit, symmetric, blocks of `block`, level 4) or "per-channel" (DynamicQuantizeMatMul:
    int8 weights with one scale a column, the input rounded to u8 with one scale a row)."""
    rng = np.random.default_rng(0)
    nodes, inits, outputs, widths = [], [], [], sorted({k for k, _ in shapes})
    for i, (k, n) in enumerate(shapes):
        x = f"x{k}"
        if op == "nbits":
            blocks = math.ceil(k / block)
            inits += [numpy_helper.from_array(rng.integers(0, 256, (n, blocks, block), dtype=np.uint8), f"w{i}"),
                      numpy_helper.from_array(rng.random(n * blocks, dtype=np.float32) * 0.01 + 1e-3, f"s{i}")]
            nodes.append(helper.make_node("MatMulNBits", [x, f"w{i}", f"s{i}"], [f"y{i}"], domain="com.microsoft",
                                          K=k, N=n, bits=8, block_size=block, accuracy_level=4))
        else:
            inits += [numpy_helper.from_array(rng.integers(-127, 128, (k, n), dtype=np.int8), f"w{i}"),
                      numpy_helper.from_array(rng.random(n, dtype=np.float32) * 0.01 + 1e-3, f"s{i}"),
                      numpy_helper.from_array(np.zeros(n, np.int8), f"z{i}")]
            nodes.append(helper.make_node("DynamicQuantizeMatMul", [x, f"w{i}", f"s{i}", f"z{i}"], [f"y{i}"],
                                          domain="com.microsoft"))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, n]))
    graph = helper.make_graph(nodes, "shapes", [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, [1, k])
                                                for k in widths], outputs, inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def time_model(model: onnx.ModelProto, threads: int, runs: int) -> float:
    """Median ms of one run of `model` on the CPU with `threads` threads."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.ones([d if isinstance(d, int) else 1 for d in i.shape], np.float32)
             for i in session.get_inputs()}
    for _ in range(5):
        session.run(None, feeds)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - started)
    return float(np.median(times)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="*", help="gptedge model dirs")
    ap.add_argument("--gguf", nargs="*", default=[], help="llama.cpp GGUF files of the same checkpoint")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--mib", type=int, nargs="+", default=[512],
                    help="sizes of the streaming read; the first sets the floor (more: do smaller ones sit in cache)")
    ap.add_argument("--per-channel", action="store_true",
                    help="time the first dir's linear shapes through MatMulNBits 8-bit and DynamicQuantizeMatMul")
    args = ap.parse_args()
    if not args.dirs and not args.gguf:
        ap.error("give at least one model dir or --gguf file")
    print(f"CPU: {cpu_line()}\n{versions()}")
    rates = [stream_gbs(args.threads, mib) for mib in args.mib]
    rate = rates[0]
    print(f"streaming read, {args.threads} threads (torch sum, median of 10): "
          + ", ".join(f"{r:.1f} GB/s over {mib} MiB" for r, mib in zip(rates, args.mib, strict=True)) + "\n")
    print("| model | weights (M) | bytes a step (MB) | bytes / weight | floor at the streaming rate (ms) |")
    print("|---|---:|---:|---:|---:|")
    models = {}
    for d in args.dirs:
        models[d] = onnx.load(str(Path(d) / read_manifest(d).model_file), load_external_data=False)
        total, weights, skipped = linear_bytes(models[d])
        note = "; not counted: " + ", ".join(f"{c} {op}" for op, c in skipped.items()) if skipped else ""
        print(f"| {d}{note} | {weights / 1e6:.1f} | {total / 1e6:.1f} | {total / max(weights, 1):.3f} | "
              f"{total / rate / 1e6:.2f} |")
    for g in args.gguf:
        size = Path(g).stat().st_size
        print(f"| {g} (file) | | {size / 1e6:.1f} | | {size / rate / 1e6:.2f} |")
    if args.per_channel and args.dirs:
        shapes = shapes_of(models[args.dirs[0]])
        weights = sum(k * n for k, n in shapes)
        print(f"\n{args.dirs[0]}'s {len(shapes)} linear shapes, seeded random weights, one session each, "
              f"median of {args.runs} runs:\n")
        print("| op | bytes a step (MB) | ms a step | GB/s | x the streaming rate |")
        print("|---|---:|---:|---:|---:|")
        for label, op, size in (("MatMulNBits 8-bit, blocks of 32, level 4", "nbits",
                                 sum(packed_bytes(k, n, 8, 32) for k, n in shapes)),
                                ("DynamicQuantizeMatMul (int8, a scale a column and a row)", "per-channel",
                                 weights + sum(4 * n for _, n in shapes))):
            ms = time_model(shapes_model(shapes, op), args.threads, args.runs)
            print(f"| {label} | {size / 1e6:.1f} | {ms:.2f} | {size / ms / 1e6:.1f} | "
                  f"{size / ms / 1e6 / rate:.2f} |")


if __name__ == "__main__":
    main()
