"""Every pluggable part of gptedge by name: model families, quantization methods, graph variants.

A registry maps each name to the module that implements it, one line a member. The names are plain
data, needing nothing but the standard library, so the readers of a name never pay for the code
behind it: the manifest check runs on a device without torch or onnx, and the CLI's choices are
there at `--help` without numpy. The module is imported when a member is first used (`load`); its
dependencies (torch for a family, onnx for a method) are needed then and only then.

Adding a member is one module plus one line here:

- a model family: `export/<name>.py` ending with `FAMILY = Family(...)` (export/base.py);
- a quantization method: `quantize/<name>.py` ending with `METHOD = Method(...)` (quantize/base.py),
  its line saying which weight widths it stores (the recipe checks them without loading it);
- a graph variant: `runtime/<name>_graph.py` with a GraphVariant subclass named `VARIANT`
  (runtime/graphs/graph_variant.py) whose `name` is the line's name.

The peer engines of compare and bench have their registry in gptedge.measure.peers, built the same way.
`register` adds a member at run time (a plugin, or a test's toy member).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from .contract import GRAPH_KV_BUFFER, GRAPH_STANDARD
from .errors import GptEdgeError, InvalidArgumentError

T = TypeVar("T")


@dataclass(frozen=True)
class Entry:
    """A member's line: the module that implements it (its `attribute` names the member there)."""

    module: str


@dataclass(frozen=True)
class MethodEntry(Entry):
    """A quantization method's line: what its recipes may ask for, known without importing it (onnx)."""

    bits: tuple[int, ...] = (8,)  # the weight widths it stores; the first is the default
    asymmetric: bool = False  # 4-bit blocks with their own zero points
    float16: bool = False  # can also turn the float parts of its graph into fp16 (recipe.float16, for GPUs)
    calibrated: bool = False  # needs calibration text (quantize --calibration)
    # ONNX ops its graphs hold and no other method's do: a manifest's method is checked against them at load
    # (runtime/checks/model_claims.py); () for a method that writes only float ops (fp16); None: not said (not checked)
    ops: tuple[str, ...] | None = None


@dataclass(frozen=True)
class GraphEntry(Entry):
    """A graph variant's line: its I/O contract, checked against the graph at load (runtime/checks/model_claims.py)."""

    shared_buffer: bool = False  # past and present are one buffer that GroupQueryAttention writes in place


# A block's linears as GPT-2's graph names them (`h.3.attn.c_proj.weight`, less `h.3.` and `.weight`), each with
# its family-neutral name: the names `quantize --keep-8bit` matches (docs/quantization.md#linear-names).
GPT2_LINEARS = (("attn.c_attn", "attention.qkv"), ("attn.c_proj", "attention.o"), ("mlp.c_fc", "mlp.up"),
                ("mlp.c_proj", "mlp.down"))
# Llama's q_proj, k_proj, v_proj and NeoX's query_key_value: one packed projection in the graph (graph_rotary.py)
LLAMA_LINEARS = (("self_attn.qkv_proj", "attention.qkv"), ("self_attn.o_proj", "attention.o"),
                 ("mlp.gate_proj", "mlp.gate"), ("mlp.up_proj", "mlp.up"), ("mlp.down_proj", "mlp.down"))
GPT_NEOX_LINEARS = (("attention.qkv", "attention.qkv"), ("attention.dense", "attention.o"),
                    ("mlp.dense_h_to_4h", "mlp.up"), ("mlp.dense_4h_to_h", "mlp.down"))
# The same blocks as gptedge wrote them before q|k|v were packed (one linear each): dirs exported then still load.
LLAMA_UNPACKED_LINEARS = (("self_attn.q_proj", "attention.q"), ("self_attn.k_proj", "attention.k"),
                          ("self_attn.v_proj", "attention.v"), *LLAMA_LINEARS[1:])
GPT_NEOX_UNPACKED_LINEARS = (("attention.q", "attention.q"), ("attention.k", "attention.k"),
                             ("attention.v", "attention.v"), *GPT_NEOX_LINEARS[1:])


@dataclass(frozen=True)
class FamilyEntry(Entry):
    """A model family's line: what load checks a manifest's arch against, known without importing it (torch).
    Every family has two norms a block, of one kind (`norm`: "layer" LayerNorms, "rms" RMSNorms); `final_norm`: one
    more after the blocks. `linears`: each block linear's graph name and its neutral name (quantize reads them; it
    never names a family)."""

    final_norm: bool | None = None  # None: not said (the norm count is then not checked against the graph)
    norm: str | None = None  # None: not said (a plugin's line; the norms' kind is then not checked)
    linears: tuple[tuple[str, str], ...] = GPT2_LINEARS
    # the block linears of graphs an earlier gptedge wrote for the family (load still takes them), or ()
    older_linears: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class TaskEntry(Entry):
    """A fine-tuned task's line (the original GPT's input transformations, runtime/modeldir/tasks.py): which head its
    graph ends in, the fields a caller gives, the token templates of an example's rows (a special token's
    role, "start" / "delimiter" / "extract", or a field; "choice" stands for each of the "choices") and how
    the rows' logits combine ("one" row; "sum" of the rows, similarity's two orders; one logit per "choices")."""

    head: str = "sequence-classification"
    fields: tuple[str, ...] = ("text",)
    sequences: tuple[tuple[str, ...], ...] = (("start", "text", "extract"),)
    combine: str = "one"


