"""The structured output sweep: 50 generated JSON schemas (tests/support/structured_schemas.py: nesting, enums, arrays
with minItems / maxItems, required and optional properties, bounded integers and numbers, strings with lengths or
patterns), each answered greedily and sampled (temperature 1, seeded) through the serving engine, 8 rows a batch,
on both families: the GPT-2 sample model (samples/sample-model) and a tiny seeded Llama whose tokenizer is a
Llama checkpoint's (Metaspace + byte fallback). Every output must parse and validate against its schema and end
with finish_reason "stop". benchmarks/structured_output.py runs the same sweep and writes the results page."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from gptedge.runtime.generation.constraints import ConstraintCompiler, ConstraintSpec  # noqa: E402 - after the optional-dependency skip above
from gptedge.runtime.generation.sampling import SamplingParams  # noqa: E402 - after the optional-dependency skip above
from gptedge.runtime.serving.engine import CompletionRequest, Engine  # noqa: E402 - after the optional-dependency skip above

from ..support.structured_schemas import generated_schema, write_llama_checkpoint  # noqa: E402 - after the optional-dependency skip above

SCHEMAS = 50
PROMPT = "The record: "
MAX_TOKENS = 200


def run_sweep(model, schemas: list[dict], samplings: list[SamplingParams]) -> list[tuple[int, object]]:
    """Every schema under every sampling, submitted at once to an 8-row engine -> (schema index, last event)."""
    m = model.manifest
    compiler = ConstraintCompiler(model.tokenizer, m.shape.vocab_size, m.stop_ids)
    constraints = [compiler.compile(ConstraintSpec.json_schema(s)) for s in schemas]
    prompt = tuple(model.encode_prompt(PROMPT))
    engine = Engine(model, max_batch=8, max_queue=len(schemas) * len(samplings))
    done, results = threading.Semaphore(0), []

    def on_event(index, event):
        if event.finish_reason is not None:
            results.append((index, event))
            done.release()
    for sampling in samplings:
        for i, c in enumerate(constraints):
            engine.submit(CompletionRequest(prompt, MAX_TOKENS, sampling, constraint=c),
                          lambda e, i=i: on_event(i, e))
    engine.start()
    try:
        for _ in range(len(schemas) * len(samplings)):
            assert done.acquire(timeout=600), "the engine stalled"
    finally:
        engine.stop(grace_s=1)
    return results


def invalid(schemas: list[dict], results) -> list[str]:
    """The outputs that do not parse, do not validate, or did not end with stop (empty: all good)."""
    bad = []
    for i, event in results:
        try:
            jsonschema.validate(json.loads(event.generation.text), schemas[i])
            if event.finish_reason != "stop":
                raise ValueError(f"finish_reason {event.finish_reason}")
        except (ValueError, jsonschema.ValidationError) as e:
            bad.append(f"schema {i}: {type(e).__name__} {str(e)[:120]!r} in {event.generation.text[:120]!r}")
    return bad


@pytest.fixture(scope="module")
def families(tmp_path_factory, sample_recipe_dirs) -> dict[str, Path]:
    """family -> model dir: the GPT-2 sample model (conftest's session export, unvalidated) and the tiny seeded Llama,
    exported."""
    from gptedge.export.exporter import export_checkpoint

    root = tmp_path_factory.mktemp("structured")
    export_checkpoint(write_llama_checkpoint(root / "llama-ck"), root / "llama", validate=False)
    return {"gpt2": sample_recipe_dirs["fp32"], "llama": root / "llama"}


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_fifty_schemas_parse_and_validate_greedy_and_sampled(families, family):
    from gptedge.runtime import load

    schemas = [generated_schema(i) for i in range(SCHEMAS)]
    results = run_sweep(load(families[family], device="cpu"), schemas,
                        [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=1234)])
    assert len(results) == 2 * SCHEMAS
    assert invalid(schemas, results) == []


def test_the_llama_tokenizer_constrains_json_and_a_regex(families):
    """The quick check of the Llama family (the sweep above is slow): its byte-fallback tokenizer spells JSON
    from <0x..> pieces, and its eos </s> is allowed only once the grammar accepts."""
    from gptedge.runtime import load

    model = load(families["llama"], device="cpu")
    schemas = [generated_schema(i) for i in range(3)]
    results = run_sweep(model, schemas, [SamplingParams(temperature=1.0, seed=5)])
    assert invalid(schemas, results) == []
    m = model.manifest
    row = ConstraintCompiler(model.tokenizer, m.shape.vocab_size, m.stop_ids).compile(
        ConstraintSpec("regex", "[a-z]{2}")).start()
    assert m.stop_ids == (2,) and not row.allowed[2] and row.allowed[model.tokenizer.token_to_id("<0x61>")]
