"""Rotary positions (RoPE) for the families that rotate q and k instead of adding a position table.

One source of the angles for the reference and the graph: the reference rotates with `cos_sin` of its
position ids, and the graph stores `tables` (the same float32 products, one row per position) as the
cos/sin caches its rotary ops gather from. The frequencies follow transformers' rope initialisers for
the kinds checkpoints use: default, "linear" (positions interpolated by `factor`) and "llama3" (long
wavelengths divided by `factor`, a smooth blend between); the rotation is the half-split one
(`rotate_half`, not interleaved) on the first `dim` channels of each head.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from gptedge.runtime.errors import CheckpointError

ROPE_KINDS = ("default", "linear", "llama3")
# the keys each kind reads from config.json's rope_scaling (besides "rope_type" / "type")
_KEYS = {"default": (), "linear": ("factor",),
         "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def rope_scaling(d: object) -> tuple[tuple[str, Any], ...]:
    """config.json's rope_scaling -> sorted (key, value) items (a frozen config's field); () for none.
    Kinds gptedge does not implement (dynamic NTK, YaRN, LongRoPE) are refused by name."""
    if d is None:
        return ()
    if not isinstance(d, Mapping):
        raise CheckpointError(f"config.json: rope_scaling {d!r} is not an object")
    kind = d.get("rope_type", d.get("type", "default"))
    if kind not in ROPE_KINDS:
        raise CheckpointError(f"config.json: rope_scaling type {kind!r} is not supported ({', '.join(ROPE_KINDS)})")
    missing = [k for k in _KEYS[kind] if not isinstance(d.get(k), (int, float)) or isinstance(d.get(k), bool)]
    if missing:
        raise CheckpointError(f"config.json: rope_scaling {kind!r} needs a number {missing[0]!r}")
    if d.get("attention_factor") not in (None, 1, 1.0):
        raise CheckpointError("config.json: rope_scaling attention_factor is not supported")
    return tuple(sorted({"rope_type": kind, **{k: d[k] for k in _KEYS[kind]}}.items()))


def inv_freq(dim: int, theta: float, scaling: tuple[tuple[str, Any], ...] = ()) -> torch.Tensor:
    """(dim / 2,) float32 inverse frequencies, as transformers computes them."""
    freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))
    s = dict(scaling)
    kind = s.get("rope_type", "default")
    if kind == "linear":
        return freq / s["factor"]
    if kind == "llama3":
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / freq
        scaled = torch.where(wavelen > old / low, freq / factor, freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        return torch.where(medium, smoothed, scaled)
    return freq


def cos_sin(freq: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """position_ids (...,) -> cos, sin (..., dim / 2) float32: the angle of each position and frequency."""
    angles = position_ids.to(torch.float32)[..., None] * freq.to(position_ids.device)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, n, S, hs); cos, sin (B, S, r / 2): the first r channels of each head rotated half against half,
    the rest passed through (partial rotary)."""
    half = cos.shape[-1]
    c, s = cos[:, None], sin[:, None]  # (B, 1, S, r / 2)
    x1, x2, rest = x[..., :half], x[..., half:2 * half], x[..., 2 * half:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, rest], dim=-1)


def tables(freq: torch.Tensor, n_positions: int) -> tuple[np.ndarray, np.ndarray]:
    """The graph's cos and sin caches (n_positions, dim / 2) float32: cos_sin of every position."""
    cos, sin = cos_sin(freq, torch.arange(n_positions))
    return cos.numpy(), sin.numpy()
