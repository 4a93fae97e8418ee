"""How fast ONNX Runtime's MatMulNBits streams weights at one row (batch-1 decode), by bits, block size, zero
points and accuracy level: a chain of L MatMulNBits (K=768 -> N=3072 -> K=768 ..., GPT-2 small's MLP widths,
seeded random weights, ~60 MB at 8 bits so the chain does not sit in a 32 MB L3), timed in one session per case.
Prints ms per chain and the weight bytes read per second (the figure to hold against the machine's memory
bandwidth: decode at batch 1 reads every weight once per token).

    python benchmarks/matmulnbits_chain.py 8,32,4,1 8,128,4,1 4,32,4,1 [--threads 2] [--layers 24] [--runs 60]

Each case is BITS,BLOCK,ACCURACY_LEVEL,ZERO_POINTS (1: a zero point per block, 0: symmetric).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def chain(bits: int, block: int, level: int, zero_points: bool, layers: int, k: int = 768, n: int = 3072):
    """-> (the model, its weight bytes): layers MatMulNBits, each (1, K) x (K, N) then (1, N) x (N, K)."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        rows, cols = (k, n) if i % 2 == 0 else (n, k)  # K, N of this link
        blocks = rows // block
        w = rng.integers(0, 256, size=(cols, blocks, block * bits // 8), dtype=np.uint8)  # (N, blocks, bytes)
        scales = (rng.random(cols * blocks, dtype=np.float32) * 0.01 + 0.001).astype(np.float32)
        inputs = [x, f"w{i}", f"s{i}"]
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(scales, f"s{i}")]
        if zero_points:  # 8 bits: one byte a block; 4 bits: two blocks a byte
            size = cols * blocks if bits == 8 else cols * ((blocks + 1) // 2)
            inits.append(numpy_helper.from_array(rng.integers(0, 256, size=size, dtype=np.uint8), f"z{i}"))
            inputs.append(f"z{i}")
        nodes.append(helper.make_node("MatMulNBits", inputs, [f"y{i}"], domain="com.microsoft", K=rows, N=cols,
                                      bits=bits, block_size=block, accuracy_level=level))
        x = f"y{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, k])], inits)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    return model, sum(len(t.raw_data) for t in inits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", help="BITS,BLOCK,ACCURACY_LEVEL,ZERO_POINTS")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--runs", type=int, default=60)
    args = ap.parse_args()
    x = np.random.default_rng(1).standard_normal((1, 768)).astype(np.float32)
    print(f"MatMulNBits chain, {args.layers} links, one row, {args.threads} threads, onnxruntime {ort.__version__}")
    print("| bits | block | accuracy level | zero points | MB | ms per chain | GB/s |")
    print("|---:|---:|---:|---|---:|---:|---:|")
    for case in args.cases:
        bits, block, level, zp = (int(v) for v in case.split(","))
        model, size = chain(bits, block, level, bool(zp), args.layers)
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        for _ in range(5):
            session.run(None, {"x": x})
        start = time.perf_counter()
        for _ in range(args.runs):
            session.run(None, {"x": x})
        dt = (time.perf_counter() - start) / args.runs
        print(f"| {bits} | {block} | {level} | {'yes' if zp else 'no'} | {size / 1e6:.0f} | {dt * 1e3:.2f} | "
              f"{size / dt / 1e9:.1f} |", flush=True)


if __name__ == "__main__":
    main()
