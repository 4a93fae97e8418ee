"""`gptedge pack --target web`: model dirs -> the folder transformers.js loads as a text-generation model.

Layout (transformers.js' own, as on the Hugging Face Hub; one graph per dtype, see runtime/modeldir/web_ready.py):

    config.json                  the source's, plus "transformers.js_config" (default dtype, external data)
    generation_config.json       eos / bos / pad ids
    tokenizer.json               byte-level BPE
    tokenizer_config.json        the source's, with clean_up_tokenization_spaces false: gptedge's text never drops
                                 spaces before punctuation, and transformers.js would by default; and the chat
                                 template (chat_template.jinja's) as chat_template, for apply_chat_template
    onnx/model{suffix}.onnx      one per source dir: model.onnx (fp32), model_quantized.onnx (q8), model_int8.onnx,
                                 model_uint8.onnx, model_q4.onnx
    onnx/model{suffix}.onnx_data the weights, where the source keeps them outside the graph (> 64 MB)
    gptedge-pack.json            what was packed: each graph's dtype, recipe, bytes, sha256 and source manifest
    gptedge-selftest.json        each graph's golden self-test: the Python runtime's greedy ids and top logits on a
                                 few prompts, which the playground replays on the device (pack/selftest.py)

The graphs are the sources' graphs unchanged (byte for byte when their weights are inline); only the external data
file is renamed to transformers.js' `<graph>_data` convention, and the graph's references to it with it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import onnx

from gptedge import __version__
from gptedge.atomic import PACK_MANIFEST
from gptedge.onnx_files import external_data_path
from gptedge.runtime.errors import GptEdgeError
from gptedge.runtime.modeldir.genai_config import GENERATION_CONFIG, TOKENIZER_CONFIG
from gptedge.runtime.checks.pipeline import check_model_dir
from gptedge.runtime.modeldir.chat_template import find_chat_template
from gptedge.runtime.modeldir.manifest import Manifest, Source, write_json
from gptedge.runtime.modeldir.onnx_wire import is_ort_format
from gptedge.runtime.modeldir.tokenizer import TOKENIZER_FILE
from gptedge.runtime.modeldir.web_ready import WASM_CONTRIB_OPS, recipe_dtype, web_readiness

from .selftest import graph_entry, write_selftest

PACK_FORMAT = 1
CONTRIB_DOMAIN = "com.microsoft"
# The default dtype (config.json's transformers.js_config.dtype, the page's first choice), best first: the
# recommended web recipe measured by benchmarks/web_bench.py
# (docs/web-and-mobile.md#the-browser-transformersjs-on-onnxruntime-web).
RECOMMENDED_ORDER = ("q8", "int8", "q4", "uint8", "fp32")


class WebPackError(GptEdgeError):
    """A source that cannot be packed for the browser, or sources that cannot share one folder."""


@dataclass(frozen=True)
class WebGraph:
    source: Path
    manifest: Manifest
    dtype: str
    file_name: str  # onnx/model{suffix}.onnx
    recipe: str


def checkpoint_sha256(source: Source) -> str | None:
    """The SHA-256 of the checkpoint weights a dir was exported from (through the fp32 dir for a quantized one)."""
    return source.sha256 or (checkpoint_sha256(source.fp32_source) if source.fp32_source else None)


def plan(sources: list[Path]) -> list[WebGraph]:
    """Check every source before anything is written: the model-dir pipeline (files, hashes, claims), web-ready,
    one dtype each, one model (shape, checkpoint) and tokenizer."""
    graphs = []
    for source in sources:
        manifest = check_model_dir(source)
        if is_ort_format(source / manifest.model_file):
            raise WebPackError(f"{source}: its graph {manifest.model_file} is in the ORT format (a mobile pack), which "
                               "onnxruntime-web does not load from a transformers.js folder: pack the model dir it was "
                               "made from")
        ready = web_readiness(manifest)
        if not ready.ready:
            raise WebPackError(f"{source}: not web-ready: {ready.reason}")
        taken = next((g for g in graphs if g.dtype == ready.dtype), None)
        if taken is not None:
            raise WebPackError(f"{source} and {taken.source} are both transformers.js dtype {ready.dtype!r}: "
                               "pack them into separate folders")
        graphs.append(WebGraph(source, manifest, ready.dtype, ready.file_name, recipe_dtype(manifest)[1]))
    first = graphs[0]
    for g in graphs[1:]:
        if g.manifest.shape != first.manifest.shape:
            raise WebPackError(f"{g.source} is not the same model as {first.source} (shape {g.manifest.shape} vs "
                               f"{first.manifest.shape})")
        ours, theirs = checkpoint_sha256(g.manifest.source), checkpoint_sha256(first.manifest.source)
        if ours != theirs:  # same shape and tokenizer, other weights: two models posing as two dtypes of one
            raise WebPackError(f"{g.source} and {first.source} come from different checkpoints (weights SHA-256 "
                               f"{(ours or 'not recorded')[:16]} vs {(theirs or 'not recorded')[:16]}): pack them into "
                               "separate folders")
        if _read(g.source / TOKENIZER_FILE) != _read(first.source / TOKENIZER_FILE):
            raise WebPackError(f"{g.source} and {first.source} have different {TOKENIZER_FILE} files")
    return graphs


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise WebPackError(f"{path}: {e.strerror}") from None


def check_ops(model: onnx.ModelProto, where: Path) -> None:
    """Every contrib op must be in onnxruntime-web's WASM build."""
    for node in model.graph.node:
        if node.domain == CONTRIB_DOMAIN and node.op_type not in WASM_CONTRIB_OPS:
            raise WebPackError(f"{where}: uses {node.op_type}, which onnxruntime-web's WASM build lacks: "
                               "export with --plain-ops")


