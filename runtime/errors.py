"""Typed errors: every user-facing failure is one of these, with a one-line message.

`exit_code` is what the CLI exits with: 2 when the command line itself is wrong (an argument
out of range, an output that may not be replaced), 1 when the work failed (files, models,
ONNX Runtime, the environment).
"""


class GptEdgeError(Exception):
    """Base class; the CLI turns it into a one-line error."""

    exit_code = 1


class ModelDirError(GptEdgeError):
    """A model directory is missing, incomplete, corrupt, or disagrees with its graph."""


class DeviceError(GptEdgeError):
    """Unknown device, or the execution provider it needs is not installed."""


class MissingRuntimeError(GptEdgeError):
    """Neither onnxruntime nor onnxruntime-gpu is importable."""


class MissingExtraError(GptEdgeError):
    """A command needs a package from an extra that is not installed."""


class InvalidArgumentError(GptEdgeError):
    """A generation or command parameter is out of range."""

    exit_code = 2


class PromptTooLongError(GptEdgeError):
    """The prompt leaves no room for a new token inside the context."""

    exit_code = 2


class CheckpointError(GptEdgeError):
    """A source checkpoint cannot be loaded (unknown model_type, missing/extra/mis-shaped tensor)."""


class ParityError(GptEdgeError):
    """An exported or quantized graph failed its comparison against the reference."""


class OutputExistsError(GptEdgeError):
    """The output exists and --force was not given, or it is not something --force may replace."""

    exit_code = 2


class OutputNotWritableError(GptEdgeError):
    """The output cannot be written where it was asked for (read-only or not a directory)."""


class QuantizationError(GptEdgeError):
    """A model cannot be quantized as asked (already quantized, calibration text too short, ...)."""


class PeerError(GptEdgeError):
    """A peer engine (CTranslate2, llama.cpp, Optimum) failed to convert, quantize or run a checkpoint."""


# The one place that says how to install a missing part (the runtime, the CLI, the sample model and
# the bench peers all use it). torch comes first and pinned, so pip never pulls a CUDA build.
INSTALL_HINTS = {
    "cpu": "pip install 'gptedge[cpu]' (or 'gptedge[gpu]' for CUDA), never both",
    "export": "pip install torch==2.13.0 'gptedge[export]'",
    "quantize": "pip install 'gptedge[quantize]'",
    "plot": "pip install 'gptedge[plot]'",
    "serve": "pip install 'gptedge[serve]'",
    "peers": "pip install torch==2.13.0 'gptedge[test]' (transformers, optimum, ctranslate2)",
    "ctranslate2": "pip install ctranslate2 (also in 'gptedge[test]')",
    "optimum": "pip install torch==2.13.0 'gptedge[test]' (optimum-onnx)",
    # No wheel on PyPI: pip compiles llama.cpp (docs/performance.md#building-llama-cpp-python).
    "llama.cpp": "CMAKE_BUILD_PARALLEL_LEVEL=2 pip install llama-cpp-python==0.3.36 (compiles llama.cpp: 8-25 min on "
                 "2 cores)",
}


def install_hint(extra: str) -> str:
    """The pip command that installs `extra` (a key of INSTALL_HINTS)."""
    return INSTALL_HINTS[extra]


def missing_extra(package: str | None, extra: str, needed_for: str = "this command") -> MissingExtraError:
    return MissingExtraError(f"{package or 'a package'} is not installed: {needed_for} needs {install_hint(extra)}")
