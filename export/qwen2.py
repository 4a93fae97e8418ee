"""The Qwen2 family (transformers' Qwen2ForCausalLM, model_type "qwen2": Qwen2 / Qwen2.5): the Llama-style
decoder (llama.py) with biases on the q, k and v projections (not the output's). Its sliding-window layers
(use_sliding_window) are refused in one line: the graphs attend to the whole context.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gptedge.runtime.errors import CheckpointError

from . import llama
from .base import Family


def config_from_hf(d: dict[str, Any]) -> llama.LlamaConfig:
    if d.get("use_sliding_window"):
        raise CheckpointError("config.json: use_sliding_window=true is not supported (the graphs attend to the "
                              "whole context)")
    return llama.config_from_hf(d, arch="qwen2", attention_bias=True, o_bias=False)


FAMILY: Family = dataclasses.replace(llama.FAMILY, arch="qwen2", hf_model_type="qwen2", config_from_hf=config_from_hf)