def write_graph(graph: WebGraph, dest: Path) -> dict:
    """onnx/model{suffix}.onnx (+ _data) in dest -> its gptedge-pack.json entry."""
    src = graph.source / graph.manifest.model_file
    target = dest / graph.file_name
    target.parent.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(src), load_external_data=False)
    check_ops(model, src)
    data = external_data_path(src)
    external = False
    if data is None:
        shutil.copyfile(src, target)
    else:  # transformers.js fetches `<graph>_data` and hands it to onnxruntime-web under that name
        location = target.name + "_data"
        for t in model.graph.initializer:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                for entry in t.external_data:
                    if entry.key == "location":
                        entry.value = location
        onnx.save_model(model, str(target))
        shutil.copyfile(data, target.with_name(location))
        external = True
    files = [target] + ([target.with_name(target.name + "_data")] if external else [])
    return {"dtype": graph.dtype, "file": graph.file_name, "external_data": external,
            "bytes": sum(f.stat().st_size for f in files), "sha256": _sha256(target), "recipe": graph.recipe,
            "source": str(graph.source.resolve()), "manifest": graph.manifest.to_dict()}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_web_model(sources: list[Path], dest: Path, chat_template: str | None = None) -> dict:
    """The transformers.js folder for `sources` (gptedge model dirs) into the existing empty dir `dest`;
    -> the pack manifest written to dest/gptedge-pack.json. The chat template (`chat_template`, else the first
    source's) goes into tokenizer_config.json, where transformers.js' apply_chat_template reads it."""
    graphs = plan([Path(s) for s in sources])
    first = graphs[0].source
    entries = [write_graph(g, dest) for g in graphs]
    recommended = next(d for d in (*RECOMMENDED_ORDER, *(g.dtype for g in graphs)) if any(g.dtype == d for g in graphs))
    config = json.loads(_read(first / "config.json"))
    js_config = {"dtype": recommended}
    external = {Path(e["file"]).name: 1 for e in entries if e["external_data"]}
    if external:
        js_config["use_external_data_format"] = external
    config["transformers.js_config"] = js_config
    write_json(dest / "config.json", config)
    for name in (GENERATION_CONFIG, TOKENIZER_FILE):
        shutil.copyfile(first / name, dest / name)
    tokenizer_config = json.loads(_read(first / TOKENIZER_CONFIG)) if (first / TOKENIZER_CONFIG).is_file() else {}
    tokenizer_config["clean_up_tokenization_spaces"] = False  # gptedge's decode never cleans up
    template = chat_template or find_chat_template(first)
    if template is not None:
        tokenizer_config["chat_template"] = template
    write_json(dest / TOKENIZER_CONFIG, tokenizer_config)
    pack = {"format": PACK_FORMAT, "target": "web", "gptedge_version": __version__, "recommended": recommended,
            "chat_template": template is not None, "models": entries}
    write_selftest(dest, [graph_entry(g.source, g.manifest, g.dtype, g.file_name, "web") for g in graphs])
    write_json(dest / PACK_MANIFEST, pack)
    return pack
