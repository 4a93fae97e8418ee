"""Typed errors: every user-facing failure is one of these, with a one-line message."""


class GptEdgeError(Exception):
    """Base class; the CLI turns it into a one-line error."""


class ModelDirError(GptEdgeError):
    """A model directory is missing, incomplete, corrupt, or disagrees with its graph."""


class DeviceError(GptEdgeError):
    """Unknown device, or the execution provider it needs is not installed."""


class MissingRuntimeError(GptEdgeError):
    """Neither onnxruntime nor onnxruntime-gpu is importable."""


class InvalidArgumentError(GptEdgeError):
    """A generation or command parameter is out of range."""


class PromptTooLongError(GptEdgeError):
    """The prompt leaves no room for a new token inside the context."""


class CheckpointError(GptEdgeError):
    """A source checkpoint cannot be loaded (unknown model_type, missing/extra/mis-shaped tensor)."""


class ParityError(GptEdgeError):
    """An exported or quantized graph failed its comparison against the reference."""


class OutputExistsError(GptEdgeError):
    """The output directory exists and --force was not given."""


class QuantizationError(GptEdgeError):
    """A model cannot be quantized as asked (already quantized, calibration text too short, ...)."""
