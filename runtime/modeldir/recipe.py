"""The quantization recipe: a frozen record of what was asked, validated field by field.

One record from the command line to the manifest: `gptedge quantize` builds it from its options,
the quantizer applies it, and the manifest's `quantization` is this record (as applied: every
default filled in) plus what it did to the graph (manifest.Quantization). It lives in the runtime,
beside the manifest that records it, and needs neither onnx nor numpy: what a method may be asked
for is read from its line in the registry (runtime/registry.py), not from its module.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from ..errors import InvalidArgumentError
from ..registry import FAMILIES, GPT2_LINEARS, QUANTIZATION_METHODS

# 4-bit defaults, chosen by KL(fp32||int4) on the sample model's held-out excerpt
# (docs/quantization.md#4-bit-weight-only):
# an 8-bit tied embedding / LM head halves to quarters the KL for +1 MB; asymmetric blocks of 32 were best.
EMBEDDING_BITS_WITH_INT4 = 8
SYMMETRIC_WITH_INT4 = False


ACTIVATION_SCALES = ("per-row", "per-tensor")
# weight-only: how each block's scale (and zero point) is chosen, in the same storage layout. "range": 8-bit
# |max| / 127, 4-bit the range shrunk from both ends together over a small grid; "mse": the least squared error
# over a wider grid (each end of the range on its own) and least-squares refits (quantize/scale_search.py).
SCALE_SEARCHES = ("range", "mse")


def block_linears(n_layer: int, arch: str = "gpt2") -> dict[str, str]:
    """Every block linear of a model: its graph name (less `.weight`) -> its family-neutral name, as the family's
    registry line says: GPT-2 'h.3.attn.c_proj' -> 'h.3.attention.o', Llama 'h.3.self_attn.o_proj' -> the same.
    An arch the registry does not hold (a plugin read before its line is added) has GPT-2's names."""
    return _per_block(n_layer, FAMILIES.entry(arch).linears if arch in FAMILIES else GPT2_LINEARS)


def older_block_linears(n_layer: int, arch: str) -> dict[str, str] | None:
    """block_linears as an earlier gptedge wrote the family's graphs (before q|k|v were packed), or None."""
    return _per_block(n_layer, FAMILIES.entry(arch).older_linears if arch in FAMILIES else ()) or None


