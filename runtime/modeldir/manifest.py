"""gptedge.json: the manifest of a model directory (docs/design.md#the-model-directory-contract).

Everything the runtime needs comes from here, never from a file name. Frozen dataclasses,
so a typo in a field name raises instead of silently adding a key.

Nothing here is trusted blindly: `files` records each model file's size and SHA-256 (model_files.py),
and every claim (shape, precision, quantization, graph variant, arch, special ids) is checked against
the graph and the files beside it at load (model_claims.py, graph_check.py). Manifests written before
`files` existed still load, with a warning; `gptedge verify` reports them as unverifiable.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..contract import GRAPH_STANDARD, IONames
from ..errors import GptEdgeError, ModelDirError
from ..registry import FAMILIES, GRAPH_VARIANTS
from .kv_cache import DEFAULT_KV_CACHE, kv_cache_kind
from .model_files import FileRecord, record_files
from .recipe import QuantizeRecipe
from .tasks import READS_LAST, Task
from .tokenizer import TOKENIZER_FILE

MANIFEST_NAME = "gptedge.json"
MODEL_FILE = "model.onnx"
# 2: `files` (sizes and SHA-256) and parity.fingerprint. gptedge reads 1 and 2 and writes 2; an older gptedge
# refuses 2 in one line ("format_version 2 is not supported") rather than stumbling on the new fields.
# 3: `kv_cache` other than fp32 (issue #23). Only such a manifest is written as 3, so an older gptedge refuses
# it in one line instead of binding float buffers to an int8 cache; an fp32-cache manifest stays 2, without
# the field, and every gptedge reads it.
FORMAT_VERSION = 2
KV_CACHE_FORMAT_VERSION = 3
READ_VERSIONS = (1, 2, 3)
PRECISIONS = ("fp32", "fp16", "int8", "int4")  # int4: 4-bit weight-only linears
# The families, graph variants and quantization methods a manifest may name are the registry's (registry.py).


@dataclass(frozen=True)
class ModelShape:
    arch: str  # a family in the registry: "gpt2" (pre-LN, final LN) or "openai-gpt" (post-LN, no final LN)
    n_layer: int
    n_head: int
    head_dim: int
    vocab_size: int
    context_length: int
    # Key/value heads where fewer than n_head (grouped-query attention, Llama-style families); absent (None):
    # n_head, and the manifest is written without the key, as before
    n_kv_head: int | None = None

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "head_dim", "vocab_size", "context_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ModelDirError(f"manifest shape.{name} should be a positive integer, got {value!r}")
        kv = self.n_kv_head
        if kv is not None and (not isinstance(kv, int) or isinstance(kv, bool) or kv < 1 or self.n_head % kv):
            raise ModelDirError(f"manifest shape.n_kv_head should divide n_head {self.n_head}, got {kv!r}")

    @property
    def kv_heads(self) -> int:
        """The heads a KV cache holds: what every cache buffer is sized by."""
        return self.n_kv_head or self.n_head

    @property
    def n_embd(self) -> int:
        return self.n_head * self.head_dim


@dataclass(frozen=True)
class Source:
    """Where a model directory came from."""

    path: str | None = None  # the checkpoint directory it was exported from (resolved)
    weights: str | None = None  # its weights file name
    sha256: str | None = None  # of that file
    hub_repo_id: str | None = None  # a Hugging Face Hub id it was resolved from
    hub_revision: str | None = None
    opset: int | None = None
    gptedge_version: str | None = None
    activation: str | None = None
    layer_norm_epsilon: float | None = None
    contrib_ops: tuple[str, ...] = ()  # ONNX Runtime contrib ops the graph uses
    imported_from: str | None = None  # a dir another tool exported: the file its shape was read from
    quantized_from: str | None = None  # the fp32 model dir a quantized one was made from
    fp32_source: Source | None = None  # and that dir's own source

    @property
    def checkpoint(self) -> str | None:
        """The HF checkpoint behind this dir (through the fp32 dir for a quantized one)."""
        return self.path or (self.fp32_source.checkpoint if self.fp32_source else None)


@dataclass(frozen=True)
class GraphParity:
    """Rung 3: the graph against the reference on prefill and decode steps of a left-padded batch."""

    max_abs_diff: float
    output: str  # where the largest difference was
    step: str
    index: tuple[int, ...]
    top1_agreement: float
    tolerance: float
    batch: int
    prompt_tokens: int
    decode_steps: int


@dataclass(frozen=True)
class GreedyParity:
    """Rung 4: greedy ids (and text) of the runtime against the reference's."""

    prompts: int
    tokens_compared: int
    new_tokens_per_prompt: int
    identical: bool
    note: str = ""  # why fewer positions than the default were compared (big models), if they were


