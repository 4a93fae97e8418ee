"""Saving graphs (needs onnx; used by export and quantize, never by the runtime)."""

from __future__ import annotations

import os
from pathlib import Path

import onnx

# Weights go to model.onnx.data past this size: ONNX Runtime memory-maps external data, so a
# session's peak RSS stays near the weights' size (GPT-2 small fp32: 897 MB inline, 697 MB
# external), and protobuf's 2 GB limit never applies.
EXTERNAL_DATA_THRESHOLD = 64 * 1024 * 1024


def save_onnx(model: onnx.ModelProto, path: Path) -> None:
    """model.onnx, with the weights in model.onnx.data when they pass EXTERNAL_DATA_THRESHOLD bytes."""
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if size > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name + ".data", size_threshold=1024)
        umask = os.umask(0)
        os.umask(umask)
        # onnx creates the data file 0600; it should be as readable as model.onnx beside it
        os.chmod(path.with_name(path.name + ".data"), 0o666 & ~umask)
    else:
        onnx.save_model(model, str(path))
