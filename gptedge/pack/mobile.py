"""`gptedge pack --target mobile`: a model dir -> the ORT format, for ONNX Runtime Mobile and GenAI's mobile packages.

The graph is converted by onnxruntime's own converter (`onnxruntime.tools.convert_onnx_models_to_ort`, what
`python -m onnxruntime.tools.convert_onnx_models_to_ort` runs), with its "Fixed" optimization style: the graph
optimizations are applied once, at conversion, and saved (a phone then loads a graph it need not optimize). The
NCHWc layout transform, which only x86 runs, is left out unless `--platform amd64`; `arm` (the default, phones)
also lets QDQ graphs run as int8 (`session.qdqisint8allowed`). The converter also writes the operators (and their
types) the model needs: the config a minimal ONNX Runtime build takes (`build.sh --minimal_build
--include_ops_by_config required_operators_and_types.config --enable_reduced_operator_type_support`).

Layout: the source dir with model.onnx replaced by model.ort; gptedge.json's model_file and genai_config.json's
decoder filename name it, so `gptedge generate OUT` and ONNX Runtime GenAI run the folder as before.

    model.ort                                  the graph and its weights (a flatbuffer: no external data, < 2 GB)
    required_operators_and_types.config        for a reduced-operator ONNX Runtime build
    gptedge.json genai_config.json config.json generation_config.json tokenizer.json tokenizer_config.json
    chat_template.jinja                        the source's chat template, where it has one (serve's chat route)
    gptedge-pack.json                          what was packed, with the converter's version and settings
    gptedge-selftest.json                      the golden self-test: the Python runtime's greedy ids and top logits
                                               on a few prompts, for the app to replay on the phone (selftest.py)
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import shutil
from pathlib import Path

import onnxruntime
from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort

from gptedge import __version__
from gptedge.onnx_files import external_data_path
from gptedge.runtime.errors import GptEdgeError
from gptedge.runtime.graphs.quiet_logs import ORT_ERROR, quiet_logs
from gptedge.runtime.modeldir.chat_template import CHAT_TEMPLATE_FILE
from gptedge.runtime.modeldir.genai_config import GENAI_CONFIG, GENERATION_CONFIG, TOKENIZER_CONFIG
from gptedge.runtime.checks.pipeline import check_model_dir
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, write_json, write_manifest
from gptedge.runtime.modeldir.onnx_wire import is_ort_format
from gptedge.runtime.modeldir.tokenizer import TOKENIZER_FILE
from gptedge.runtime.modeldir.web_ready import recipe_dtype

from .selftest import graph_entry, write_selftest
from .web import PACK_FORMAT, PACK_MANIFEST

log = logging.getLogger(__name__)
# The converter's module logs at INFO on a logger of its own ("Created config in <scratch path>"): ours says what
# was written.
CONVERTER_LOGGER = "ort_format_model.utils"

ORT_MODEL = "model.ort"
OPS_CONFIG = "required_operators_and_types.config"
PLATFORMS = ("arm", "amd64")
ORT_FORMAT_LIMIT = 2**31 - 1  # a flatbuffer addresses at most 2 GB, and the ORT format has no external data
COPIED = ("config.json", GENERATION_CONFIG, TOKENIZER_FILE, TOKENIZER_CONFIG, CHAT_TEMPLATE_FILE)


class MobilePackError(GptEdgeError):
    """A model dir the ORT format cannot hold, or a conversion that failed."""


def write_mobile_model(source: Path, dest: Path, platform: str = "arm") -> dict:
    """The ORT-format folder for the model dir `source` into the existing empty dir `dest` -> its pack manifest."""
    source = Path(source)
    manifest = check_model_dir(source)  # files, hashes and every claim, before the converter reads the graph
    graph = source / manifest.model_file
    if is_ort_format(graph):
        raise MobilePackError(f"{source}: its graph {manifest.model_file} is already in the ORT format (a mobile "
                              "pack): pack the model dir it was made from")
    data = external_data_path(graph)
    size = graph.stat().st_size + (data.stat().st_size if data else 0)
    if size > ORT_FORMAT_LIMIT:
        raise MobilePackError(f"{source}: {size / 2**30:.2f} GB of graph and weights; the ORT format holds at most "
                              "2 GB: quantize it first")
    out = io.StringIO()
    try:
        # the converter's sessions warn about graph inputs that are also initializers (logits_to_keep: an optional
        # input with a default, on purpose) on stderr; it prints its progress: that goes to the log instead
        with quiet_logs(ORT_ERROR, {CONVERTER_LOGGER: logging.WARNING}), contextlib.redirect_stdout(out):
            convert_onnx_models_to_ort(graph, output_dir=dest, optimization_styles=[OptimizationStyle.Fixed],
                                       target_platform=platform, enable_type_reduction=True)
    except Exception as e:  # noqa: BLE001 - ONNX Runtime raises its own types; one line naming the converter
        raise MobilePackError(f"{graph}: onnxruntime's ORT format converter failed: "
                              f"{str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}") from e
    finally:
        for line in out.getvalue().splitlines():
            log.info("converter: %s", line)
    converted = (dest / Path(manifest.model_file).with_suffix(".ort").name).resolve()
    config = dest / f"{Path(manifest.model_file).stem}.{OPS_CONFIG}"
    if not converted.is_file() or not config.is_file():
        raise MobilePackError(f"{graph}: the converter wrote no {converted.name} / {config.name}")
    converted.replace(dest / ORT_MODEL)
    # its header names the model it was made from: the scratch path, which is about to become OUT
    (dest / OPS_CONFIG).write_text(config.read_text(encoding="utf-8").replace(str(converted), ORT_MODEL),
                                   encoding="utf-8")
    config.unlink()
    for name in COPIED:
        if (source / name).is_file():
            shutil.copyfile(source / name, dest / name)
    write_manifest(dest, manifest.replace(model_file=ORT_MODEL))
    if (source / GENAI_CONFIG).is_file():
        genai = json.loads((source / GENAI_CONFIG).read_text(encoding="utf-8"))
        genai["model"]["decoder"]["filename"] = ORT_MODEL
        write_json(dest / GENAI_CONFIG, genai)
    pack = {"format": PACK_FORMAT, "target": "mobile", "gptedge_version": __version__, "platform": platform,
            "converter": f"onnxruntime {onnxruntime.__version__} convert_onnx_models_to_ort "
                         "(optimization style Fixed, level all, type reduction)",
            "model": ORT_MODEL, "bytes": (dest / ORT_MODEL).stat().st_size, "operators_config": OPS_CONFIG,
            "operators": _operators(dest / OPS_CONFIG), "source": str(source.resolve()),
            "source_manifest": MANIFEST_NAME}
    write_selftest(dest, [graph_entry(source, manifest, recipe_dtype(manifest)[0] or "fp32", ORT_MODEL,
                                     "mobile")])
    write_json(dest / PACK_MANIFEST, pack)
    return pack


def _operators(config: Path) -> list[str]:
    """'domain;opset;Op1{types},Op2' lines -> ['domain:Op1', ...] (the config's comments skipped)."""
    ops = []
    for line in config.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        domain, _, names = line.split(";", 2)
        depth, name = 0, ""
        for ch in names + ",":  # commas inside a {types} block belong to it
            depth += ch == "{"
            depth -= ch == "}"
            if ch == "," and depth == 0:
                ops.append(f"{domain}:{name.split('{', 1)[0]}")
                name = ""
            else:
                name += ch
    return sorted(set(ops))
