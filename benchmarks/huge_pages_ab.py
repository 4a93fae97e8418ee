"""Decode tok/s of model dirs with their weights on huge pages and without (SessionConfig(huge_pages=...)), side by
side in one process, rounds interleaved, optionally beside llama.cpp's quantizations of the same checkpoint
(llama-cpp-python; $GPTEDGE_LLAMA_CPP_SOURCE as for `compare --peers llama.cpp`). Batch 1, greedy, seeded random
prompts, every engine's first token excluded from its rate. --linears adds, per dir, a row of its MatMulNBits
alone (every other op removed, each node fed a fixed row): what the linears' kernel leaves for a step that does
nothing else, the ceiling of the dir's tok/s in the same minute. --floor adds, per dir, the steps/s its linears
would run at if they read their packed bytes at this machine's streaming rate (measured each round; byte_floor.py),
and after the table the dir's tok/s with its linears at that floor and every other op as measured, against each
llama.cpp row: the most a faster kernel could give the same layout.

    python benchmarks/huge_pages_ab.py DIR [DIR...] [--checkpoint CKPT --recipes Q8_0,Q4_K_M] [--prompt 32]
        [--new 128] [--rounds 4] [--threads 2] [--huge-pages both|on|off] [--linears [--floor]] [--work WORK]

Prints each round and, per engine, the median; each dir's on / off ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import time

import numpy as np
import onnx
from onnx import helper

from gptedge.runtime import SessionConfig, load
from gptedge.runtime.graphs.session import make_session
from gptedge.runtime.modeldir.manifest import read_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from byte_floor import linear_bytes, stream_gbs  # noqa: E402 - after the sys.path line above


def linears_alone(model_dir: str, threads: int, new: int, huge_pages: bool, scratch: Path):
    """-> a function (prompt ids, unused) -> steps/s of a session holding only the dir's MatMulNBits, each reading
    a fixed (1, K) row of its activation type (its scales' type: fp32, or fp16 in a --float16 dir), with the dir's
    own weights (on huge pages or not, as the dirs' rows); a run = one step's linears. None (the dir's row left out,
    with a line saying why) where a MatMulNBits reads weights no initializer holds. The session's model is written
    under `scratch` with its weights as external data (no 2 GB protobuf limit)."""
    model = onnx.load(str(Path(model_dir) / read_manifest(model_dir).model_file))  # external data read in
    nodes = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    inits = {t.name: t for t in model.graph.initializer}
    used = {name for n in nodes for name in n.input[1:] if name}
    if not nodes or not used <= set(inits):
        print(f"{model_dir}: no linears-alone row (no MatMulNBits, or one reads weights no initializer holds)")
        return None
    rows: dict[str, np.ndarray] = {}
    for n in nodes:  # input 0 becomes a graph input per (K, type)
        k = next(helper.get_attribute_value(a) for a in n.attribute if a.name == "K")
        elem = inits[n.input[2]].data_type
        n.input[0] = f"row{k}_{elem}"
        row = np.random.default_rng(k).standard_normal((1, k))
        rows[n.input[0]] = row.astype(helper.tensor_dtype_to_np_dtype(elem))
    graph = helper.make_graph(
        nodes, "linears", [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(row.dtype), row.shape)
                           for name, row in rows.items()],
        [helper.make_tensor_value_info(n.output[0], inits[n.input[2]].data_type, None) for n in nodes],
        [inits[name] for name in sorted(used)])
    alone = helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    path = Path(tempfile.mkdtemp(prefix="linears-", dir=scratch)) / "linears.onnx"  # one folder a dir: no clash
    onnx.save(alone, str(path), save_as_external_data=True, location="linears.onnx.data")
    session = make_session(str(path), "cpu", SessionConfig(threads=threads, huge_pages=huge_pages))

    def run(_prompt) -> float:
        started = time.perf_counter()
        for _ in range(new):
            session.run(None, rows)
        return new / (time.perf_counter() - started)
    return run


def engines(args) -> tuple[dict, int]:
    """-> (name -> a function (prompt ids) -> decode tok/s, the vocabulary size): the dirs off then on, then the
    llama.cpp recipes."""
    out, vocab, context = {}, None, None
    for d in args.dirs:
        for on in {"both": (False, True), "on": (True,), "off": (False,)}[args.huge_pages]:
            model = load(d, device="cpu", session=SessionConfig(threads=args.threads, huge_pages=on))
            vocab, context = model.manifest.shape.vocab_size, model.manifest.shape.context_length
            out[f"{Path(d).name} huge pages {'on' if on else 'off'}"] = (
                lambda p, m=model: m.generate(p, max_new_tokens=args.new, greedy=True, with_text=False,
                                              ignore_eos=True).tokens_per_s)
        if args.linears and (alone := linears_alone(d, args.threads, args.new, args.huge_pages != "off",
                                                    args.work)) is not None:  # with both: on huge pages
            out[f"{Path(d).name} linears alone{' (huge pages on)' if args.huge_pages == 'both' else ''}"] = alone
            if args.floor:
                size = linear_bytes(onnx.load(str(Path(d) / read_manifest(d).model_file), load_external_data=False))[0]
                out[f"{Path(d).name} floor"] = lambda _p, b=size: stream_gbs(args.threads, runs=3) * 1e9 / b
    if args.checkpoint:
        from gptedge.measure.peers import llama_cpp

        f32 = llama_cpp.convert_to_gguf(args.checkpoint, args.work)
        for recipe in args.recipes.split(","):
            peer = llama_cpp.LlamaCppScorer(llama_cpp.quantize_gguf(f32, recipe, args.threads), recipe,
                                            args.threads, vocab, context)  # as compare
            out[f"llama.cpp {recipe}"] = lambda p, s=peer: s.greedy(p, args.new, None).tokens_per_s
    return out, vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--checkpoint", type=Path, help="the HF checkpoint the dirs came from, for llama.cpp rows")
    ap.add_argument("--recipes", default="Q8_0,Q4_K_M")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--huge-pages", choices=("both", "on", "off"), default="both",
                    help="both: each dir twice, off then on; on / off: once (llama.cpp side by side with one mode)")
    ap.add_argument("--linears", action="store_true", help="a row per dir of its MatMulNBits alone (steps/s)")
    ap.add_argument("--floor", action="store_true", help="with --linears: a row per dir of its linears at the "
                    "machine's streaming rate (steps/s), and the dir's tok/s with its linears there")
    ap.add_argument("--work", type=Path, help="where llama.cpp's GGUFs and --linears' models are written (default: a "
                    "temporary folder)")
    args = ap.parse_args()
    if args.floor and not args.linears:
        ap.error("--floor needs --linears (the floor replaces the linears' measured time)")
    with tempfile.TemporaryDirectory() as tmp:
        args.work = args.work or Path(tmp)
        args.work.mkdir(parents=True, exist_ok=True)
        runs, vocab = engines(args)
        rng = np.random.default_rng(0)
        prompts = [rng.integers(100, vocab - 100, args.prompt).tolist() for _ in range(2)]
        for run in runs.values():  # warm: the first run of each engine allocates its buffers
            run(prompts[0][:8])
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for r in range(args.rounds):
            for name, run in runs.items():
                rates[name].append(float(np.mean([run(p) for p in prompts])))
            print(f"round {r + 1}: " + "; ".join(f"{n} {v[-1]:.1f}" for n, v in rates.items()), flush=True)
    print(f"\n{args.prompt} + {args.new}, batch 1, {args.threads} threads, {args.rounds} rounds (decode tok/s)")
    print("| engine | median | rounds | on / off (median of rounds) |\n|---|---:|---|---:|")
    for name, row in rates.items():
        ratio = ""
        if name.endswith(" on") and name[:-2] + "off" in rates:
            off = rates[name[:-2] + "off"]
            ratio = f"{np.median([a / b for a, b in zip(row, off, strict=True)]):.2f}x"
        print(f"| {name} | {np.median(row):.1f} | {' / '.join(f'{x:.1f}' for x in row)} | {ratio} |")
    print_floors(rates)


def print_floors(rates: dict[str, list[float]]) -> None:
    """Per dir with a floor row: each round's tok/s had its linears run at the floor (1 / (1/step - 1/linears +
    1/floor): the other ops' time as measured), its median, and the median of its per-round ratios to each llama.cpp
    row."""
    peers = {n: v for n, v in rates.items() if n.startswith("llama.cpp ")}
    for name in [n for n in rates if n.endswith(" floor")]:
        d = name.removesuffix(" floor")
        steps = [n for n in rates if n.startswith(f"{d} huge pages")]  # the "on" row, as the linears ran
        step = rates[max(steps, key=lambda n: n.endswith(" on"))] if steps else None
        alone = next(v for n, v in rates.items() if n.startswith(f"{d} linears alone"))
        if step is None:
            continue
        at_floor = [1 / (1 / s - 1 / a + 1 / f) for s, a, f in zip(step, alone, rates[name], strict=True)]
        vs = "; ".join(f"{np.median([x / y for x, y in zip(at_floor, v, strict=True)]):.2f}x {p}"
                       for p, v in peers.items())
        print(f"{d} with its linears at the streaming rate: {np.median(at_floor):.1f} tok/s "
              f"({' / '.join(f'{x:.1f}' for x in at_floor)}){': ' + vs if vs else ''}")


if __name__ == "__main__":
    main()
