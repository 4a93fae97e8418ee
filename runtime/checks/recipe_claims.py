"""The quantize recipe's claims that only the graph's numbers and attributes show (issue #35): per_channel (do one
linear's weight scales differ per output channel?), reduce_range (are its int8 weights in the 7-bit range
-63..63, or do they reach 127?) and accuracy_level (MatMulNBits' attribute). One line per contradiction, naming
both values, as model_claims' other lines.

The evidence is the first quantized linear the graph holds (quantize applies one recipe to every linear), so a
check reads one weight tensor, not the model. What is checked per method:
- dynamic: per_channel (the weight scale of MatMulIntegerToFloat / DynamicQuantizeMatMul), reduce_range
  (the int8 weight's largest magnitude: a full-range quantizer maps each channel's largest weight to 127);
- static: per_channel (the scale of the DequantizeLinear that reads an int8 weight; reduce_range does not apply);
- weight-only: accuracy_level, on every MatMulNBits; rotate_down, by the rotation's shared (1, b, b) initializer
  (quantize/rotation.py), its b the recipe's block size (not in an ORT-format graph, whose converter may fold it).
"""

from __future__ import annotations

from pathlib import Path

from ..modeldir.manifest import MANIFEST_NAME, Manifest
from ..modeldir.onnx_wire import GraphFacts
from ..modeldir.recipe import ROTATION_INIT
from .graph_values import read_initializers

SAYS = f"{MANIFEST_NAME} says"
REDUCED_QMAX = 63  # quantize's 7-bit range (quantize/int8_math.py QMAX_REDUCED)
# op -> (its int8 weight input, that weight's scale input)
DYNAMIC_WEIGHT = {"MatMulIntegerToFloat": (1, 3), "DynamicQuantizeMatMul": (1, 2)}


def _first_weight(facts: GraphFacts, method: str) -> tuple[str, str] | None:
    """(weight, scale) initializer names of the first quantized linear of `method`, or None."""
    for node in facts.nodes:
        if method == "dynamic" and node.op_type in DYNAMIC_WEIGHT:
            w, s = DYNAMIC_WEIGHT[node.op_type]
        elif method == "static" and node.op_type == "DequantizeLinear":
            w, s = 0, 1
        else:
            continue
        if len(node.inputs) > max(w, s) and node.inputs[w] in facts.initializers and \
                facts.initializers[node.inputs[w]].elem_type == "int8" and node.inputs[s] in facts.initializers:
            return node.inputs[w], node.inputs[s]
    return None


def _accuracy_level(m: Manifest, facts: GraphFacts) -> list[str]:
    levels = sorted({n.ints.get("accuracy_level", 0) for n in facts.nodes if n.op_type == "MatMulNBits"})
    if levels and levels != [m.quantization.accuracy_level]:
        return [f"{SAYS} accuracy_level {m.quantization.accuracy_level}, the graph's MatMulNBits compute at "
                f"accuracy level {', '.join(map(str, levels))}"]
    return []


def _rotation(m: Manifest, facts: GraphFacts) -> list[str]:
    q = m.quantization
    readers = sum(ROTATION_INIT in n.inputs for n in facts.nodes)
    if bool(readers) != q.rotate_down:
        held = f"rotates {readers} down projections' inputs" if readers else "rotates no down projection's input"
        return [f"{SAYS} rotate_down {str(q.rotate_down).lower()}, the graph {held}"]
    dims = facts.initializers[ROTATION_INIT].dims if ROTATION_INIT in facts.initializers else None
    if readers and dims != (1, q.block_size, q.block_size):
        return [f"{SAYS} rotate_down in blocks of {q.block_size}, the graph's rotation is {dims}"]
    return []


def recipe_problems(model_dir: Path, graph: Path, m: Manifest, facts: GraphFacts, values: bool = True) -> list[str]:
    """The recipe's per_channel / reduce_range / accuracy_level against the graph (a quantized dir only); values
    False: the attributes only (an ORT-format graph, whose initializers its converter rewrote)."""
    q = m.quantization
    if q is None:
        return []
    if q.method == "weight-only":
        return _accuracy_level(m, facts) + (_rotation(m, facts) if values else [])
    if q.method not in ("dynamic", "static") or not values:
        return []
    found = _first_weight(facts, q.method)
    if found is None:
        return []  # the method check (model_claims) already says the graph holds none of its ops
    values = read_initializers(model_dir, graph, set(found))
    weight, scale = values.get(found[0]), values.get(found[1])
    problems = []
    if scale is not None:
        per_channel = len(set(scale.ravel().tolist())) > 1
        if per_channel != q.per_channel:
            how = (f"{len(set(scale.ravel().tolist()))} different scales over its {scale.size} output channels"
                   if per_channel else "one scale for all its output channels")
            problems.append(f"{SAYS} per_channel {str(q.per_channel).lower()}, the graph's {found[0]} has {how}")
    if q.method == "dynamic" and weight is not None and weight.size:
        largest = int(abs(weight.astype("int16")).max())
        if (largest <= REDUCED_QMAX) != q.reduce_range:
            problems.append(f"{SAYS} reduce_range {str(q.reduce_range).lower()}, the graph's {found[0]} reaches "
                            f"{largest} ({'within' if largest <= REDUCED_QMAX else 'past'} the 7-bit range "
                            f"-{REDUCED_QMAX}..{REDUCED_QMAX})")
    return problems
