"""The one frozen config of the reference GPT; each family reads and writes its HF config.json (families.py).

config.py -> families.py -> base.py, and each family module -> config.py: no cycle (families.py finds the
family modules by name, through runtime/registry.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.manifest import ModelShape
from gptedge.runtime.registry import FAMILIES

from .families import family, family_for_model_type

ACTIVATIONS = ("gelu_tanh", "gelu_erf", "relu", "silu")  # silu: the gated MLPs of Llama-style families


@dataclass(frozen=True)
class GPTConfig:
    arch: str = "gpt2"  # the family (families.py): "gpt2" pre-LN with final LN; "openai-gpt" post-LN, no final LN
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_inner: int | None = None  # MLP width, 4 * n_embd when None
    activation: str = "gelu_tanh"
    layer_norm_epsilon: float = 1e-5
    bos_token_id: int | None = 50256
    eos_token_id: int | None = 50256

    def __post_init__(self) -> None:
        FAMILIES.check(self.arch, CheckpointError, where="config: arch")
        if self.activation not in ACTIVATIONS:
            raise CheckpointError(f"config: activation {self.activation!r} is not one of {ACTIVATIONS}")
        if self.n_embd % self.n_head:
            raise CheckpointError(f"config: n_embd {self.n_embd} is not divisible by n_head {self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def mlp_dim(self) -> int:
        return self.n_inner or 4 * self.n_embd

    # What a family with more hyper-parameters (llama.py's LlamaConfig) overrides: the KV cache's heads, an
    # untied LM head, every end-of-sequence id
    @property
    def kv_heads(self) -> int:
        return self.n_head

    @property
    def tied_head(self) -> bool:
        return True

    @property
    def eos_ids(self) -> tuple[int, ...]:
        """Every end-of-sequence id where there are several; () where eos_token_id alone ends a sequence."""
        return ()

    def shape(self) -> ModelShape:
        return ModelShape(self.arch, self.n_layer, self.n_head, self.head_dim, self.vocab_size, self.n_positions)

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> "GPTConfig":
        """Read an HF config.json dict with the family its model_type names; unsupported fields raise, naming the field."""
        return family_for_model_type(d.get("model_type")).config_from_hf(d)

    def to_hf(self) -> dict[str, Any]:
        """An HF config.json that transformers and Optimum load (GPT2Config / OpenAIGPTConfig)."""
        return family(self.arch).config_to_hf(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def positive_int(d: dict[str, Any], key: str, default: int) -> int:
    """config.json's `key` (or `default`), refused unless a positive integer."""
    value = d.get(key, default)
    if not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"config.json: {key}={value!r} is not a positive integer")
    return value
