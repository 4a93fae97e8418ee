"""gptedge.json: the manifest of a model directory (DESIGN §2).

Everything the runtime needs comes from here, never from a file name. Frozen dataclasses,
so a typo in a field name raises instead of silently adding a key.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import GRAPH_STANDARD, IONames
from .errors import ModelDirError

MANIFEST_NAME = "gptedge.json"
MODEL_FILE = "model.onnx"
FORMAT_VERSION = 1
PRECISIONS = ("fp32", "fp16", "int8")
ARCHS = ("gpt2", "openai-gpt")


@dataclass(frozen=True)
class ModelShape:
    arch: str  # "gpt2" (pre-LN, final LN) or "openai-gpt" (post-LN, no final LN)
    n_layer: int
    n_head: int
    head_dim: int
    vocab_size: int
    context_length: int

    @property
    def n_embd(self) -> int:
        return self.n_head * self.head_dim


@dataclass(frozen=True)
class Manifest:
    shape: ModelShape
    precision: str = "fp32"
    graph: str = GRAPH_STANDARD
    eos_id: int | None = None
    bos_id: int | None = None
    pad_id: int | None = None
    model_file: str = MODEL_FILE
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    quantization: dict[str, Any] | None = None  # the recipe, None for float graphs
    source: dict[str, Any] = field(default_factory=dict)  # path and sha256 of what it was made from
    parity: dict[str, Any] = field(default_factory=dict)  # figures measured at export / quantize
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ModelDirError(f"manifest precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if self.shape.arch not in ARCHS:
            raise ModelDirError(f"manifest arch {self.shape.arch!r} is not one of {', '.join(ARCHS)}")
        if not self.inputs:
            names = IONames(self.shape.n_layer)
            object.__setattr__(self, "inputs", tuple(names.inputs))
            object.__setattr__(self, "outputs", tuple(names.outputs))

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inputs"], d["outputs"] = list(self.inputs), list(self.outputs)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Manifest":
        try:
            version = d.get("format_version", None)
            if version != FORMAT_VERSION:
                raise ModelDirError(f"manifest format_version {version!r} is not supported (expected {FORMAT_VERSION})")
            d = dict(d)
            shape = ModelShape(**d.pop("shape"))
            d["inputs"] = tuple(d.get("inputs", ()))
            d["outputs"] = tuple(d.get("outputs", ()))
            return cls(shape=shape, **d)
        except TypeError as e:  # unknown or missing field
            raise ModelDirError(f"manifest is malformed: {e}") from None

    def replace(self, **changes: Any) -> "Manifest":
        return dataclasses.replace(self, **changes)


def read_manifest(model_dir: str | Path) -> Manifest:
    path = Path(model_dir) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelDirError(f"{model_dir}: no {MANIFEST_NAME} (not a gptedge model directory)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelDirError(f"{path}: corrupt manifest ({e})") from None
    if not isinstance(data, dict) or "shape" not in data:
        raise ModelDirError(f"{path}: corrupt manifest (no 'shape')")
    return Manifest.from_dict(data)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write next to the final name, then rename, so a reader never sees half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def write_manifest(model_dir: str | Path, manifest: Manifest) -> None:
    write_json(Path(model_dir) / MANIFEST_NAME, manifest.to_dict())
