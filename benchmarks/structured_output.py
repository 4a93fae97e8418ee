"""Structured output: does every constrained output parse and validate, and what does a constrained row cost per
token beside unconstrained ones (docs/serving.md#structured-output)?

    python benchmarks/structured_output.py validity [--schemas 50] [--out benchmarks/results/structured-DATE.md]
    python benchmarks/structured_output.py timing [--model DIR] [--clients 8] [--tokens 64] [--rounds 3]

validity: the 50 generated schemas of tests/support/structured_schemas.py, each answered greedily and sampled
(temperature 1, seed 1234) by the serving engine (8 rows a batch) on both families: the GPT-2 sample model
(samples/sample-model) and a tiny seeded Llama with a Llama checkpoint's tokenizer (both exported into a
temporary folder). Counts the outputs that parse, validate (jsonschema) and end with "stop", and writes the
results page (markdown, atomically). Not a timing: it holds on any machine.

timing: `--clients` client threads (closed loop: each submits its next request when the last one ends), each
making `--requests` requests of exactly `--tokens` tokens, against one Engine(max_batch=clients), in three modes:
free (no row constrained; ignore_eos), json (every row constrained by a schema whose one string property is longer
than the budget, so it also runs exactly --tokens tokens), mixed (one constrained row, the rest free). Printed:
seconds per generated token of the whole batch, for each mode, and the extra cost of json and mixed over free;
rounds are interleaved (free, json, mixed, free, ...) and medians taken. Meaningful only on a quiet machine.
--model: any model dir with a tokenizer (default: the sample model, exported on first use).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.structured_schemas: the generator the tests use

from gptedge.atomic import atomic_output_file  # noqa: E402 - after the path: run as a script from anywhere
from gptedge.runtime import load  # noqa: E402 - after the sys.path line above
from gptedge.runtime.generation.constraints import ConstraintCompiler, ConstraintSpec  # noqa: E402 - after the sys.path line above
from gptedge.runtime.generation.sampling import SamplingParams  # noqa: E402 - after the sys.path line above
from gptedge.runtime.serving.engine import CompletionRequest, Engine  # noqa: E402 - after the sys.path line above
from tests.support.structured_schemas import generated_schema, write_llama_checkpoint  # noqa: E402 - after the sys.path line above

PROMPT = "The record: "
MAX_TOKENS = 200
SAMPLINGS = {"greedy": SamplingParams(temperature=0.0), "sampled (T=1, seed 1234)":
             SamplingParams(temperature=1.0, seed=1234)}


def run_all(engine: Engine, requests: list[CompletionRequest], clients: int) -> list:
    """`clients` threads share the requests (client c takes every clients-th one, in turn) -> each one's last event."""
    results = [None] * len(requests)

    def client(c: int) -> None:
        for i in range(c, len(requests), clients):
            done = threading.Event()

            def on_event(event, i=i, done=done):
                if event.finish_reason is not None:
                    results[i] = event
                    done.set()
            engine.submit(requests[i], on_event)
            if not done.wait(600):
                raise RuntimeError("the engine stalled")
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def compiler_for(model) -> ConstraintCompiler:
    m = model.manifest
    return ConstraintCompiler(model.tokenizer, m.shape.vocab_size, m.stop_ids)


def sweep(model, schemas: list[dict]) -> dict[str, tuple[int, int, int, int]]:
    """sampling name -> (outputs, parsed, validated, ended with stop)."""
    import jsonschema

    compiler, prompt = compiler_for(model), tuple(model.encode_prompt(PROMPT))
    constraints = [compiler.compile(ConstraintSpec.json_schema(s)) for s in schemas]
    engine = Engine(model, max_batch=8, max_queue=64).start()
    rows = {}
    try:
        for name, sampling in SAMPLINGS.items():
            events = run_all(engine, [CompletionRequest(prompt, MAX_TOKENS, sampling, constraint=c)
                                      for c in constraints], 8)
            parsed = valid = stopped = 0
            for schema, event in zip(schemas, events, strict=True):
                stopped += event.finish_reason == "stop"
                try:
                    value = json.loads(event.generation.text)
                except ValueError:
                    continue
                parsed += 1
                valid += jsonschema.Draft202012Validator(schema).is_valid(value)
            rows[name] = (len(events), parsed, valid, stopped)
    finally:
        engine.stop(grace_s=1)
    return rows


