"""The one frozen config of the reference GPT. Reading and writing an HF config.json is each family's
(families.py: read_hf_config / hf_config), so this module imports no family: families.py -> base.py ->
config.py, and each family module -> config.py, with no way back."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.modeldir.manifest import ModelShape
from gptedge.runtime.registry import FAMILIES

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def positive_int(d: dict[str, Any], key: str, default: int) -> int:
    """config.json's `key` (or `default`), refused unless a positive integer."""
    value = d.get(key, default)
    if not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"config.json: {key}={value!r} is not a positive integer")
    return value
