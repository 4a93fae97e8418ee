"""`gptedge info`: a model dir's manifest, the execution providers, GenAI readiness, and what this install
has registered (families, graph variants, quantization methods, peer engines)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from gptedge.measure.peers import bench_names, compare_names
from gptedge import runtime
from gptedge.runtime.modeldir.genai_config import GenAIReadiness, genai_readiness
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, read_manifest
from gptedge.runtime.registry import FAMILIES, GRAPH_VARIANTS, QUANTIZATION_METHODS
from gptedge.runtime.graphs.session import available_providers, provider_report
from gptedge.runtime.modeldir.web_ready import web_readiness

from .group import command
from .options import device_option


def registered() -> dict:
    """Every registry's names: what a manifest may name, and what --method, --graph and --peers take."""
    return {"families": list(FAMILIES), "graph_variants": list(GRAPH_VARIANTS),
            "quantization_methods": list(QUANTIZATION_METHODS),
            "peers": {"bench": list(bench_names()), "compare": list(compare_names())}}


@command()
@click.argument("model", type=click.Path(path_type=str))
@device_option
def info(model: str, device: str) -> None:
    """Print the manifest of MODEL, the execution providers available and used (with their options, and the GPU
    when CUDA is one), whether ONNX Runtime GenAI and a web browser (pack --target web) can run it, and the families,
    graph variants, quantization methods and peer engines this install has."""
    # A classifier dir (export --task) loads through its own front door, with the same checks (issue #35).
    classifier = (Path(model) / MANIFEST_NAME).is_file() and read_manifest(model).task is not None
    loaded = runtime.load_classifier(model, device=device) if classifier else runtime.load(model, device=device)
    if classifier:  # GenAI runs language models only
        genai = GenAIReadiness(False, "a classifier dir (export --task): ONNX Runtime GenAI runs language models")
    else:
        genai = genai_readiness(model, loaded.manifest)
    web = web_readiness(loaded.manifest)
    click.echo(json.dumps({"model_dir": model, "manifest": loaded.manifest.to_dict(),
                           "kv_cache": loaded.manifest.kv_cache,  # absent from a manifest when fp32
                           "providers_available": available_providers(), **provider_report(loaded.session),
                           "genai_ready": genai.ready, "genai": genai.reason, "web_ready": web.ready, "web": web.reason,
                           "registered": registered()}, indent=2))
