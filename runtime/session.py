"""ONNX Runtime: import with a one-line hint, pick providers for a device, make sessions."""

from __future__ import annotations

import logging
from typing import Any

from .errors import DeviceError, MissingRuntimeError

log = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda", "auto")
CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"


def import_onnxruntime() -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise MissingRuntimeError(
            "ONNX Runtime is not installed: pip install 'gptedge[cpu]' (or 'gptedge[gpu]' for CUDA), never both"
        ) from None
    return onnxruntime


def available_providers() -> list[str]:
    return list(import_onnxruntime().get_available_providers())


def providers_for(device: str, available: list[str] | None = None) -> list[str]:
    """Execution providers for a device name; fails in one line when the device cannot be had."""
    available = available_providers() if available is None else available
    if device not in DEVICES:
        raise DeviceError(f"unknown device {device!r}: choose cpu, cuda or auto")
    if device == "cuda" or (device == "auto" and CUDA_PROVIDER in available):
        if CUDA_PROVIDER not in available:
            raise DeviceError(
                f"device 'cuda' needs the CUDA execution provider, which this onnxruntime lacks "
                f"(has {', '.join(available)}); install 'gptedge[gpu]' in place of 'gptedge[cpu]'"
            )
        return [CUDA_PROVIDER, CPU_PROVIDER]
    return [CPU_PROVIDER]


def make_session(model_path: str, device: str = "auto", threads: int | None = None,
                 optimized_model_path: str | None = None) -> Any:
    """An InferenceSession on `device`; `threads` sets intra-op threads (None: ONNX Runtime's default)."""
    ort = import_onnxruntime()
    providers = providers_for(device)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # our own logging says what matters; ORT's warnings are noise to users
    if threads:
        options.intra_op_num_threads = threads
    if optimized_model_path:
        options.optimized_model_filepath = optimized_model_path
    session = ort.InferenceSession(model_path, sess_options=options, providers=providers)
    log.info("session on %s (providers used: %s)", device, ", ".join(session.get_providers()))
    return session
