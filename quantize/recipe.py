"""The quantization recipe: a frozen record of what was asked, validated field by field."""

from __future__ import annotations

from dataclasses import dataclass

from gptedge.runtime.errors import InvalidArgumentError


ACTIVATION_SCALES = ("per-row", "per-tensor")


@dataclass(frozen=True)
class QuantizeRecipe:
    method: str  # a name in methods.py's registry
    per_channel: bool = True  # dynamic / static: one weight scale per output channel (else one per tensor)
    block_size: int = 32  # weight-only: weights per scale along K
    # weight-only: MatMulNBits compute. 4 (default): activations quantized per block of 32 inside the
    # kernel, int8 dot products; 0: float activations, exact to the weights, but ONNX Runtime 1.31 has
    # no fast 8-bit kernel for it on CPU (GPT-2 small: 2.5 tok/s against 64 at level 4, one thread).
    accuracy_level: int = 4
    quantize_attention: bool = False  # dynamic / static: also quantize QK^T and PV (activation x activation)
    # dynamic: one activation scale per row (each position of each sequence: a row's result does not depend
    # on its batch or prefill chunk), or one per tensor (DynamicQuantizeMatMul: one fused kernel)
    activation_scale: str = "per-row"
    reduce_range: bool = True  # dynamic: 7-bit weights, so u8 x s8 int16 sums never saturate (see int8_math)
    calibration_sequences: int = 32  # static
    calibration_length: int = 128  # static: tokens per sequence, at most the model's context

    def __post_init__(self) -> None:
        from .methods import method_names

        if self.method not in method_names():
            raise InvalidArgumentError(f"unknown method {self.method!r}: choose {', '.join(method_names())}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise InvalidArgumentError(f"block size must be a power of two >= 16, got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise InvalidArgumentError(f"accuracy level must be 0..4, got {self.accuracy_level}")
        if self.activation_scale not in ACTIVATION_SCALES:
            raise InvalidArgumentError(f"activation scale must be {' or '.join(ACTIVATION_SCALES)}, "
                                       f"got {self.activation_scale!r}")
        if self.calibration_sequences < 1 or self.calibration_length < 2:
            raise InvalidArgumentError("calibration needs at least one sequence of two tokens")
