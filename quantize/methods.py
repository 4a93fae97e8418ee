"""Quantization methods by name: one module each (dynamic.py, static.py, weight_only.py; fp16.py, the one
method that quantizes nothing but halves every float), implementing quantize/base.py's Method and listed
by name in runtime/registry.py (QUANTIZATION_METHODS). A new method is its module plus one line there.

quantizer.py does the rest, the same for every method: guard -> rewrite -> save -> validate,
in an atomic output directory.
"""

from __future__ import annotations

from gptedge.runtime.registry import QUANTIZATION_METHODS

from .base import Method


def method(name: str) -> Method:
    """The method a recipe names (the recipe has already refused unknown names)."""
    return QUANTIZATION_METHODS.load(name)
