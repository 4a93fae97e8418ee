"""The Mistral family (transformers' MistralForCausalLM, model_type "mistral"): the Llama-style decoder
(llama.py) without biases, with a sliding attention window. A window shorter than the context is refused in
one line (the graphs attend to the whole context); a window of null or at least max_position_embeddings is
the same computation as Llama's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gptedge.runtime.errors import CheckpointError

from . import llama
from .base import Family


def config_from_hf(d: dict[str, Any]) -> llama.LlamaConfig:
    window, context = d.get("sliding_window"), d.get("max_position_embeddings", 32768)
    if window is not None and (not isinstance(window, int) or window < context):
        raise CheckpointError(f"config.json: sliding_window={window!r} is shorter than the context ({context}); "
                              "gptedge's graphs attend to the whole context")
    return llama.config_from_hf(d, arch="mistral")


FAMILY: Family = dataclasses.replace(llama.FAMILY, arch="mistral", hf_model_type="mistral",
                                     config_from_hf=config_from_hf)
