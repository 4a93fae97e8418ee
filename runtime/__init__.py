"""gptedge.runtime: ONNX Runtime side. Needs only onnxruntime, numpy and tokenizers; never imports torch.

    model = gptedge.runtime.load("out/int8", device="cpu")
    for piece in model.stream("It is a truth", max_new_tokens=64, top_k=40, temperature=0.8, seed=0):
        print(piece, end="")
"""

from .errors import GptEdgeError
from .modeldir.manifest import Manifest, read_manifest
from .graphs.session import SessionConfig

__all__ = ["GptEdgeError", "Manifest", "SessionConfig", "read_manifest", "load", "load_classifier"]


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
