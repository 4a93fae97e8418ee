"""Experiment: a gptedge Llama-style kv_buffer dir rewritten into GenAI's attention form, to time the difference.

gptedge writes, per block, the packed q|k|v projection, a Split, two RotaryEmbedding nodes and GroupQueryAttention
with an attention bias (docs/design.md#the-onnx-io-contract: the bias is what left-padded batches need). ONNX
Runtime GenAI's builder feeds the packed projection straight into GroupQueryAttention with `do_rotary` (the
rotation inside the op, from the same cos / sin caches) and no bias. This writes a copy of DIR in that form (the
weights hard-linked, not copied); at batch 1 with no padding both compute the same logits. Time the two with
benchmarks/decode_step_ab.py:

    python benchmarks/genai_attention_form.py DIR OUT [--keep-bias]
    python benchmarks/decode_step_ab.py DIR OUT --position 96

Results: benchmarks/results/lineage-frontier-2026-11-26c.md. The copy is for timing only: it is not a gptedge dir
its manifest describes (left-padded batches would be wrong), and `load` is not meant to take it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import onnx
from onnx import helper


def rewritten(model: onnx.ModelProto, keep_bias: bool) -> tuple[int, int]:
    """In place: every GroupQueryAttention fed by RotaryEmbedding(q), RotaryEmbedding(k) and a Split's v takes the
    packed projection with do_rotary=1; one already in that form (gptedge's export since the rotary moved inside)
    only loses its attention bias. -> (nodes before, nodes after)."""
    nodes = list(model.graph.node)
    producer = {out: n for n in nodes for out in n.output}
    dropped: set[int] = set()
    for node in nodes:
        if node.op_type != "GroupQueryAttention":
            continue
        if any(a.name == "do_rotary" and a.i == 1 for a in node.attribute):  # already the inside form: the bias only
            if not keep_bias and len(node.input) > 10:
                node.input[10] = ""
            continue
        rot_q, rot_k, split = (producer[node.input[k]] for k in range(3))
        if (rot_q.op_type, rot_k.op_type, split.op_type) != ("RotaryEmbedding", "RotaryEmbedding", "Split"):
            raise SystemExit(f"{node.name}: not fed by RotaryEmbedding, RotaryEmbedding, Split")
        inputs = list(node.input) + [""] * (11 - len(node.input))
        inputs[0:3] = [split.input[0], "", ""]  # packed (B, S, (heads + 2 kv_heads) x head_size)
        inputs[7:9] = rot_q.input[2:4]  # cos_cache, sin_cache
        if not keep_bias:
            inputs[10] = ""
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        node.CopyFrom(helper.make_node("GroupQueryAttention", inputs, list(node.output), name=node.name,
                                       domain=node.domain, do_rotary=1, rotary_interleaved=0, **attrs))
        dropped |= {id(rot_q), id(rot_k), id(split)}
    kept = [n for n in nodes if id(n) not in dropped]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return len(nodes), len(kept)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--keep-bias", action="store_true", help="keep the attention bias input")
    args = ap.parse_args()
    model = onnx.load(str(args.model_dir / "model.onnx"), load_external_data=False)
    before, after = rewritten(model, args.keep_bias)
    args.out.mkdir(parents=True, exist_ok=True)
    for f in args.model_dir.iterdir():  # the weights hard-linked: ONNX Runtime refuses data outside the dir
        if f.is_file() and f.name != "model.onnx" and not (args.out / f.name).exists():
            os.link(f, args.out / f.name)
    onnx.save(model, str(args.out / "model.onnx"))
    print(f"wrote {args.out}: {before} -> {after} nodes")


if __name__ == "__main__":
    main()
