"""Hand-made graph facts for the model_claims unit tests (tests/modeldir/test_model_claims*_units.py): what onnx_wire
reads from a graph (ops, integer attributes, initializers' dims and types, input types), written by hand for a
two-layer GPT-2 of vocabulary 100 and context 64, and a stand-in for the tokenizer lookups the checks make."""

from __future__ import annotations

import json
from dataclasses import dataclass

from gptedge.runtime import contract as C
from gptedge.runtime.checks.model_claims import claim_problems
from gptedge.runtime.modeldir.manifest import Manifest, ModelShape
from gptedge.runtime.modeldir.onnx_wire import GraphFacts, Initializer, Node

SHAPE = ModelShape("gpt2", 2, 4, 8, 100, 64)
SAYS = "gptedge.json says"


def node(op: str, *inputs: str, **ints) -> Node:
    return Node(op, "com.microsoft" if op in ("MatMulNBits", "GroupQueryAttention") else "", inputs, ints)


def facts(*extra: Node, layers: int = 2, norms: int = 5, rows: int = 64, cache: str = "float32",
          init_type: str = "float32", inits: dict | None = None) -> GraphFacts:
    """A float GPT-2's facts: its position table, `norms` LayerNorms and `layers` layers of past inputs."""
    nodes = [node("Gather", "wpe", C.POSITION_IDS)] + [node("LayerNormalization", "x") for _ in range(norms)]
    initializers = {"wpe": Initializer("wpe", (rows, 32), init_type, None), **(inits or {})}
    types = {"input_ids": "int64", C.POSITION_IDS: "int64", C.ATTENTION_MASK: "int64"}
    types.update({name(i): cache for i in range(layers) for name in (C.past_key, C.past_value)})
    return GraphFacts("test", nodes + list(extra), initializers, types, {})


def claims(m: Manifest, f: GraphFacts | None, d, tokenizer=None, **kw) -> list[str]:
    return claim_problems(d, m, f, tokenizer, **kw)


def write(d, name: str, data) -> None:
    (d / name).write_text(data if isinstance(data, str) else json.dumps(data))


@dataclass
class Added:
    content: str
    special: bool


class Tokenizer:
    """The lookups model_claims makes of a tokenizers.Tokenizer: 100 tokens, 98 and 99 added (99 special)."""

    def __init__(self, size=100, specials=True):
        self.size, self.specials = size, specials

    def get_added_tokens_decoder(self):
        return {98: Added("<pad>", False), 99: Added("<|endoftext|>", True)} if self.specials else {}

    def id_to_token(self, i):
        return f"t{i}" if 0 <= i < 98 else {98: "<pad>", 99: "<|endoftext|>"}.get(i)

    def token_to_id(self, t):
        return {"<pad>": 98, "<|endoftext|>": 99}.get(t, int(t[1:]) if t[:1] == "t" and t[1:].isdigit() else None)

    def get_vocab_size(self, with_added_tokens=True):
        return self.size if with_added_tokens else self.size - 2  # 98 and 99 are added tokens
