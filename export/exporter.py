"""gptedge export: guard -> load -> build graph -> save -> validate -> manifest, atomically."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx

from gptedge import __version__
from gptedge.atomic import atomic_output_dir, check_output
from gptedge.onnx_files import save_onnx
from gptedge.runtime.contract import GRAPH_STANDARD, IONames
from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.genai_config import write_genai_files
from gptedge.runtime.manifest import MODEL_FILE, GraphParity, GreedyParity, Manifest, Parity, Source, write_json, write_manifest

from .checkpoint import file_sha256, load_checkpoint, weights_file
from .config import GPTConfig
from .hub import resolve_source
from .onnx_graph import DEFAULT_OPSET, build_graph
from .reference import GPT
from .tokenizer_files import write_tokenizer
from .validate import compare_graph, compare_greedy, greedy_prompts

log = logging.getLogger(__name__)

MIN_OPSET = DEFAULT_OPSET


def check_opset(opset: int) -> None:
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise CheckpointError(f"opset {opset} is not supported: choose {MIN_OPSET}..{newest}")


def export_model(reference: GPT, out: str | Path, force: bool = False, opset: int = DEFAULT_OPSET,
                 source_dir: Path | None = None, source_info: dict | None = None, validate: bool = True,
                 greedy_tokens: int = 64, fused: bool = True, graph_variant: str = GRAPH_STANDARD) -> Manifest:
    """Write a model directory for `reference`; validation failure leaves nothing behind."""
    check_opset(opset)
    cfg: GPTConfig = reference.cfg
    out = Path(out)
    with atomic_output_dir(out, force, inputs=[source_dir] if source_dir else ()) as tmp:
        weights = {k: v.detach().to("cpu").float().numpy() for k, v in reference.state_dict().items()}
        try:
            graph = build_graph(cfg, weights, opset, fused=fused, graph=graph_variant)
        except ValueError as e:
            raise CheckpointError(f"graph {graph_variant!r}: {e}") from None
        fused_ops = sorted({n.op_type for n in graph.graph.node if n.domain == "com.microsoft"})
        save_onnx(graph, tmp / MODEL_FILE)
        write_json(tmp / "config.json", cfg.to_hf())
        write_json(tmp / "generation_config.json",
                   {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.eos_token_id})
        has_tokenizer = write_tokenizer(source_dir, tmp, cfg.vocab_size) if source_dir else False
        names = IONames(cfg.n_layer)
        manifest = Manifest(shape=cfg.shape(), precision="fp32", eos_id=cfg.eos_token_id, bos_id=cfg.bos_token_id,
                            pad_id=cfg.eos_token_id, graph=graph_variant, inputs=tuple(names.inputs),
                            outputs=tuple(names.outputs),
                            source=Source(**(source_info or {}), opset=opset, gptedge_version=__version__,
                                          activation=cfg.activation, layer_norm_epsilon=cfg.layer_norm_epsilon,
                                          contrib_ops=tuple(fused_ops)))
        write_manifest(tmp, manifest)
        write_genai_files(tmp, manifest)
        if validate:
            manifest = manifest.replace(parity=validate_model_dir(reference, tmp, has_tokenizer, greedy_tokens))
            write_manifest(tmp, manifest)
    log.info("wrote %s", out)
    return manifest


def validate_model_dir(reference: GPT, model_dir: Path, has_tokenizer: bool, greedy_tokens: int = 64) -> Parity:
    from gptedge.runtime import load

    loaded = load(model_dir, device="cpu")
    tokenizer = loaded.tokenizer if has_tokenizer else None
    graph = compare_graph(reference.eval(), loaded)
    greedy = compare_greedy(reference, loaded, greedy_prompts(reference.cfg.vocab_size, tokenizer),
                            greedy_tokens, tokenizer)
    return Parity(graph_vs_reference=GraphParity(**{**graph, "index": tuple(graph["index"])}),
                  greedy_vs_reference=GreedyParity(**greedy), device="cpu")


def export_checkpoint(source: str | Path, out: str | Path, force: bool = False, opset: int = DEFAULT_OPSET,
                      validate: bool = True, fused: bool = True, graph_variant: str = GRAPH_STANDARD,
                      revision: str | None = None) -> Manifest:
    """A local HF checkpoint directory (or a Hugging Face Hub id, see hub.py) -> a gptedge model directory."""
    out = Path(out)
    check_opset(opset)
    check_output(out, force, inputs=[source])  # before the (slow) load, and before any download
    source, hub_info = resolve_source(source, revision)
    reference, _ = load_checkpoint(source)
    info = {"path": str(source.resolve()), "weights": weights_file(source).name,
            "sha256": file_sha256(weights_file(source)), **hub_info}
    return export_model(reference, out, force, opset, source_dir=source, source_info=info, validate=validate,
                        fused=fused, graph_variant=graph_variant)
