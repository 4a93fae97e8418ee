"""The model families by name: each is one module (gpt2.py, openai_gpt.py) implementing export/base.py's
Family, listed by name in runtime/registry.py (FAMILIES), which the manifest check reads too. A new family
is its module plus one line there. The family lookups live here and only here: by arch, by config.json's
model_type, and so reading / writing an HF config.json (read_hf_config / hf_config)."""

from __future__ import annotations

from typing import Any

from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.registry import FAMILIES

from .base import Family
from .config import GPTConfig


def family(arch: str) -> Family:
    """The family of GPTConfig.arch / the manifest's shape.arch; one line when it is unknown."""
    FAMILIES.check(arch, CheckpointError, where="config: arch")
    return FAMILIES.load(arch)


def family_for_model_type(model_type: object) -> Family:
    """The family that reads a config.json with this model_type."""
    by_type = {f.hf_model_type: f for f in map(FAMILIES.load, FAMILIES)}
    if model_type not in by_type:
        raise CheckpointError(f"config.json: model_type {model_type!r} is not supported ({' or '.join(by_type)})")
    return by_type[model_type]


def read_hf_config(d: dict[str, Any]) -> GPTConfig:
    """An HF config.json dict -> GPTConfig, read by the family its model_type names; unsupported fields raise,
    naming the field."""
    return family_for_model_type(d.get("model_type")).config_from_hf(d)


def hf_config(cfg: GPTConfig) -> dict[str, Any]:
    """GPTConfig -> an HF config.json that transformers and Optimum load (GPT2Config / OpenAIGPTConfig)."""
    return family(cfg.arch).config_to_hf(cfg)