def _per_block(n_layer: int, linears: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return {f"h.{i}.{graph}": f"h.{i}.{neutral}" for i in range(n_layer) for graph, neutral in linears}


def kept_at_8bit(names: str | tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    """Whether a linear matches one of a recipe's keep_8bit patterns by any of its names: its neutral name
    (h.3.attention.o) or its graph's (h.3.attn.c_proj, so GPT-2's old patterns keep working)."""
    names = (names,) if isinstance(names, str) else names
    return any(fnmatchcase(name, p) for name in names for p in patterns)


# The shared (1, b, b) initializer of --rotate-down's rotation (quantize/rotation.py); the manifest check finds it.
ROTATION_INIT = "mlp.down.rotation"
# Joins the linears' initializer names in the name of a packed MatMulNBits' (quantize/packed_linears.py): the
# manifest check counts the linears a node holds by it.
PACKED_JOIN = "+"


@dataclass(frozen=True)
class QuantizeRecipe:
    method: str  # a name in the registry's QUANTIZATION_METHODS
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
    bits: int | None = None  # weight-only: 8 or 4 bits per weight (dynamic / static: 8 only); None: the method's first
    # weight-only 4-bit: True, zero point 8; False, a 4-bit zero point per block. None: False for 4-bit
    # recipes (SYMMETRIC_WITH_INT4), True otherwise (8-bit blocks are symmetric). Filled in.
    symmetric: bool | None = None
    # weight-only: bits of the tied embedding / LM head; None: 8 for 8-bit recipes,
    # EMBEDDING_BITS_WITH_INT4 for 4-bit ones. Filled in, so the manifest records it.
    embedding_bits: int | None = None
    # weight-only: the float parts (activations, scales, biases, LayerNorms, caches) in fp16, for GPUs
    float16: bool = False
    # a task head's dir (export --task): also quantize the head's linear (score on the extract state), or keep it a
    # float MatMul (default). Measured on the sample classifier (samples/sample-classifier/README.md): fp32 head
    # KL(fp32 || q) over the labels -14% static, -18% weight-only 8-bit, -26% 4-bit, +1% dynamic (a wash), for
    # +3.5 KB. Nothing to a language model (its graph has no task head).
    quantize_head: bool = False
    # weight-only 4-bit: linears kept at 8 bits, as fnmatch patterns over their names (`h.3.mlp.c_proj`,
    # `*.mlp.c_proj`, `h.0.*`), the way llama.cpp's Q4_K_M keeps its most sensitive tensors at 5-6 bits. Empty: none.
    keep_8bit: tuple[str, ...] = ()
    # weight-only: SCALE_SEARCHES. Not visible in the graph (the same initializers, other numbers): the manifest's word.
    scale_search: str = "range"
    # weight-only: activation-aware per-channel scales folded into the LayerNorm before each linear that reads one
    # (quantize/awq.py), chosen on the calibration text. Not visible in the graph either (gamma / beta change only).
    awq: bool = False
    # weight-only: the linears' weights rounded by GPTQ-style second-order updates on the calibration text's
    # activations (quantize/gptq.py), in the same blocks. Not visible in the graph either (the levels differ only).
    gptq: bool = False
    # weight-only: each MLP down projection's input rotated online by a randomized Hadamard transform of the block
    # size, its weight rows by the transpose (quantize/rotation.py): down's outlier channels spread over their
    # block before MatMulNBits rounds it. Visible in the graph (three ops a layer; checks/recipe_claims.py checks it).
    rotate_down: bool = False

    def __post_init__(self) -> None:
        if self.method not in QUANTIZATION_METHODS:
            raise InvalidArgumentError(f"unknown method {self.method!r}: choose {', '.join(QUANTIZATION_METHODS)}")
        m = QUANTIZATION_METHODS.entry(self.method)
        if self.bits is None:
            object.__setattr__(self, "bits", m.bits[0])
        if self.float16 and not m.float16:
            raise InvalidArgumentError(f"float16 applies to weight-only (and is what fp16 does), not {self.method}")
        if self.embedding_bits is None:
            object.__setattr__(self, "embedding_bits", EMBEDDING_BITS_WITH_INT4 if self.bits == 4 else self.bits)
        if self.symmetric is None:
            four = 4 in (self.bits, self.embedding_bits)
            object.__setattr__(self, "symmetric", SYMMETRIC_WITH_INT4 if four else True)
        for what, value in (("bits", self.bits), ("embedding bits", self.embedding_bits)):
            if value not in m.bits:
                raise InvalidArgumentError(f"{what} {value} does not apply to {self.method}: it stores "
                                           f"{' or '.join(map(str, sorted(m.bits)))}-bit weights")
        if not self.symmetric and not (m.asymmetric and 4 in (self.bits, self.embedding_bits)):
            raise InvalidArgumentError(f"asymmetric applies to 4-bit weights (bits 4), not {self.bits}-bit "
                                       f"{self.method}")
        if self.keep_8bit and (self.method != "weight-only" or self.bits != 4):
            raise InvalidArgumentError(f"keeping linears at 8 bits applies to weight-only 4-bit (bits 4), not "
                                       f"{self.bits}-bit {self.method}")
        if self.scale_search not in SCALE_SEARCHES:
            raise InvalidArgumentError(f"scale search must be {' or '.join(SCALE_SEARCHES)}, got {self.scale_search!r}")
        for what, asked in (("--scale-search mse", self.scale_search != "range"), ("--awq", self.awq),
                            ("--gptq", self.gptq), ("--rotate-down", self.rotate_down)):
            if asked and self.method != "weight-only":
                raise InvalidArgumentError(f"{what} applies to weight-only (MatMulNBits blocks), not {self.method}")
        if any(not isinstance(p, str) or not p.strip() for p in self.keep_8bit):
            raise InvalidArgumentError("a keep-8-bit pattern must be a non-empty linear name or glob (h.3.mlp.c_proj)")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise InvalidArgumentError(f"block size must be a power of two >= 16, got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise InvalidArgumentError(f"accuracy level must be 0..4, got {self.accuracy_level}")
        if self.activation_scale not in ACTIVATION_SCALES:
            raise InvalidArgumentError(f"activation scale must be {' or '.join(ACTIVATION_SCALES)}, "
                                       f"got {self.activation_scale!r}")
        if self.calibration_sequences < 1 or self.calibration_length < 2:
            raise InvalidArgumentError("calibration needs at least one sequence of two tokens")

    @property
    def half_precision(self) -> bool:
        """Its graph computes in fp16 (fp16, or weight-only --float16): checked on the GPU where there is one."""
        return self.float16 or self.bits == 16
