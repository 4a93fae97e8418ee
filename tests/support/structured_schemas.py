"""Generated JSON schemas for the structured output sweep (tests/serve/test_structured_schemas.py and
benchmarks/structured_output.py), and the tiny seeded Llama checkpoint it runs on beside the GPT-2 sample model.

Each schema is seeded by its index: objects nested up to three deep with required and optional properties,
enums, arrays with minItems / maxItems, integers and numbers with bounds, strings with lengths or patterns.
Every string, array and object is bounded (maxLength, maxItems, additionalProperties: false), so a complete
output fits the budget whatever a random model's weights prefer; numbers' fractions are the one unbounded part.
"""

from __future__ import annotations

import random
from pathlib import Path

PATTERNS = ("^[a-z]{1,6}$", "^[0-9]{3}-[0-9]{2}$", "^[A-Z][a-z]{0,4}$", "^(yes|no|maybe)$")
WORDS = ("red", "green", "blue", "north", "south", "on", "off", "cat", "dog", "alpha", "beta")
LLAMA_CONTEXT = 512  # the sweep's outputs run to ~150 byte-level tokens on the Llama tokenizer


def _leaf(rng: random.Random) -> dict:
    kind = rng.choice(("integer", "number", "string_len", "string_pattern", "enum", "boolean", "enum_mixed", "null"))
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "number":
        low = rng.choice((-10.5, 0, 1, 2.25))
        bounds = {"exclusiveMinimum": low} if rng.random() < 0.3 else {"minimum": low}
        return {"type": "number", **bounds, "maximum": low + rng.choice((1, 10, 100))}
    if kind == "string_len":
        low = rng.randint(0, 3)
        return {"type": "string", "minLength": low, "maxLength": low + rng.randint(1, 8)}
    if kind == "string_pattern":
        return {"type": "string", "pattern": rng.choice(PATTERNS)}
    if kind == "enum":
        return {"type": "string", "enum": rng.sample(WORDS, rng.randint(1, 4))}
    if kind == "enum_mixed":
        return {"enum": [rng.choice(WORDS), rng.randint(0, 9), None, True][: rng.randint(2, 4)]}
    return {"type": kind}


def _array(rng: random.Random, depth: int) -> dict:
    low = rng.randint(0, 2)
    return {"type": "array", "items": _value(rng, depth + 1), "minItems": low, "maxItems": low + rng.randint(0, 2)}


def _object(rng: random.Random, depth: int) -> dict:
    names = rng.sample(("id", "name", "size", "tags", "owner", "color", "count", "meta", "score", "ok"),
                       rng.randint(1, 4 if depth == 0 else 3))
    properties = {n: _value(rng, depth + 1) for n in names}
    required = [n for n in names if rng.random() < 0.6]
    schema = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def _value(rng: random.Random, depth: int) -> dict:
    if depth >= 3:
        return _leaf(rng)
    roll = rng.random()
    return _object(rng, depth) if roll < 0.25 else _array(rng, depth) if roll < 0.4 else _leaf(rng)


def generated_schema(index: int) -> dict:
    """Schema number `index`: always an object at the top (what response_format's json_schema holds)."""
    return _object(random.Random(index), 0)


def write_llama_checkpoint(out: Path, seed: int = 0) -> Path:
    """A tiny seeded Llama (LlamaForCausalLM, GQA 2) with the lineage tests' tokenizer (Metaspace + byte-fallback
    BPE, 320 tokens, eos </s> = 2) and a context of LLAMA_CONTEXT, saved by transformers."""
    import torch
    import transformers

    from .lineage_checkpoints import VOCAB, write_tokenizer

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=LLAMA_CONTEXT, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False, rms_norm_eps=1e-5, attn_implementation="eager")
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # peaked, varied logits: a freshly initialised head gives nearly uniform ones
        model.lm_head.weight.copy_(2.0 * torch.randn(model.lm_head.weight.shape, generator=g))
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    write_tokenizer(out)
    return out
