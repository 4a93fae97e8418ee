"""gptedge.runtime: ONNX Runtime side. Needs only onnxruntime, numpy and tokenizers; never imports torch.

    model = gptedge.runtime.load("out/int8", device="cpu")
    for piece in model.stream("It is a truth", max_new_tokens=64, top_k=40, temperature=0.8, seed=0):
        print(piece, end="")

The public API is this module's names; the rooms below it (modeldir, graphs, generation, checks, serving)
are the implementation, and their module paths may move. `import gptedge.runtime` stays free of numpy (the
CLI imports it at --help): the names that need numpy (LoadedModel, Classifier, Engine, CompletionRequest)
are imported on first use.
"""

from importlib import import_module

from .errors import GptEdgeError, InvalidArgumentError
from .generation.generation_options import BeamOptions, SamplingParams
from .graphs.session import SessionConfig
from .modeldir.manifest import Manifest, read_manifest

# name -> the module (under gptedge.runtime) that defines it, imported when the name is first read
_LAZY = {"LoadedModel": "model", "Classifier": "classify", "Engine": "serving.engine",
         "CompletionRequest": "serving.engine"}

__all__ = ["BeamOptions", "GptEdgeError", "InvalidArgumentError", "Manifest", "SamplingParams", "SessionConfig",
           "read_manifest", "load", "load_classifier", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load(model_dir, device: str = "auto", session: SessionConfig | None = None):
    """Load a model directory on a device ("cpu", "cuda" or "auto") -> LoadedModel.

    session: how ONNX Runtime's session is made (threads, optimization level, provider options)."""
    from .model import load as _load  # onnxruntime is imported only here, with a hint when it is missing

    return _load(model_dir, device=device, session=session)


def load_classifier(model_dir, device: str = "auto", session: SessionConfig | None = None):
    """Load a classifier dir (gptedge export --task) -> Classifier: `.classify(example)` -> label, probabilities.

    See runtime/classify.py; a language-model dir is refused in one line (use load)."""
    from .classify import load_classifier as _load  # numpy and onnxruntime only here, as for load()

    return _load(model_dir, device=device, session=session)
