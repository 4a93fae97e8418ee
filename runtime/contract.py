"""The ONNX I/O contract, declared once as data (docs/design.md#the-onnx-io-contract).

Export builds graphs with these names, validation checks every one, the runtime feeds them.
Names and dtypes match Optimum's GPT-2 export so each side loads the other's model dirs.
"""

from __future__ import annotations

from dataclasses import dataclass

INPUT_IDS = "input_ids"  # int64 [batch, seq]
ATTENTION_MASK = "attention_mask"  # int64 [batch, past + seq]
POSITION_IDS = "position_ids"  # int64 [batch, seq]
LOGITS = "logits"  # float [batch, logits_length, vocab]
# Optional int64 scalar, an overridable initializer defaulting to 0: logits for every position
# (what Optimum and perplexity need). Generation feeds 1: the LM head runs on the last position only.
LOGITS_TO_KEEP = "logits_to_keep"

# Graph variants a manifest may name.
GRAPH_STANDARD = "standard"  # Optimum's contract; serves prefill, decode and perplexity
GRAPH_KV_BUFFER = "kv_buffer"  # past/present are one preallocated buffer (B, nh, max_len, hs), updated in place

# com.microsoft GroupQueryAttention's optional inputs by index (its schema), as the kv_buffer graph feeds them:
# export writes them, quantize rewrites them (the rotary's form, the KV cache's scales)
GQA_COS_CACHE, GQA_SIN_CACHE, GQA_POSITION_IDS, GQA_ATTENTION_BIAS = 7, 8, 9, 10
GQA_K_SCALE, GQA_V_SCALE = 12, 13
GQA_QUERY_SEQLENS = 16  # ONNX Runtime >= 1.32 (runtime/graphs/session.py asks for it by name)


def past_key(layer: int) -> str:
    return f"past_key_values.{layer}.key"  # float [batch, heads, past, head_dim]


def past_value(layer: int) -> str:
    return f"past_key_values.{layer}.value"


def present_key(layer: int) -> str:
    return f"present.{layer}.key"  # float [batch, heads, past + seq, head_dim]


def present_value(layer: int) -> str:
    return f"present.{layer}.value"


@dataclass(frozen=True)
class IONames:
    """Every input and output name of a graph with ``n_layer`` layers, in graph order."""

    n_layer: int

    @property
    def past_names(self) -> list[str]:
        return [n for i in range(self.n_layer) for n in (past_key(i), past_value(i))]

    @property
    def present_names(self) -> list[str]:
        return [n for i in range(self.n_layer) for n in (present_key(i), present_value(i))]

    @property
    def inputs(self) -> list[str]:
        return [INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *self.past_names]

    @property
    def optional_inputs(self) -> list[str]:
        """Inputs with a default (overridable initializers); graphs from other exporters may lack them."""
        return [LOGITS_TO_KEEP]

    @property
    def outputs(self) -> list[str]:
        return [LOGITS, *self.present_names]


# Symbolic dimension names used for the dynamic axes of every graph.
DIM_BATCH = "batch_size"
DIM_SEQ = "sequence_length"
DIM_PAST = "past_sequence_length"
DIM_TOTAL = "total_sequence_length"  # past + seq
DIM_BUFFER = "max_sequence_length"  # kv_buffer graphs: the buffer's length
DIM_LOGITS = "logits_length"  # seq, or logits_to_keep when that is > 0
