"""The manifest's claims, checked against the graph and the files beside it: one line per mismatch,
naming both values (docs/design.md#failures-and-bad-input). load() raises on the first; `gptedge verify` prints them
all.

What each claim is checked against (facts from onnx_wire, read without running anything):
- context_length: the rows of the position table (the initializer Gather reads with `position_ids`);
- precision: the graph's float type (its cache inputs' element type) and its quantized ops;
- quantization method: the ops that method writes (its registry line's `ops`); for weight-only, the
  MatMulNBits `bits` and `block_size` attributes too;
- graph variant: the I/O contract (kv_buffer graphs share one buffer through GroupQueryAttention);
- kv_cache: the cache inputs' element type and GroupQueryAttention's kv_cache_bit_width (kv_cache.py);
- arch: the norms' kind (LayerNorm ops, or the RMSNorm ops a Llama-style kv_buffer graph writes) and count (two a
  block, and one after them for a family whose registry line says `final_norm`: GPT-2 and Llama 2n + 1, the
  original GPT 2n), and config.json;
- eos / bos / pad ids: config.json, generation_config.json, and the tokenizer (an id it has, and one of
  its special tokens when it has any);
- the tokenizer's vocabulary: no larger than the model's;
- external data: every file the graph reads is one the manifest records.
Shape claims the graph states only when it runs (layers, heads, head size, vocabulary) are graph_check's.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from .. import contract as C
from ..modeldir.kv_cache import DEFAULT_KV_CACHE, KV_CACHES, cache_onnx_type
from ..modeldir.manifest import MANIFEST_NAME, Manifest
from ..modeldir.onnx_wire import GraphFacts
from ..modeldir.recipe import PACKED_JOIN, block_linears, kept_at_8bit, older_block_linears
from ..registry import FAMILIES, GRAPH_VARIANTS, QUANTIZATION_METHODS
from .companion_files import companion_problems
from .recipe_claims import recipe_problems
from .task_claims import task_problems

# a registry line's norm kind -> the ops that write one norm each, and what a line calls them
NORM_OPS = {"layer": ("LayerNormalization", "SkipLayerNormalization"),
            "rms": ("SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization")}
NORM_NAMES = {"layer": "LayerNorms", "rms": "RMSNorms"}
CONFIG_SHAPE = {"n_layer": "n_layer", "n_head": "n_head", "n_embd": "n_embd", "vocab_size": "vocab_size",
                "n_positions": "context_length"}
SAYS = f"{MANIFEST_NAME} says"


def method_ops() -> dict[str, tuple[str, ...]]:
    """Each quantization method that writes ops of its own -> them (the registry's lines)."""
    return {name: QUANTIZATION_METHODS.entry(name).ops
            for name in QUANTIZATION_METHODS.names(lambda e: getattr(e, "ops", None))}


def _says_its_ops(method: str | None) -> bool:
    """Whether the registry line of `method` says which ops it writes (a plugin's may not: then nothing is checked)."""
    return method is None or getattr(QUANTIZATION_METHODS.entry(method), "ops", None) is not None


def graph_method(ops: Counter) -> tuple[str | None, str | None]:
    """-> (the quantization method whose ops the graph holds, the op that says so), or (None, None)."""
    for method, names in method_ops().items():
        op = next((n for n in names if ops[n]), None)
        if op:
            return method, op
    return None, None


def position_table_rows(facts: GraphFacts) -> int | None:
    for node in facts.nodes:
        if node.op_type == "Gather" and node.inputs[1:2] == (C.POSITION_IDS,) and node.inputs[0] in facts.initializers:
            dims = facts.initializers[node.inputs[0]].dims
            return dims[0] if dims else None
    return None


def _context(m: Manifest, facts: GraphFacts) -> list[str]:
    rows = position_table_rows(facts)
    if rows is not None and rows != m.shape.context_length:
        return [f"{SAYS} context_length {m.shape.context_length}, the graph's position table holds {rows} positions"]
    return []


def graph_float_type(m: Manifest, facts: GraphFacts) -> str:
    """The float type the graph computes in: float16 where its initializers are (an fp16 graph), else float32;
    a graph with no initializers read says it by its cache inputs' type. (Not the cache's type alone: a
    kv_cache of fp16 / int8 / int4 is stored apart from how the graph computes.)"""
    floats = {i.elem_type for i in facts.initializers.values()} & {"float16", "float32"}
    if not floats:
        cache = facts.input_types.get(C.past_key(0), "float32")
        return cache if cache in ("float32", "float16") else "float32"
    return "float16" if "float16" in floats else "float32"


def _precision_and_method(m: Manifest, facts: GraphFacts) -> list[str]:
    ops = facts.ops
    float_type = graph_float_type(m, facts)
    q = m.quantization
    if not _says_its_ops(q.method if q is not None else None):
        return []
    claimed = q.method if q is not None and q.method in method_ops() else None
    held = [n for n in method_ops().get(claimed, ()) if ops[n]]
    # the claimed method's own ops (a registered method may write ops another also writes), else whose ops they are
    found, op = (claimed, held[0]) if held else graph_method(ops)
    problems = []
    if claimed != found:
        if found is None:
            problems.append(f"{SAYS} quantization method {claimed}, the graph holds none of its ops "
                            f"({', '.join(method_ops()[claimed])}): it is not quantized")
        else:
            what = f"quantization method {claimed}" if claimed else f"the model is not quantized ({m.precision})"
            problems.append(f"{SAYS} {what}, the graph is {found}-quantized (it holds {op})")
    bits = Counter(n.ints.get("bits", 4) for n in facts.nodes if n.op_type == "MatMulNBits")
    if found == "weight-only":
        linear_bits = bits.most_common(1)[0][0]  # n_layer x 4 linears, one LM head
        if q is not None and q.keep_8bit and q.bits in bits:  # mixed 4 / 8: the linears not kept are q.bits
            linear_bits = q.bits
        precision = f"int{linear_bits}"
        if claimed == found:
            problems += _weight_only(m, facts, bits, linear_bits)
    else:
        precision = "int8" if found else ("fp16" if float_type == "float16" else "fp32")
    if m.precision != precision:
        problems.append(f"{SAYS} precision {m.precision}, the graph's is {precision} "
                        f"({op or 'no quantized op'}, {float_type} cache)")
    half = m.precision == "fp16" or (q is not None and q.float16)
    if precision not in ("fp32", "fp16") and half != (float_type == "float16"):
        problems.append(f"{SAYS} float16 {str(half).lower()}, the graph computes in {float_type} "
                        f"(its cache inputs are {float_type})")
    return problems


def _weight_only(m: Manifest, facts: GraphFacts, bits: Counter, linear_bits: int) -> list[str]:
    q, problems = m.quantization, []
    if q.bits != linear_bits:
        problems.append(f"{SAYS} bits {q.bits}, the graph's MatMulNBits linears are {linear_bits}-bit")
    if q.embedding_bits not in bits and m.task is None:  # a task head's graph has no LM head: no MatMulNBits reads it
        problems.append(f"{SAYS} embedding_bits {q.embedding_bits}, the graph's MatMulNBits are "
                        f"{' and '.join(map(str, sorted(bits)))}-bit")
    if q.bits == 4 and m.task is None:  # the 8-bit MatMulNBits: the linears kept at 8 bits, and an 8-bit LM head
        layouts = [block_linears(m.shape.n_layer, m.shape.arch), older_block_linears(m.shape.n_layer, m.shape.arch)]
        kept, *older = [sum(kept_at_8bit(pair, q.keep_8bit) for pair in names.items()) for names in layouts if names]
        # a packed node holds the linears its B's name joins (quantize/packed_linears.py)
        held = sum(1 + n.inputs[1].count(PACKED_JOIN) for n in facts.nodes
                   if n.op_type == "MatMulNBits" and n.ints.get("bits", 4) == 8 and len(n.inputs) > 1)
        if held - (q.embedding_bits == 8) not in (kept, *older):  # older: a dir written before q|k|v were packed
            problems.append(f"{SAYS} {kept} linears kept at 8 bits (keep_8bit {list(q.keep_8bit)}) and a "
                            f"{q.embedding_bits}-bit LM head, the graph's 8-bit MatMulNBits hold {held}")
    blocks = sorted({n.ints["block_size"] for n in facts.nodes
                     if n.op_type == "MatMulNBits" and "block_size" in n.ints})
    if blocks and blocks != [q.block_size]:
        problems.append(f"{SAYS} block_size {q.block_size}, the graph's MatMulNBits use {', '.join(map(str, blocks))}")
    return problems


def _graph_variant(m: Manifest, facts: GraphFacts) -> list[str]:
    if m.graph not in (C.GRAPH_STANDARD, C.GRAPH_KV_BUFFER):  # a plugin's variant: its contract is its own
        return []
    found = C.GRAPH_KV_BUFFER if facts.ops["GroupQueryAttention"] else C.GRAPH_STANDARD
    shared = GRAPH_VARIANTS.entry(m.graph).shared_buffer if m.graph in GRAPH_VARIANTS.names() else None
    if shared != bool(facts.ops["GroupQueryAttention"]):  # a registered variant declares its contract
        how = ("past and present share one buffer (GroupQueryAttention)" if found == C.GRAPH_KV_BUFFER
               else "past and present are separate tensors (no GroupQueryAttention)")
        return [f"{SAYS} graph {m.graph}, the graph's I/O contract is {found}'s: {how}"]
    return []


def _kv_cache(m: Manifest, facts: GraphFacts) -> list[str]:
    cache = facts.input_types.get(C.past_key(0))
    if cache is None:
        return []
    want = cache_onnx_type(m.kv_cache, graph_float_type(m, facts))
    bits = {n.ints.get("kv_cache_bit_width", 0) for n in facts.nodes if n.op_type == "GroupQueryAttention"}
    if cache != want:
        return [f"{SAYS} kv_cache {m.kv_cache}, the graph's cache is {cache} ({want} expected)"]
    if bits and bits != {KV_CACHES[m.kv_cache].bits}:  # int8 and int4 both fit an 8-bit element
        found = ", ".join(str(b) if b else "float" for b in sorted(bits))
        return [f"{SAYS} kv_cache {m.kv_cache}, the graph's GroupQueryAttention stores {found}-bit values"]
    if m.kv_cache != DEFAULT_KV_CACHE and not bits:
        return [f"{SAYS} kv_cache {m.kv_cache}, which only a kv_buffer graph (GroupQueryAttention) can store"]
    return []


def _wide_mask(m: Manifest, facts: GraphFacts) -> list[str]:
    """wide_mask: the timeline is read from the mask's content (a Mul of attention_mask feeding a ReduceMax)."""
    reads_content = facts.ops["ReduceMax"] > 0 and any(n.op_type == "Mul" and C.ATTENTION_MASK in n.inputs
                                                       for n in facts.nodes)
    if m.wide_mask and (m.graph != C.GRAPH_KV_BUFFER or not reads_content):
        return [f"{SAYS} wide_mask, but the graph reads its timeline from the attention mask's width"]
    return []


def _says_norms(arch: str) -> tuple[str, int] | None:
    """A family's norm kind and how many norms follow its blocks (0 or 1), or None where its line does not say."""
    entry = FAMILIES.entry(arch)
    final = getattr(entry, "final_norm", None)
    return None if final is None else (getattr(entry, "norm", None) or "layer", int(final))


def _arch(m: Manifest, facts: GraphFacts, config: dict) -> list[str]:
    problems = []
    arch, n = m.shape.arch, m.shape.n_layer
    entry = FAMILIES.entry(arch)
    said = getattr(entry, "norm", None)  # None: a plugin's line does not say (no kind check; LayerNorms counted)
    kind = said or "layer"
    counts = {k: sum(facts.ops[op] for op in ops) for k, ops in NORM_OPS.items()}
    other = next((k for k in counts if k != kind and counts[k] and not counts[kind]), None)
    if said is not None and other is not None:  # the graph's norms are all of another kind than the family's
        problems.append(f"{SAYS} arch {arch}, the graph's norms are {NORM_NAMES[other]} ({counts[other]} "
                        f"{' / '.join(NORM_OPS[other])}); {arch}'s are {NORM_NAMES[kind]}")
    norms = counts[kind]
    final = getattr(entry, "final_norm", None)  # None: its line does not say (a plugin)
    # a graph whose past inputs count other layers than claimed: the I/O check names the layer count; the norm
    # count then says nothing about the family
    layers_agree = C.past_key(n - 1) in facts.input_types and C.past_key(n) not in facts.input_types
    if norms and final is not None and layers_agree and norms != 2 * n + final:
        fits = [a for a in FAMILIES.names() if _says_norms(a) == (kind, norms - 2 * n)]
        whose = " or ".join(f"{a}'s" for a in fits) or "no known family's"
        problems.append(f"{SAYS} arch {arch}, the graph is {whose} ({norms} {NORM_NAMES[kind]} for {n} "
                        f"layers; {arch} has {2 * n + final})")
    if "model_type" in config and config["model_type"] != m.shape.arch:
        problems.append(f"{SAYS} arch {m.shape.arch}, config.json says model_type {config['model_type']}")
    for key, name in CONFIG_SHAPE.items():
        if key in config and config[key] != getattr(m.shape, name):
            problems.append(f"{SAYS} {name} {getattr(m.shape, name)}, config.json says {key} {config[key]}")
    return problems


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError) as e:
        return {"__error__": f"{path.name} cannot be read ({type(e).__name__})"}
    return data if isinstance(data, dict) else {"__error__": f"{path.name} is not a JSON object"}