@dataclass(frozen=True)
class QuantizedParity:
    """A quantized graph against its fp32 source on seeded ids."""

    max_abs_logit_diff: float
    top1_agreement: float
    inputs: str
    device: str = "cpu"  # where the quantized graph ran (the fp32 one always runs on the CPU)
    greedy_agreement: float | None = None  # identical leading greedy tokens / tokens compared


@dataclass(frozen=True)
class Fingerprint:
    """A short greedy run anyone can repeat on the dir alone (`gptedge verify`): seeded prompt ids, the greedy
    ids that followed, and at each step the chosen token's logit and its margin over the runner-up."""

    prompt_ids: tuple[int, ...]
    ids: tuple[int, ...]
    logits: tuple[float, ...]
    margins: tuple[float, ...]
    device: str = "cpu"  # where it was recorded


@dataclass(frozen=True)
class Parity:
    graph_vs_reference: GraphParity | None = None
    greedy_vs_reference: GreedyParity | None = None
    vs_fp32: QuantizedParity | None = None
    device: str | None = None
    fingerprint: Fingerprint | None = None


@dataclass(frozen=True)
class SearchCandidate:
    """One recipe `quantize --max-kl` tried: its quantize options, the graph's bytes, its KL(fp32 || it) on the
    calibration windows, (where it met the budget there) on the held-out windows of the same text, and (--prefer
    speed, where it met the budget on both) its median decode tok/s on the machine that ran the search."""

    options: str
    size_bytes: int
    kl_calibration: float
    kl_held_out: float | None = None
    decode_tok_s: float | None = None


@dataclass(frozen=True)
class RecipeSearch:
    """`quantize --max-kl`: the budget, what was preferred, the candidates in the order tried, the chosen one's
    options."""

    max_kl: float
    prefer: str
    calibration_tokens: int
    held_out_tokens: int
    candidates: tuple[SearchCandidate, ...]
    chosen: str


@dataclass(frozen=True)
class Quantization(QuantizeRecipe):
    """The recipe a quantized dir was made with (as applied, every default filled in), and what it did to
    each part of the model. A manifest written before a recipe field existed reads as the value used then
    (ABSENT_IN_OLDER)."""

    weights: str = ""  # how the weights are stored
    activations: str = ""
    embedding_and_lm_head: str = ""
    attention_products: str = "float"
    kept_float: str = ""
    quantized_nodes: dict[str, int] = field(default_factory=dict)  # op type -> count
    search: RecipeSearch | None = None  # quantize --max-kl's record; absent (None) otherwise, written only when set

    # Recipe fields added after format_version 1 was first written, with what quantize did before them.
    # (bits, symmetric and embedding_bits need none: the recipe fills them from the method, as it did.)
    ABSENT_IN_OLDER: ClassVar[dict[str, Any]] = {"activation_scale": "per-tensor", "reduce_range": False,
                                                 "quantize_head": True, "scale_search": "range", "awq": False,
                                                 "gptq": False, "rotate_down": False}

    @property
    def recipe(self) -> QuantizeRecipe:
        return QuantizeRecipe(**{f.name: getattr(self, f.name) for f in dataclasses.fields(QuantizeRecipe)})

    @property
    def label(self) -> str:
        """The method, with the widths where they are not plain 8-bit (compare's method column)."""
        half = ", fp16 activations" if self.float16 else ""
        searched = (", mse scales" if self.scale_search == "mse" else "") + (", awq" if self.awq else "")
        searched += ", gptq" if self.gptq else ""
        searched += ", rotated down" if self.rotate_down else ""
        if self.bits == 16 or (self.bits, self.embedding_bits, self.symmetric) == (8, 8, True):
            return self.method + searched + half  # fp16 has no widths to name
        kept = f", int8 {' '.join(self.keep_8bit)}" if self.keep_8bit else ""
        kept += searched
        return (f"{self.method} int{self.bits} b{self.block_size} {'sym' if self.symmetric else 'asym'}"
                f"{'' if self.embedding_bits == self.bits else f', emb int{self.embedding_bits}'}{kept}{half}")


