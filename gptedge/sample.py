"""The shipped sample model: what `gptedge generate -p ...` uses when no model is given.

It ships as an HF-layout checkpoint in the source checkout (samples/sample-model) and is
exported on first use into the cache directory ($GPTEDGE_CACHE, else $XDG_CACHE_HOME/gptedge,
else ~/.cache/gptedge), keyed by the checkpoint's checksum; export needs the `export` extra.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from gptedge.atomic import writable_dir_for
from gptedge.runtime.errors import GptEdgeError, OutputNotWritableError, missing_extra
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME

log = logging.getLogger(__name__)

SAMPLE_CHECKPOINT = Path(__file__).resolve().parents[1] / "samples" / "sample-model"


def cache_dir() -> Path:
    if os.environ.get("GPTEDGE_CACHE"):
        return Path(os.environ["GPTEDGE_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gptedge"


def sample_model_dir(checkpoint: Path = SAMPLE_CHECKPOINT) -> Path:
    """The exported sample model, exporting (and validating) it the first time."""
    weights = checkpoint / "model.safetensors"
    if not weights.is_file():
        raise GptEdgeError(f"no MODEL given and the sample model is not at {checkpoint} "
                           "(it ships in the source checkout); pass a model directory")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:12]
    out = cache_dir() / f"sample-model-{digest}"
    if not (out / MANIFEST_NAME).is_file():
        try:
            writable_dir_for(out)
        except OutputNotWritableError as e:
            raise OutputNotWritableError(f"{e}: the sample model is exported there on first use "
                                         "(set GPTEDGE_CACHE to a writable directory)") from None
        try:
            from gptedge.export.exporter import export_checkpoint
        except ImportError as e:
            raise missing_extra(e.name, "export", "exporting the sample model on first use") from None
        log.warning("exporting the sample model into %s (first use only)", out)
        export_checkpoint(checkpoint, out, force=True)
    return out
