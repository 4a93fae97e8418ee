"""genai_config.json and tokenizer_config.json: the two files that let ONNX Runtime GenAI run a model dir.

ONNX Runtime GenAI (`onnxruntime-genai`, the C/C++/C#/Java/mobile generation loop) reads a model
folder through its `genai_config.json`. gptedge writes one beside every manifest
(docs/web-and-mobile.md#run-it-elsewhere) so the same dir runs there unchanged. Choices, checked against
onnxruntime-genai 0.18.0 on CPU:

- model type "decoder": GenAI's generic decoder-only model, which binds the graph's I/O by the names
  given here. "gpt2" selects its legacy GPT-2 model with one combined past tensor per layer and fails
  on gptedge's (and Optimum's) separate key/value names ("Model input was not found").
- `past_present_share_buffer`: true for kv_buffer graphs (GenAI then allocates one
  [batch, heads, max_length, head_dim] buffer per layer and binds it as both past and present, as
  gptedge's own runtime does); false for the standard graph, whose attention needs past and present
  to be separate ("attention_bias dimension 3 should be same as total_sequence_length").
- search defaults: generation_config.json's values where it has them; otherwise sampling with top-k 40,
  the setting of GPT-2's own sampling examples, and max_length = the context length.
- the KV cache's storage (manifest `kv_cache`: fp16 / int8 / int4, quantize --kv-cache) needs no field:
  GenAI 0.18 allocates the cache in the element type and shape the graph declares for its past inputs
  (int8 / int4 scales are initializers inside the graph), and its greedy ids equal gptedge's on all four
  caches of the sample model. (onnxruntime-genai's open PR #2187 adds a `kv_cache_quantization` section for
  graphs its own builder writes; a release that requires it would need one here.)
- `logits_to_keep` is never named: GenAI does not know it and leaves it unfed, so graphs give it a
  default (an overridable initializer, 0 = logits for every position, which GenAI then cuts itself).
- tokenizer_config.json: GenAI refuses to load a tokenizer without one; its content only names the
  context and the special token, the BPE itself comes from tokenizer.json.

This module is runtime side: json and the manifest only, no torch or onnx.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..contract import GRAPH_KV_BUFFER, LOGITS, LOGITS_TO_KEEP
from .manifest import MODEL_FILE, Manifest, write_json
from .tokenizer import TOKENIZER_FILE, has_tokenizer

GENAI_CONFIG = "genai_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
GENAI_MODEL_TYPE = "decoder"
# GPT-2's sampling examples (OpenAI's release and HF's text-generation defaults for it) use top-k 40.
DEFAULT_TOP_K = 40
SEARCH_KEYS = ("do_sample", "top_k", "top_p", "temperature", "repetition_penalty")


def genai_config(manifest: Manifest, generation: dict[str, Any] | None = None) -> dict[str, Any]:
    """The genai_config.json for a model dir with this manifest and generation_config.json."""
    shape, gen = manifest.shape, dict(generation or {})
    eos = gen.get("eos_token_id", manifest.eos_id)
    pad = gen.get("pad_token_id", manifest.pad_id)
    bos = gen.get("bos_token_id", manifest.bos_id)
    model: dict[str, Any] = {
        "type": GENAI_MODEL_TYPE,
        "context_length": shape.context_length,
        "vocab_size": shape.vocab_size,
        "decoder": {
            "filename": manifest.model_file,
            "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
            "head_size": shape.head_dim,
            "hidden_size": shape.n_embd,
            "num_attention_heads": shape.n_head,
            "num_key_value_heads": shape.kv_heads,
            "num_hidden_layers": shape.n_layer,
            "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": "position_ids",
                       "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
            "outputs": {"logits": LOGITS, "present_key_names": "present.%d.key",
                        "present_value_names": "present.%d.value"},
        },
    }
    # The original GPT has no special tokens: GenAI then never stops early and pads with 0.
    if eos is not None:
        model["eos_token_id"] = eos
    model["pad_token_id"] = pad if pad is not None else (eos if isinstance(eos, int) else 0)
    if bos is not None:
        model["bos_token_id"] = bos
    search = {"do_sample": True, "top_k": DEFAULT_TOP_K, "top_p": 1.0, "temperature": 1.0,
              "repetition_penalty": 1.0, "num_beams": 1, "num_return_sequences": 1, "min_length": 0,
              "max_length": shape.context_length, "early_stopping": True,
              "past_present_share_buffer": manifest.graph == GRAPH_KV_BUFFER}
    search.update({k: gen[k] for k in SEARCH_KEYS if gen.get(k) is not None})
    return {"model": model, "search": search}


def tokenizer_config(manifest: Manifest) -> dict[str, Any]:
    """A minimal tokenizer_config.json: GenAI needs the file; the BPE, special tokens and pre-tokenizer come
    from tokenizer.json, so nothing here may contradict it (no tokenizer_class, no prefix-space flag)."""
    return {"model_max_length": manifest.shape.context_length}  # what Hugging Face's own gpt2 repo has


def write_genai_files(model_dir: str | Path, manifest: Manifest) -> None:
    """Write genai_config.json (and tokenizer_config.json unless the source brought one) into model_dir."""
    model_dir = Path(model_dir)
    generation = _read_json(model_dir / GENERATION_CONFIG) or {}
    write_json(model_dir / GENAI_CONFIG, genai_config(manifest, generation))
    if not (model_dir / TOKENIZER_CONFIG).is_file():
        write_json(model_dir / TOKENIZER_CONFIG, tokenizer_config(manifest))


@dataclass(frozen=True)
class GenAIReadiness:
    ready: bool
    reason: str  # why not, or what it runs as

    def __str__(self) -> str:
        return f"{'yes' if self.ready else 'no'}: {self.reason}"


def genai_readiness(model_dir: str | Path, manifest: Manifest) -> GenAIReadiness:
    """Whether ONNX Runtime GenAI can run this dir as it is, and if not, the first reason why."""
    model_dir = Path(model_dir)
    config = _read_json(model_dir / GENAI_CONFIG)
    if config is None:
        return GenAIReadiness(False, f"no readable {GENAI_CONFIG} (re-export or re-quantize with this gptedge)")
    model, search = config.get("model", {}), config.get("search", {})
    if model.get("type") != GENAI_MODEL_TYPE:
        return GenAIReadiness(False, f"{GENAI_CONFIG} model.type is {model.get('type')!r}, not {GENAI_MODEL_TYPE!r}")
    filename = model.get("decoder", {}).get("filename", MODEL_FILE)
    if not (model_dir / filename).is_file():
        return GenAIReadiness(False, f"{GENAI_CONFIG} names {filename!r}, which is not in the dir")
    shared = manifest.graph == GRAPH_KV_BUFFER
    if bool(search.get("past_present_share_buffer")) != shared:
        return GenAIReadiness(False, f"past_present_share_buffer must be {str(shared).lower()} for a "
                                     f"{manifest.graph} graph")
    if LOGITS_TO_KEEP in manifest.inputs:  # kv_buffer dirs exported before it had a default
        return GenAIReadiness(False, f"the graph requires {LOGITS_TO_KEEP}, which GenAI does not feed (re-export)")
    if has_tokenizer(model_dir) and not (model_dir / TOKENIZER_CONFIG).is_file():
        return GenAIReadiness(False, f"{TOKENIZER_FILE} without {TOKENIZER_CONFIG} (GenAI's tokenizer needs both)")
    tokens = "text and ids" if has_tokenizer(model_dir) else "ids only (no tokenizer.json)"
    return GenAIReadiness(True, f"decoder, {'shared' if shared else 'separate'} past/present buffers, {tokens}")


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None