E = TypeVar("E", bound=Entry)


class Registry(Generic[E, T]):
    """name -> Entry, in registration order; `load(name)` imports the member (once: modules are cached)."""

    def __init__(self, kind: str, attribute: str, entries: dict[str, E]):
        self.kind, self.attribute = kind, attribute
        self._entries: dict[str, E] = dict(entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def names(self, where: Callable[[E], bool] | None = None) -> tuple[str, ...]:
        """The names (those whose entry passes `where`), in registration order."""
        return tuple(n for n, e in self._entries.items() if where is None or where(e))

    def entry(self, name: str) -> E:
        self.check(name)
        return self._entries[name]

    def check(self, name: object, error: type[GptEdgeError] = InvalidArgumentError, where: str = "") -> None:
        """Raise `error` (one line, the names to choose from) unless `name` is registered."""
        if name not in self._entries:
            prefix = f"{where} " if where else f"unknown {self.kind} "
            raise error(f"{prefix}{name!r} is not one of {', '.join(self._entries)}")

    def load(self, name: str) -> T:
        """The member itself (a Family, a Method, a GraphVariant class, a peer engine)."""
        return getattr(importlib.import_module(self.entry(name).module), self.attribute)

    def register(self, name: str, entry: E) -> None:
        if name in self._entries:
            raise InvalidArgumentError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        self._entries.pop(name, None)


# One line a member. The first of each is the default where one is needed.
FAMILIES: Registry[FamilyEntry, object] = Registry("model family", "FAMILY", {
    "gpt2": FamilyEntry("gptedge.export.gpt2", final_norm=True, norm="layer"),
    "openai-gpt": FamilyEntry("gptedge.export.openai_gpt", final_norm=False, norm="layer"),
    # RMSNorms: counted where the graph writes them as one op each (kv_buffer), not as plain ops (standard)
    "llama": FamilyEntry("gptedge.export.llama", final_norm=True, norm="rms", linears=LLAMA_LINEARS,
                         older_linears=LLAMA_UNPACKED_LINEARS),
    # GPT-NeoX has GPT-2's norm count (2n + 1): not said, so a GPT-2 graph's count still names GPT-2 alone
    "gpt_neox": FamilyEntry("gptedge.export.gpt_neox", norm="layer", linears=GPT_NEOX_LINEARS,
                            older_linears=GPT_NEOX_UNPACKED_LINEARS),
    "qwen2": FamilyEntry("gptedge.export.qwen2", final_norm=True, norm="rms", linears=LLAMA_LINEARS,
                         older_linears=LLAMA_UNPACKED_LINEARS),
    "mistral": FamilyEntry("gptedge.export.mistral", final_norm=True, norm="rms", linears=LLAMA_LINEARS,
                           older_linears=LLAMA_UNPACKED_LINEARS),
    "gemma": FamilyEntry("gptedge.export.gemma", final_norm=True, norm="rms", linears=LLAMA_LINEARS),
})
QUANTIZATION_METHODS: Registry[MethodEntry, object] = Registry("quantization method", "METHOD", {
    "dynamic": MethodEntry("gptedge.quantize.dynamic",
                           ops=("MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulInteger")),
    "static": MethodEntry("gptedge.quantize.static", calibrated=True, ops=("DequantizeLinear", "QLinearMatMul")),
    "weight-only": MethodEntry("gptedge.quantize.weight_only", bits=(8, 4), asymmetric=True, float16=True,
                               ops=("MatMulNBits",)),
    "fp16": MethodEntry("gptedge.quantize.fp16", bits=(16,), ops=()),
})
# The GPT paper's four task formats (§3.3). Their lines are data: export copies the chosen one into the manifest,
# which the runtime reads (an old gptedge's manifest names no task: an LM).
TASKS: Registry[TaskEntry, object] = Registry("task", "TASK", {
    "classification": TaskEntry("gptedge.runtime.modeldir.tasks"),
    "entailment": TaskEntry("gptedge.runtime.modeldir.tasks", fields=("premise", "hypothesis"),
                            sequences=(("start", "premise", "delimiter", "hypothesis", "extract"),)),
    "similarity": TaskEntry("gptedge.runtime.modeldir.tasks", fields=("a", "b"),
                            sequences=(("start", "a", "delimiter", "b", "extract"),
                                       ("start", "b", "delimiter", "a", "extract")), combine="sum"),
    "multiple-choice": TaskEntry("gptedge.runtime.modeldir.tasks", head="multiple-choice",
                                 fields=("context", "choices"),
                                 sequences=(("start", "context", "delimiter", "choice", "extract"),),
                                 combine="choices"),
})
GRAPH_VARIANTS: Registry[GraphEntry, type] = Registry("graph variant", "VARIANT", {
    GRAPH_STANDARD: GraphEntry("gptedge.runtime.graphs.standard_graph"),
    GRAPH_KV_BUFFER: GraphEntry("gptedge.runtime.graphs.kv_buffer_graph", shared_buffer=True),
})
