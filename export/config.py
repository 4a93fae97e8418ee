"""The one frozen config of the reference GPT, read from / written to an HF-style config.json."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.manifest import ModelShape

# HF activation name -> ours. GPT-2 "gelu_new" and openai-gpt "gelu" are both the tanh approximation.
_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu_erf", "relu": "relu"}
_OPENAI_ACTIVATIONS = {"gelu": "gelu_tanh", "relu": "relu"}
ACTIVATIONS = ("gelu_tanh", "gelu_erf", "relu")


@dataclass(frozen=True)
class GPTConfig:
    arch: str = "gpt2"  # "gpt2": pre-LN with final LN; "openai-gpt": post-LN, no final LN
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
        if self.arch not in ("gpt2", "openai-gpt"):
            raise CheckpointError(f"config: arch {self.arch!r} is not gpt2 or openai-gpt")
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

    def shape(self) -> ModelShape:
        return ModelShape(self.arch, self.n_layer, self.n_head, self.head_dim, self.vocab_size, self.n_positions)

    @classmethod
    def from_hf(cls, d: dict[str, Any]) -> "GPTConfig":
        """Read an HF config.json dict (GPT2Config or OpenAIGPTConfig); unsupported fields raise, naming the field."""
        model_type = d.get("model_type")
        if model_type == "gpt2":
            act = d.get("activation_function", "gelu_new")
            if act not in _GPT2_ACTIVATIONS:
                raise CheckpointError(f"config.json: activation_function {act!r} is not supported")
            for name, ok in (("scale_attn_weights", True), ("scale_attn_by_inverse_layer_idx", False),
                             ("add_cross_attention", False), ("tie_word_embeddings", True)):
                if d.get(name, ok) != ok:
                    raise CheckpointError(f"config.json: {name}={d[name]!r} is not supported")
            return cls(arch="gpt2", vocab_size=_int(d, "vocab_size", 50257), n_positions=_int(d, "n_positions", 1024),
                       n_embd=_int(d, "n_embd", 768), n_layer=_int(d, "n_layer", 12), n_head=_int(d, "n_head", 12),
                       n_inner=d.get("n_inner"), activation=_GPT2_ACTIVATIONS[act],
                       layer_norm_epsilon=float(d.get("layer_norm_epsilon", 1e-5)),
                       bos_token_id=d.get("bos_token_id", 50256), eos_token_id=d.get("eos_token_id", 50256))
        if model_type == "openai-gpt":
            act = d.get("afn", "gelu")
            if act not in _OPENAI_ACTIVATIONS:
                raise CheckpointError(f"config.json: afn {act!r} is not supported")
            return cls(arch="openai-gpt", vocab_size=_int(d, "vocab_size", 40478), n_positions=_int(d, "n_positions", 512),
                       n_embd=_int(d, "n_embd", 768), n_layer=_int(d, "n_layer", 12), n_head=_int(d, "n_head", 12),
                       activation=_OPENAI_ACTIVATIONS[act], layer_norm_epsilon=float(d.get("layer_norm_epsilon", 1e-5)),
                       bos_token_id=d.get("bos_token_id"), eos_token_id=d.get("eos_token_id"))
        raise CheckpointError(f"config.json: model_type {model_type!r} is not supported (gpt2 or openai-gpt)")

    def to_hf(self) -> dict[str, Any]:
        """An HF config.json that transformers and Optimum load as GPT2Config / OpenAIGPTConfig."""
        common = {"vocab_size": self.vocab_size, "n_positions": self.n_positions, "n_embd": self.n_embd,
                  "n_layer": self.n_layer, "n_head": self.n_head, "layer_norm_epsilon": self.layer_norm_epsilon}
        if self.arch == "gpt2":
            act = {"gelu_tanh": "gelu_new", "gelu_erf": "gelu", "relu": "relu"}[self.activation]
            return {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], **common, "n_inner": self.n_inner,
                    "activation_function": act, "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
                    "tie_word_embeddings": True, "use_cache": True}
        if self.activation == "gelu_erf":
            raise CheckpointError("config: openai-gpt has no exact-erf GELU in transformers")
        act = {"gelu_tanh": "gelu", "relu": "relu"}[self.activation]
        return {"model_type": "openai-gpt", "architectures": ["OpenAIGPTLMHeadModel"], **common, "afn": act,
                "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _int(d: dict[str, Any], key: str, default: int) -> int:
    value = d.get(key, default)
    if not isinstance(value, int) or value <= 0:
        raise CheckpointError(f"config.json: {key}={value!r} is not a positive integer")
    return value
