"""Graph pieces every family's blocks are written with: linear, LayerNorm, activation, MLP.

Plain ONNX ops in shapes ONNX Runtime's optimizer fuses (LayerNormalization, a GELU it turns
into FastGelu/Gelu, one MatMul for QKV), or its contrib FastGelu where the caller asks.
Weights are looked up by reference parameter name (`h.0.mlp.c_fc.weight`) and stored under it.
"""

from __future__ import annotations

import math

from .graph_writer import MS_DOMAIN, GraphWriter, Weights


def linear(g: GraphWriter, x: str, w: Weights, prefix: str, bias: bool = True) -> str:
    """x (B, S, in) @ W (in, out) [+ b]; without the bias, a fused op downstream adds it."""
    y = g.one("MatMul", [x, g.const(f"{prefix}.weight", w[f"{prefix}.weight"])], name=f"{prefix}.MatMul")
    if not bias:
        return y
    return g.one("Add", [y, g.const(f"{prefix}.bias", w[f"{prefix}.bias"])], name=f"{prefix}.Add")


def layer_norm(g: GraphWriter, x: str, w: Weights, prefix: str, eps: float) -> str:
    return g.one("LayerNormalization", [x, g.const(f"{prefix}.weight", w[f"{prefix}.weight"]),
                                        g.const(f"{prefix}.bias", w[f"{prefix}.bias"])],
                 name=prefix, axis=-1, epsilon=eps)


def activation(g: GraphWriter, x: str, kind: str) -> str:
    if kind == "relu":
        return g.one("Relu", [x])
    if kind == "gelu_erf":  # 0.5 x (1 + erf(x / sqrt 2)); ORT fuses this into Gelu
        e = g.one("Erf", [g.one("Div", [x, g.f32(math.sqrt(2.0))])])
        return g.one("Mul", [g.one("Mul", [x, g.one("Add", [e, g.f32(1.0)])]), g.f32(0.5)])
    # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); ORT fuses this into FastGelu
    x3 = g.one("Mul", [g.one("Mul", [x, x]), x])
    inner = g.one("Mul", [g.one("Add", [x, g.one("Mul", [x3, g.f32(0.044715)])]), g.f32(math.sqrt(2.0 / math.pi))])
    return g.one("Mul", [g.one("Mul", [x, g.one("Add", [g.one("Tanh", [inner]), g.f32(1.0)])]), g.f32(0.5)])


def mlp(g: GraphWriter, x: str, w: Weights, prefix: str, kind: str, fast_gelu: bool = False) -> str:
    """c_proj(act(c_fc(x))) (B, S, C). fast_gelu: the c_fc bias and the tanh GELU in one contrib FastGelu."""
    if fast_gelu:
        if kind != "gelu_tanh":
            raise ValueError(f"FastGelu is the tanh GELU, not {kind}")
        fc = linear(g, x, w, f"{prefix}.c_fc", bias=False)  # (B, S, 4C)
        act = g.one("FastGelu", [fc, g.const(f"{prefix}.c_fc.bias", w[f"{prefix}.c_fc.bias"])],
                    name=f"{prefix}.gelu", domain=MS_DOMAIN)
    else:
        act = activation(g, linear(g, x, w, f"{prefix}.c_fc"), kind)
    return linear(g, act, w, f"{prefix}.c_proj")
