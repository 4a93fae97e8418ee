"""gptedge export: guard -> load -> build graph -> save -> validate -> manifest, atomically.

Memory (issue #14: GPT-2 XL, 6.2 GB of fp32 weights, exports on a 24 GiB machine): the weights
exist once, in the reference GPT. The graph writer streams each weight into model.onnx.data as
it is written (WeightSink) instead of building a protobuf copy; the reference's outputs for
validation are recorded next, and only then is the graph loaded into ONNX Runtime. An export
that owns its reference (export_checkpoint) frees it before that load, so the torch weights and
ONNX Runtime's prepacked copy never coexist: peak RSS is about the larger of the two, plus the
interpreter. Big models validate on fewer greedy positions (validation_plan), as the manifest says.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import onnx

from gptedge import __version__, runtime
from gptedge.atomic import atomic_output_dir, check_output
from gptedge.onnx_files import WeightSink, save_onnx
from gptedge.runtime.contract import GRAPH_KV_BUFFER, GRAPH_STANDARD, IONames
from gptedge.runtime.errors import CheckpointError, InvalidArgumentError
from gptedge.runtime.modeldir.chat_template import CHAT_TEMPLATE_FILE, find_chat_template, special_tokens
from gptedge.runtime.checks.fingerprint import record_fingerprint
from gptedge.runtime.modeldir.genai_config import TOKENIZER_CONFIG, write_genai_files
from gptedge.runtime.modeldir.manifest import MODEL_FILE, Manifest, Parity, Source, write_json, write_manifest
from gptedge.runtime.modeldir.tokenizer import TOKENIZER_FILE, load_tokenizer

from .checkpoint import file_sha256, load_checkpoint, weights_file
from .config import GPTConfig
from .families import hf_config
from .hub import resolve_source
from .onnx_graph import DEFAULT_OPSET, build_graph
from .reference import GPT
from .tokenizer_config import adds_bos
from .tokenizer_files import write_tokenizer
from .validate import (compare_graph_outputs, compare_greedy_ids, graph_steps, greedy_prompts, reference_greedy,
                       reference_outputs)

log = logging.getLogger(__name__)

MIN_OPSET = DEFAULT_OPSET
# Greedy validation (rung 4) runs the model token by token twice (reference and graph), each token
# reading every weight: 3 prompts x 64 tokens is seconds for GPT-2 small and minutes for XL on two
# cores. Past this many bytes of fp32 weights (GPT-2 medium has 1.42 GB, large 3.10 GB) it runs on
# BIG_MODEL_GREEDY_TOKENS per prompt; rung 3 (prefill + decode steps of a padded batch, every output)
# stays whole at every size.
BIG_MODEL_BYTES = 2 * 10**9
BIG_MODEL_GREEDY_TOKENS = 16


def check_opset(opset: int) -> None:
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= newest:
        raise InvalidArgumentError(f"opset {opset} is not supported: choose {MIN_OPSET}..{newest}")  # exit 2


def weight_bytes(reference: GPT) -> int:
    return sum(p.numel() * 4 for p in reference.parameters())  # fp32, as the graph stores them


@dataclass(frozen=True)
class ValidationPlan:
    greedy_tokens: int  # new tokens per greedy prompt
    note: str = ""  # why fewer than asked, for the manifest


def validation_plan(n_bytes: int, greedy_tokens: int) -> ValidationPlan:
    if n_bytes > BIG_MODEL_BYTES and greedy_tokens > BIG_MODEL_GREEDY_TOKENS:
        return ValidationPlan(BIG_MODEL_GREEDY_TOKENS,
                              f"{BIG_MODEL_GREEDY_TOKENS} new tokens per greedy prompt, not {greedy_tokens}: "
                              f"fp32 weights {n_bytes / 1e9:.2f} GB > {BIG_MODEL_BYTES / 1e9:.2f} GB")
    return ValidationPlan(greedy_tokens)


def write_graph(reference: GPT, path: Path, opset: int, fused: bool, graph_variant: str) -> tuple[str, ...]:
    """model.onnx (+ model.onnx.data, streamed) from the reference's weights -> the contrib ops it uses."""
    weights = {k: v.detach().to("cpu").float().numpy() for k, v in reference.state_dict().items()}  # views, no copy
    with WeightSink.for_size(path, sum(w.nbytes for w in weights.values())) as sink:
        try:
            graph = build_graph(reference.cfg, weights, opset, fused=fused, graph=graph_variant, sink=sink)
        except ValueError as e:
            raise CheckpointError(f"graph {graph_variant!r}: {e}") from None
    del weights
    save_onnx(graph, path)
    return tuple(sorted({n.op_type for n in graph.graph.node if n.domain == "com.microsoft"}))


