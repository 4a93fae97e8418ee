"""At load, the manifest is checked against the graph it describes, so a wrong manifest fails in one
line naming both values instead of as an ONNX Runtime error mid-generation (or not at all).

Names come from the session's inputs and outputs; heads and head size from the declared cache shape where it is
static; the rest from one probe run of a single token
at the last position the manifest claims (context_length - 1): the presents give heads and head
size, the logits the vocabulary, and a position table shorter than the claimed context fails the
run. The probe costs one token's forward pass (about 10 ms for GPT-2 small on 2 cores).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from .. import contract as C
from ..errors import ModelDirError
from ..graphs.graph_variant import GraphVariant
from ..modeldir.manifest import MANIFEST_NAME, Manifest, ModelShape, Source

log = logging.getLogger(__name__)


def check_graph(variant: GraphVariant, manifest: Manifest, model_path: Path) -> None:
    if manifest.source.imported_from and variant.session.get_modelmeta().producer_name == "gptedge":
        raise ModelDirError(f"{model_path.parent}: no {MANIFEST_NAME}, yet gptedge wrote this graph: its manifest "
                            "is missing (restore it, or export / quantize again)")
    _check_names(variant.session, manifest, model_path)
    _check_shape(variant, manifest.shape, model_path)


def _check_names(session, manifest: Manifest, model_path: Path) -> None:
    """The manifest and the graph must agree on every input and output name."""
    graph_in = [i.name for i in session.get_inputs()]
    graph_out = [o.name for o in session.get_outputs()]
    layers = sum(1 for n in graph_in if n.startswith("past_key_values.") and n.endswith(".key"))
    if layers != manifest.shape.n_layer:
        raise ModelDirError(f"{model_path}: {MANIFEST_NAME} says n_layer {manifest.shape.n_layer}, "
                            f"the graph has {layers} layers")
    for kind, declared, actual in (("input", manifest.inputs, graph_in), ("output", manifest.outputs, graph_out)):
        missing = [n for n in declared if n not in actual]
        extra = [n for n in actual if n not in declared]
        if missing or extra:
            what = f"lacks {kind} {missing[0]!r}" if missing else f"has unexpected {kind} {extra[0]!r}"
            raise ModelDirError(f"{model_path}: graph does not match {MANIFEST_NAME}: it {what}")


def _check_shape(variant: GraphVariant, shape: ModelShape, model_path: Path) -> None:
    past = next(i for i in variant.session.get_inputs() if i.name == C.past_key(0))  # (B, nh, P, hs)
    pack = variant.shape.head_dim // variant.kv_width  # 2 for an int4 cache: two values a byte
    heads = "n_head" if shape.n_kv_head is None else "n_kv_head"  # the cache holds kv_heads (GQA: fewer)
    claimed = {"n_head": shape.kv_heads, "n_kv_head": shape.kv_heads, "head_dim": shape.head_dim,
               "vocab_size": shape.vocab_size}
    declared = {heads: past.shape[1], "head_dim": past.shape[3] * pack if isinstance(past.shape[3], int) else None}
    for name, value in declared.items():  # symbolic dims (other exporters) are checked by the probe below
        if isinstance(value, int) and value != claimed[name]:
            raise ModelDirError(f"{model_path}: {MANIFEST_NAME} says {name} {claimed[name]}, "
                                f"the graph has {value}")
    last = shape.context_length - 1
    one = np.ones((1, 1), dtype=np.int64)
    try:
        logits, presents = variant.forward(one * 0, one, one * last, variant.empty_past(1))
    except Exception as e:  # ONNX Runtime raises its own types; the first line says what broke
        raise ModelDirError(f"{model_path}: the graph does not run at position {last} ({MANIFEST_NAME} says "
                            f"context_length {shape.context_length}): {str(e).splitlines()[0][:160]}") from None
    found = {"vocab_size": logits.shape[-1], heads: presents[0].shape[1], "head_dim": presents[0].shape[3] * pack}
    for name, value in found.items():
        if value != claimed[name]:
            raise ModelDirError(f"{model_path}: {MANIFEST_NAME} says {name} {claimed[name]}, "
                                f"the graph has {value}")


def manifest_from_hf_dir(model_dir: Path) -> Manifest:
    """A directory exported by another tool (Optimum): config.json + model.onnx, no gptedge.json."""
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelDirError(f"{model_dir}: no {MANIFEST_NAME} and no config.json (not a model directory)")
    try:
        cfg = json.loads(config_path.read_text(encoding="utf-8"))
        model_type = cfg["model_type"]
        n_layer, n_head, n_embd = cfg["n_layer"], cfg["n_head"], cfg["n_embd"]
        shape = ModelShape(arch=model_type, n_layer=n_layer, n_head=n_head, head_dim=n_embd // n_head,
                           vocab_size=cfg["vocab_size"], context_length=cfg["n_positions"])
        gen_path = model_dir / "generation_config.json"
        gen_cfg = json.loads(gen_path.read_text(encoding="utf-8")) if gen_path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise ModelDirError(f"{config_path}: cannot read the model's shape ({type(e).__name__}: {e})") from None
    eos = gen_cfg.get("eos_token_id", cfg.get("eos_token_id"))
    log.info("%s has no %s: shape read from config.json", model_dir, MANIFEST_NAME)
    return Manifest(shape=shape, eos_id=eos if isinstance(eos, int) else None, bos_id=cfg.get("bos_token_id"),
                    pad_id=gen_cfg.get("pad_token_id"), source=Source(imported_from="config.json"),
                    inputs=tuple(C.IONames(n_layer).inputs), outputs=tuple(C.IONames(n_layer).outputs))
