"""The quantizers' numpy oracle as a model dir: an fp32 dir whose weights are replaced by their numpy
quantize-then-dequantize round trip, so ONNX Runtime on it gives what the quantized graph must give."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
from onnx import numpy_helper

from gptedge.onnx_files import save_onnx
from gptedge.quantize import int8_math as qm
from gptedge.quantize import nbit_math as nm
from gptedge.quantize.quantizer import QuantizeRecipe
from gptedge.quantize.rewrite import Rewrite
from gptedge.runtime.modeldir.manifest import read_manifest, write_manifest
from gptedge.runtime.modeldir.recipe import kept_at_8bit


def fake_quantized(fp32_dir, out, recipe: QuantizeRecipe):
    """The fp32 dir with every weight the recipe quantizes replaced by its numpy dequantization."""
    shutil.copytree(fp32_dir, out)
    model = onnx.load(str(fp32_dir / "model.onnx"))
    r = Rewrite(model)
    wte, _, _ = r.tied_embedding()

    def roundtrip(rows, bits):
        if bits == 8:
            return qm.dequantize_blocks_u8(*qm.quantize_blocks_u8(rows, recipe.block_size, recipe.scale_search))
        return nm.dequantize_4bit(*nm.quantize_4bit(rows, recipe.block_size, recipe.symmetric,
                                                    scale_search=recipe.scale_search))

    new = {wte: roundtrip(r.weights[wte], recipe.embedding_bits)}
    new.update({n.input[1]: roundtrip(r.weights[n.input[1]].T, 8 if kept_at_8bit(n.input[1].removesuffix(".weight"),
                                                                        recipe.keep_8bit) else recipe.bits).T
                for n in model.graph.node if r.is_linear(n)})
    for t in model.graph.initializer:
        if t.name in new:
            t.CopyFrom(numpy_helper.from_array(new[t.name].astype(np.float32), t.name))
    (out / "model.onnx").unlink()
    for extra in out.glob("model.onnx.data"):
        extra.unlink()
    save_onnx(model, out / "model.onnx")
    write_manifest(out, read_manifest(out))  # the new graph's size and hash: load checks them
    return out