def export_model(reference: GPT, out: str | Path, force: bool = False, opset: int = DEFAULT_OPSET,
                 source_dir: Path | None = None, source_info: dict | None = None, validate: bool = True,
                 greedy_tokens: int = 64, fused: bool = True, graph_variant: str = GRAPH_STANDARD,
                 release_reference: bool = False) -> Manifest:
    """Write a model directory for `reference`; validation failure leaves nothing behind.

    release_reference: free the reference's weights (moved to the meta device) once the graph is written
    and the reference's outputs are recorded, before ONNX Runtime loads the graph; the caller's module is
    unusable afterwards (export_checkpoint, which owns its reference, asks for it)."""
    check_opset(opset)
    cfg: GPTConfig = reference.cfg
    out = Path(out)
    with atomic_output_dir(out, force, inputs=[source_dir] if source_dir else ()) as tmp:
        fused_ops = write_graph(reference, tmp / MODEL_FILE, opset, fused, graph_variant)
        write_json(tmp / "config.json", hf_config(cfg))
        write_json(tmp / "generation_config.json", {"bos_token_id": cfg.bos_token_id,
                                                     "eos_token_id": list(cfg.eos_ids) or cfg.eos_token_id,
                                                     "pad_token_id": cfg.eos_token_id})
        has_tokenizer = write_tokenizer(source_dir, tmp, cfg.vocab_size) if source_dir else False
        add_bos = adds_bos(source_dir, tmp / TOKENIZER_FILE) if has_tokenizer else False
        if source_dir and (template := find_chat_template(source_dir)) is not None:  # what a chat is rendered with
            (tmp / CHAT_TEMPLATE_FILE).write_text(template, encoding="utf-8")
            # the special tokens a template writes (bos_token, eos_token, ...), beside what GenAI reads there
            write_json(tmp / TOKENIZER_CONFIG, {"model_max_length": cfg.n_positions, **special_tokens(source_dir)})
        names = IONames(cfg.n_layer)
        manifest = Manifest(shape=cfg.shape(), precision="fp32", eos_id=cfg.eos_token_id, bos_id=cfg.bos_token_id,
                            pad_id=cfg.eos_token_id, graph=graph_variant, inputs=tuple(names.inputs),
                            wide_mask=graph_variant == GRAPH_KV_BUFFER, eos_ids=cfg.eos_ids, add_bos=add_bos,
                            outputs=tuple(names.outputs),
                            source=Source(**(source_info or {}), opset=opset, gptedge_version=__version__,
                                          activation=cfg.activation, layer_norm_epsilon=cfg.layer_norm_epsilon,
                                          contrib_ops=fused_ops))
        manifest = write_manifest(tmp, manifest)  # records the files' sizes and hashes: validation loads the dir
        write_genai_files(tmp, manifest)
        if validate:
            plan = validation_plan(weight_bytes(reference), greedy_tokens)
            parity = validate_model_dir(reference, tmp, has_tokenizer, plan.greedy_tokens, release_reference,
                                        plan.note)
            manifest = write_manifest(tmp, manifest.replace(parity=parity))
        elif release_reference:
            reference.to("meta")
    log.info("wrote %s", out)
    return manifest


def validate_model_dir(reference: GPT, model_dir: Path, has_tokenizer: bool, greedy_tokens: int = 64,
                       release_reference: bool = False, note: str = "") -> Parity:
    """Rungs 3-4: the reference's outputs first, then (its weights freed if asked) the graph's."""
    tokenizer = load_tokenizer(model_dir) if has_tokenizer else None
    reference.eval()
    steps = graph_steps(reference.cfg)
    expected = reference_outputs(reference, steps)
    prompts = greedy_prompts(reference.cfg.vocab_size, tokenizer)
    greedy_expected = reference_greedy(reference, prompts, greedy_tokens)
    if release_reference:
        reference.to("meta")  # frees the weights before ONNX Runtime makes its own copy
        log.info("reference outputs recorded; its weights released")
    loaded = runtime.load(model_dir, device="cpu")
    return Parity(graph_vs_reference=compare_graph_outputs(expected, loaded, steps),
                  greedy_vs_reference=compare_greedy_ids(greedy_expected, loaded, prompts, greedy_tokens, tokenizer,
                                                         note),
                  device="cpu", fingerprint=record_fingerprint(loaded))


def export_checkpoint(source: str | Path, out: str | Path, force: bool = False, opset: int = DEFAULT_OPSET,
                      validate: bool = True, fused: bool = True, graph_variant: str = GRAPH_STANDARD,
                      revision: str | None = None) -> Manifest:
    """A local HF checkpoint directory (or a Hugging Face Hub id, see hub.py) -> a gptedge model directory."""
    out = Path(out)
    check_opset(opset)
    check_output(out, force, inputs=[source])  # before the (slow) load, and before any download
    source, hub_info = resolve_source(source, revision)
    info = {"path": str(source.resolve()), "weights": weights_file(source).name,
            "sha256": file_sha256(weights_file(source)), **hub_info}
    reference, _ = load_checkpoint(source)
    return export_model(reference, out, force, opset, source_dir=source, source_info=info, validate=validate,
                        fused=fused, graph_variant=graph_variant, release_reference=True)
