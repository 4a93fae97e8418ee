"""Load a local HF checkpoint directory into the reference GPT.

guard -> load -> validate: config.json and model.safetensors or pytorch_model.bin,
GPT2LMHeadModel / OpenAIGPTLMHeadModel key names, fp32/fp16/bf16 stored weights (computed in fp32).
Anything unexpected fails naming the tensor or field.

The weights are held once: the reference is built on the meta device (no memory, no random
init) and takes the loaded tensors as its parameters (`load_state_dict(assign=True)`), so GPT-2
XL's 6.2 GB are not allocated twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path

import torch

from gptedge.runtime.errors import CheckpointError

from .config import GPTConfig
from .families import family, hf_config, read_hf_config
from .reference import GPT

log = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Buffers older transformers saved (causal masks); they carry no weights.
_IGNORED = re.compile(r"^h\.\d+\.attn\.(bias|masked_bias)$|^position_ids$")
# The task heads of transformers' *ForSequenceClassification (`score`) and *DoubleHeadsModel
# (`multiple_choice_head`): task_heads.py exports them; a language-model export leaves them out.
HEAD_PREFIXES = ("score.", "multiple_choice_head.")


def split_head_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove the task head's tensors from `tensors` -> them, under their HF names."""
    return {k: tensors.pop(k) for k in [k for k in tensors if k.startswith(HEAD_PREFIXES)]}


def read_config(source: Path) -> GPTConfig:
    path = source / "config.json"
    if not source.is_dir():
        raise CheckpointError(f"{source}: not a directory")
    try:
        return read_hf_config(_with_generation_eos(source, json.loads(path.read_text(encoding="utf-8"))))
    except FileNotFoundError:
        raise CheckpointError(f"{source}: no config.json") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def _with_generation_eos(source: Path, config: dict) -> dict:
    """config.json's dict with generation_config.json's end-of-sequence ids where that file lists several: what
    transformers' generate() stops at (Qwen2.5-Instruct's config.json names <|endoftext|> alone, its
    generation_config.json also <|im_end|>)."""
    path = source / "generation_config.json"
    try:
        ids = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id") if path.is_file() else None
    except (OSError, ValueError, AttributeError):
        raise CheckpointError(f"{path}: not a JSON object") from None
    if isinstance(ids, list) and len(ids) > 1 and isinstance(config, dict):
        return {**config, "eos_token_id": ids}
    return config


def weights_file(source: Path) -> Path:
    for name in WEIGHT_FILES:
        if (source / name).is_file():
            return source / name
    raise CheckpointError(f"{source}: no model.safetensors or pytorch_model.bin")


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path))
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors / pickle raise many types for a damaged file
        raise CheckpointError(f"{path}: cannot read weights ({type(e).__name__}: {e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a state dict")
    return state


def load_state(cfg: GPTConfig, tensors: dict[str, torch.Tensor], origin: str) -> dict[str, torch.Tensor]:
    """Rename, check every tensor against the reference's parameters, convert to fp32.

    Consumes `tensors`: each entry is dropped once converted, so a fp16 / bf16 source is not held beside
    its fp32 copy."""
    with torch.device("meta"):
        expected = {k: v.shape for k, v in GPT(cfg).state_dict().items()}
    state: dict[str, torch.Tensor] = {}
    lm_head = None
    fam = family(cfg.arch)
    for key, t in tensors.items():
        name = fam.our_name(key)
        if name == "lm_head.weight" and name not in expected:  # tied: checked against wte below
            lm_head = t
            continue
        if _IGNORED.match(name):
            continue
        if name not in expected:
            raise CheckpointError(f"{origin}: unexpected tensor {key!r}")
        if tuple(t.shape) != tuple(expected[name]):
            raise CheckpointError(f"{origin}: tensor {key!r} has shape {list(t.shape)}, expected "
                                  f"{list(expected[name])}")
        if not t.is_floating_point():
            raise CheckpointError(f"{origin}: tensor {key!r} has dtype {t.dtype}, expected a float")
        state[name] = t.to(torch.float32).contiguous()
        tensors[key] = None  # a converted copy (fp16 / bf16 source) replaces the original, not beside it
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(f"{origin}: missing tensor {missing[0]!r}" + (f" (and {len(missing) - 1} more)"
                                                                            if len(missing) > 1 else ""))
    if lm_head is not None and not torch.equal(lm_head.to(torch.float32), state["wte.weight"]):
        raise CheckpointError(f"{origin}: lm_head.weight differs from the token embedding (untied heads are not "
                              "supported)")
    return state


def load_checkpoint(source: str | Path) -> tuple[GPT, GPTConfig]:
    """A local HF checkpoint dir -> (reference GPT in eval mode, its config)."""
    source = Path(source)
    cfg = read_config(source)
    path = weights_file(source)
    tensors = read_tensors(path)
    head = split_head_tensors(tensors)
    if head:
        log.info("%s: its task head (%s) is not part of a language-model export (export --task exports it)",
                 path, ", ".join(sorted(head)))
    state = load_state(cfg, tensors, path.name)
    del head
    with torch.device("meta"):
        model = GPT(cfg)
    model.load_state_dict(state, assign=True)  # the loaded tensors become the parameters: no second copy
    del state
    log.info("loaded %s (%s, %d layers, %.1fM parameters)", path, cfg.arch, cfg.n_layer,
             sum(p.numel() for p in model.parameters()) / 1e6)
    return model.eval(), cfg


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(model: GPT, out_dir: str | Path, dtype: torch.dtype = torch.float32) -> None:
    """Write config.json + model.safetensors in HF layout (a tied LM head is not stored)."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fam = family(model.cfg.arch)
    state = {fam.hf_name(k): v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_config(model.cfg), indent=2) + "\n", encoding="utf-8")