def _special_ids(m: Manifest, config: dict, generation: dict, tokenizer) -> list[str]:
    problems = []
    claims = (("eos_id", m.eos_id, "eos_token_id"), ("bos_id", m.bos_id, "bos_token_id"),
              ("pad_id", m.pad_id, "pad_token_id"))
    for name, value, key in claims:
        if value is not None and not 0 <= value < m.shape.vocab_size:
            problems.append(f"{SAYS} {name} {value}, outside the model's vocabulary (0..{m.shape.vocab_size - 1})")
        for file, data in (("config.json", config), ("generation_config.json", generation)):
            if key in data and data[key] != value and not (isinstance(data[key], list) and value in data[key]):
                problems.append(f"{SAYS} {name} {value}, {file} says {key} {data[key]}")
    if tokenizer is not None:
        specials = {i: t.content for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
        for name, value, _ in claims[:2]:
            if value is None:
                continue
            token = tokenizer.id_to_token(value)
            if token is None:
                problems.append(f"{SAYS} {name} {value}, which tokenizer.json does not have "
                                f"(its {tokenizer.get_vocab_size():,} tokens)")
            elif specials and value not in specials:
                named = ", ".join(f"{c!r} = {i}" for i, c in sorted(specials.items())[:4])
                problems.append(f"{SAYS} {name} {value}, which is {token!r} in tokenizer.json, not one of its special "
                                f"tokens ({named})")
    return problems


def _tokenizer_vocab(m: Manifest, tokenizer) -> list[str]:
    if tokenizer is None:
        return []
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    if size > m.shape.vocab_size:
        return [f"tokenizer.json has {size:,} tokens, the model's vocabulary is {m.shape.vocab_size:,}: its ids "
                "past the model's would be out of range (another model's tokenizer?)"]
    return []


def _external_files(m: Manifest, facts: GraphFacts) -> list[str]:
    if not m.files:
        return []
    base = Path(m.model_file).parent
    recorded = {r.path for r in m.files}
    return [f"the graph reads weights from {loc}, which {MANIFEST_NAME} does not record"
            for loc in facts.external_files if (base / loc).as_posix() not in recorded]


def claim_problems(model_dir: Path, m: Manifest, facts: GraphFacts | None, tokenizer=None,
                   imported: bool = False, ort_format: bool = False) -> list[str]:
    """Every mismatch between the manifest's claims and the graph / files beside it, one line each.

    facts None: a graph gptedge could not read: only the files beside it are compared. ort_format: facts read from
    an ORT-format graph (ort_facts.py), whose converter optimized it: its ops, types and attributes are compared
    (precision, method, graph variant, KV cache, accuracy level), not what optimization rewrites (the position
    table, LayerNorm count, mask reading) nor per-weight values.
    imported: a dir another tool exported (no gptedge.json; the manifest was read from config.json): only the
    graph's context and the tokenizer's vocabulary are checked, as nothing else was claimed."""
    graph = facts if facts is not None and not ort_format else GraphFacts()
    if imported:
        return [p.replace(SAYS, "config.json says") for p in _context(m, graph)] + _tokenizer_vocab(m, tokenizer)
    config, generation = _read_json(model_dir / "config.json"), _read_json(model_dir / "generation_config.json")
    problems = [d["__error__"] for d in (config, generation) if "__error__" in d]
    if facts is not None:
        problems += _precision_and_method(m, facts) + _graph_variant(m, facts) + _kv_cache(m, facts)
        if ort_format:
            problems += recipe_problems(model_dir, model_dir / m.model_file, m, facts, values=False)
        else:
            problems += (_context(m, facts) + _wide_mask(m, facts) + _external_files(m, facts)
                         + recipe_problems(model_dir, model_dir / m.model_file, m, facts))
    return (problems + _arch(m, graph, config) + _tokenizer_vocab(m, tokenizer)
            + _special_ids(m, config, generation, tokenizer)
            + task_problems(m, tokenizer, _read_json(model_dir / "tokenizer_config.json"))
            + companion_problems(model_dir, m, config if "__error__" not in config else {}))