@dataclass(frozen=True)
class Manifest:
    shape: ModelShape
    precision: str = "fp32"
    graph: str = GRAPH_STANDARD
    eos_id: int | None = None
    bos_id: int | None = None  # written to generation_config.json / genai_config.json
    pad_id: int | None = None
    model_file: str = MODEL_FILE
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    quantization: Quantization | None = None  # None for float graphs
    source: Source = field(default_factory=Source)
    parity: Parity = field(default_factory=Parity)  # figures measured at export / quantize
    files: tuple[FileRecord, ...] = ()  # what the runtime reads, with sizes and SHA-256 (write_manifest fills it)
    format_version: int = FORMAT_VERSION
    # the KV cache's storage on a kv_buffer graph (runtime/modeldir/kv_cache.py); absent (older dirs): fp32, the graph's
    # own float type
    kv_cache: str = DEFAULT_KV_CACHE
    # A fine-tuned task head (runtime/modeldir/tasks.py): its graph outputs the head's logits, not the vocabulary's,
    # and has no KV cache. Absent (None) in a language model's manifest, which is written without the key, as before.
    task: Task | None = None
    # A kv_buffer graph that reads its timeline from the attention mask's content (export/graph_attention.py
    # timeline_lengths), so a decode step may bind a mask wider than the positions held: what a captured CUDA
    # graph needs (runtime/graphs/cuda_graph.py). Absent (False) in older dirs and written only when True.
    wide_mask: bool = False
    # Every end-of-sequence id where a checkpoint has several (generation_config.json's eos_token_id as a list,
    # eos_id the first); absent (()): eos_id alone
    eos_ids: tuple[int, ...] = ()
    # Text prompts start with bos_id (tokenizer_config.json's add_bos_token); absent: False (GPT-2 adds none)
    add_bos: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ModelDirError(f"manifest precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        FAMILIES.check(self.shape.arch, ModelDirError, where="manifest arch")
        GRAPH_VARIANTS.check(self.graph, ModelDirError, where="manifest graph")
        kv_cache_kind(self.kv_cache, ModelDirError)
        if not self.inputs:
            names = IONames(self.shape.n_layer)
            object.__setattr__(self, "inputs", tuple(names.inputs))
            object.__setattr__(self, "outputs", tuple(names.outputs))

    @property
    def graph_bytes(self) -> int | None:
        """Bytes of the graph and its external data as the records say (the tokenizer not counted): compare's
        size column. None: an older manifest records no files."""
        if not self.files:
            return None
        return sum(r.size for r in self.files if r.path != TOKENIZER_FILE)

    def to_dict(self) -> dict[str, Any]:
        d = json.loads(json.dumps(dataclasses.asdict(self)))  # tuples as lists, as written
        if d["task"] is None:
            del d["task"]  # a language model's manifest is what older gptedge wrote and reads
        elif d["task"]["transformation"]["reads"] == READS_LAST:
            del d["task"]["transformation"]["reads"]  # the paper's templates: as before, so older gptedge reads them
        if self.kv_cache == DEFAULT_KV_CACHE:
            del d["kv_cache"]  # as format 2 wrote it, so an older gptedge still reads the dir
        if not self.wide_mask:
            del d["wide_mask"]
        if self.shape.n_kv_head is None:
            del d["shape"]["n_kv_head"]
        for key, absent in (("eos_ids", []), ("add_bos", False)):
            if d[key] == absent:
                del d[key]  # written only where a family needs them, so an older gptedge reads the rest
        if d["quantization"] is not None and d["quantization"]["search"] is None:
            del d["quantization"]["search"]  # as before --max-kl existed
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        version = d.get("format_version", None) if isinstance(d, dict) else None
        if version not in READ_VERSIONS:
            readable = f"{', '.join(map(str, READ_VERSIONS[:-1]))} and {READ_VERSIONS[-1]}"
            raise ModelDirError(f"manifest format_version {version!r} is not supported (this gptedge reads "
                                f"{readable})")
        return typed(cls, d, "manifest")

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """The ids that end a sequence: eos_ids, or eos_id alone; () when there is none."""
        return self.eos_ids or (() if self.eos_id is None else (self.eos_id,))

    def replace(self, **changes: Any) -> Manifest:
        return dataclasses.replace(self, **changes)


def typed(cls: type, value: Any, where: str) -> Any:
    """A JSON value -> an instance of the dataclass `cls`, checking every field's name and type.

    Raises ModelDirError naming the field (`manifest.parity.vs_fp32.top1_agreement`, say)."""
    if not isinstance(value, dict):
        raise ModelDirError(f"{where} should be an object, got {type(value).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - known)
    if unknown:
        raise ModelDirError(f"{where} has an unknown field {unknown[0]!r}")
    older = {k: v for k, v in getattr(cls, "ABSENT_IN_OLDER", {}).items() if k not in value}
    try:
        return cls(**older, **{k: _field(hints[k], v, f"{where}.{k}") for k, v in value.items()})
    except TypeError as e:  # a required field missing
        raise ModelDirError(f"{where} is malformed: {e}") from None
    except GptEdgeError as e:  # a value its own checks refuse (a recipe's, say)
        if isinstance(e, ModelDirError):
            raise
        raise ModelDirError(f"{where}: {e}") from None


def _field(hint: Any, value: Any, where: str) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        if value is None:
            return None
        hint = args[0]
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return typed(hint, value, where)
    if origin is tuple and isinstance(value, list):
        return tuple(_field(typing.get_args(hint)[0], v, where) for v in value)
    if origin is dict and isinstance(value, dict):
        return {k: _field(typing.get_args(hint)[1], v, where) for k, v in value.items()}
    base = origin or hint
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)) if base is float else (
        isinstance(value, base) and not (base is int and isinstance(value, bool)))
    if not ok:
        raise ModelDirError(f"{where} should be {getattr(base, '__name__', base)}, got {value!r}")
    return float(value) if base is float else value


def read_manifest(model_dir: str | Path) -> Manifest:
    path = Path(model_dir) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(f"{model_dir}: no {MANIFEST_NAME} (not a gptedge model directory)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelDirError(f"{path}: corrupt manifest ({e})") from None
    if not isinstance(data, dict) or "shape" not in data:
        raise ModelDirError(f"{path}: corrupt manifest (no 'shape')")
    try:
        return Manifest.from_dict(data)
    except ModelDirError as e:
        raise ModelDirError(f"{path}: {e}") from None


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write next to the final name, then rename, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_manifest(model_dir: str | Path, manifest: Manifest) -> Manifest:
    """Write gptedge.json with the records (size, SHA-256) of the files as they are now -> the manifest written.
    Call it once the model files are final."""
    version = FORMAT_VERSION if manifest.kv_cache == DEFAULT_KV_CACHE else KV_CACHE_FORMAT_VERSION
    manifest = manifest.replace(files=record_files(model_dir, manifest.model_file), format_version=version)
    write_json(Path(model_dir) / MANIFEST_NAME, manifest.to_dict())
    return manifest