def validity(args) -> None:
    from gptedge.export.exporter import export_checkpoint

    schemas = [generated_schema(i) for i in range(args.schemas)]
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {"GPT-2 sample model (samples/sample-model, 8,192 tokens)": Path(tmp) / "gpt2",
                "tiny seeded Llama (320 tokens, byte fallback)": Path(tmp) / "llama"}
        gpt2, llama = dirs.values()
        export_checkpoint(ROOT / "samples" / "sample-model", gpt2, validate=False)
        export_checkpoint(write_llama_checkpoint(Path(tmp) / "llama-ck"), llama, validate=False)
        for family, model_dir in dirs.items():
            for name, (n, parsed, valid, stopped) in sweep(load(model_dir, device="cpu"), schemas).items():
                lines.append(f"| {family} | {name} | {n} | {parsed} | {valid} | {stopped} |")
                print(lines[-1])
    text = "\n".join([
        f"# Structured output: {args.schemas} generated JSON schemas on both families",
        "",
        f"Written by `python benchmarks/structured_output.py validity --schemas {args.schemas}` on "
        f"{datetime.now(timezone.utc):%Y-%m-%d} ({platform.machine()}, Python {platform.python_version()}). "
        "The schemas are tests/support/structured_schemas.py's (objects nested up to three deep, required and optional "
        "properties, enums, arrays with minItems / maxItems, bounded integers and numbers, strings with lengths or "
        f"patterns); each is answered from the prompt {PROMPT!r} with max_tokens {MAX_TOKENS} by the serving "
        "engine, 8 rows a batch. Validated with jsonschema (Draft 2020-12). Not a timing.",
        "",
        "| family | sampling | outputs | parse | validate | finish_reason stop |",
        "|---|---|---|---|---|---|",
        *lines,
        "",
        "The per-token cost at 8 clients is `python benchmarks/structured_output.py timing` (run on a quiet machine).",
        "",
    ])
    with atomic_output_file(args.out) as part:
        part.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")


def timing(args) -> None:
    from gptedge.sample import sample_model_dir

    model = load(args.model or sample_model_dir(), device="cpu")
    prompt = tuple(model.encode_prompt(PROMPT))
    long_string = {"type": "object", "properties": {"story": {"type": "string", "minLength": 8 * args.tokens}},
                   "required": ["story"], "additionalProperties": False}
    constraint = compiler_for(model).compile(ConstraintSpec.json_schema(long_string))
    free = CompletionRequest(prompt, args.tokens, SamplingParams(temperature=1.0, seed=1), ignore_eos=True)
    bound = CompletionRequest(prompt, args.tokens, SamplingParams(temperature=1.0, seed=1), constraint=constraint)
    n = args.clients * args.requests
    modes = {"free": [free] * n, "json": [bound] * n,
             "mixed": [bound if i % args.clients == 0 else free for i in range(n)]}
    engine = Engine(model, max_batch=args.clients, max_queue=4 * args.clients).start()
    per_token: dict[str, list[float]] = {m: [] for m in modes}
    try:
        run_all(engine, modes["json"][: args.clients], args.clients)  # warm-up: sessions, the mask thread
        for _ in range(args.rounds):
            for mode, requests in modes.items():
                started = time.perf_counter()
                events = run_all(engine, requests, args.clients)
                tokens = sum(len(e.generation.ids) for e in events)
                per_token[mode].append((time.perf_counter() - started) / tokens)
    finally:
        engine.stop(grace_s=1)
    base = statistics.median(per_token["free"])
    print(f"{args.clients} clients x {args.requests} requests x {args.tokens} tokens, {args.rounds} rounds "
          f"(medians); model {model.model_dir}; {platform.machine()} {platform.processor()}")
    for mode, values in per_token.items():
        median = statistics.median(values)
        print(f"{mode:6s} {median * 1e3:8.3f} ms/token  ({median / base - 1:+.1%} vs free)  rounds: "
              + " ".join(f"{v * 1e3:.3f}" for v in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validity")
    v.add_argument("--schemas", type=int, default=50)
    v.add_argument("--out", type=Path,
                   default=ROOT / "benchmarks" / "results" / f"structured-{datetime.now(timezone.utc):%Y-%m-%d}.md")
    t = sub.add_parser("timing")
    t.add_argument("--model", type=Path)
    t.add_argument("--clients", type=int, default=8)
    t.add_argument("--requests", type=int, default=4)
    t.add_argument("--tokens", type=int, default=64)
    t.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.command == "validity":
        validity(args)
    else:
        timing(args)


if __name__ == "__main__":
    main()
