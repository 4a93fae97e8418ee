"""The inputs the bad-invocation rows copy (tests/support/invocations.py) and the folder each row runs in."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from ..support.checkpoints import EXCERPT, tiny_reference


@pytest.fixture(scope="package")
def inputs(tmp_path_factory, gpt2_checkpoint, gpt2_model_dir) -> dict[str, Path]:
    """What rows copy from: the checkpoint, the fp32 model, an int8 one, a model over another vocabulary."""
    from gptedge.export.exporter import export_model
    from gptedge.quantize.quantizer import QuantizeRecipe, quantize_model_dir

    base = tmp_path_factory.mktemp("bad-inputs")
    quantize_model_dir(gpt2_model_dir, base / "int8", QuantizeRecipe("dynamic"))
    # its own eos inside its vocabulary: load refuses a manifest whose eos no token can reach
    export_model(tiny_reference("gpt2", vocab_size=1000, bos_token_id=999, eos_token_id=999), base / "v1000",
                 validate=False)
    text = base / "text.txt"
    text.write_text(EXCERPT.read_text(encoding="utf-8")[:1500], encoding="utf-8")
    return {"ck": gpt2_checkpoint, "m": gpt2_model_dir, "q": base / "int8", "v": base / "v1000", "text.txt": text}


@pytest.fixture
def work(inputs):
    folder = Path(tempfile.mkdtemp(prefix="gptedge-bad-"))
    yield folder
    for p in [folder, *folder.rglob("*")]:  # read-only folders must be writable again to be removed
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o755)
    shutil.rmtree(folder)
