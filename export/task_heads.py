"""The task heads of transformers' fine-tuned GPTs, and the PyTorch reference that runs them (the parity oracle).

Two heads, each read from the checkpoint's own tensors:

- sequence classification (GPT2ForSequenceClassification, OpenAIGPTForSequenceClassification):
  `score.weight` (L, C), a linear map without bias, on the state of the row's last non-pad token;
- multiple choice (GPT2DoubleHeadsModel, OpenAIGPTDoubleHeadsModel): `multiple_choice_head.summary`
  (1, C) + bias (1,), then the config's summary_activation (none or tanh), on the state at
  `mc_token_ids`; one logit a choice. These models also hold the LM head: it is the tied token
  embedding, which a plain `gptedge export` of the same checkpoint keeps (checkpoint.py leaves the
  multiple-choice head out of it), so the LM and the head are two dirs from one checkpoint.

Both read the state at the row's last attended position: gptedge's rows are right-padded and end with
the extract token, which is where transformers' pooling (last non-pad token / mc_token_ids) points too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from gptedge.runtime.errors import CheckpointError
from gptedge.runtime.modeldir.tasks import HEAD_CHOICE, HEAD_SEQUENCE

from .checkpoint import load_state, read_config, read_tensors, split_head_tensors, weights_file
from .config import GPTConfig
from .families import family
from .reference import GPT

SUMMARY_ACTIVATIONS = {None: nn.Identity, "tanh": nn.Tanh}  # HF summary_activation -> module (the graph: Tanh op)


@dataclass(frozen=True)
class HeadKind:
    name: str  # HEAD_SEQUENCE / HEAD_CHOICE (runtime/modeldir/tasks.py)
    architectures: tuple[str, ...]  # config.json "architectures" that carry it
    prefix: str  # its tensors' HF prefix
    output: str  # the graph output: transformers' name for these logits
    default_task: str  # the TASKS member export picks when none is asked for


HEAD_KINDS = {k.name: k for k in (
    HeadKind(HEAD_SEQUENCE, ("GPT2ForSequenceClassification", "OpenAIGPTForSequenceClassification"), "score.",
             "logits", "classification"),
    HeadKind(HEAD_CHOICE, ("GPT2DoubleHeadsModel", "OpenAIGPTDoubleHeadsModel"), "multiple_choice_head.",
             "mc_logits", "multiple-choice"),
)}


def head_kind(config: dict, head_tensors: dict[str, torch.Tensor], origin: str) -> HeadKind:
    """The head config.json's architectures name, or failing that the one whose tensors the checkpoint holds."""
    archs = config.get("architectures") or []
    by_arch = [k for k in HEAD_KINDS.values() if set(archs) & set(k.architectures)]
    by_tensor = [k for k in HEAD_KINDS.values() if any(n.startswith(k.prefix) for n in head_tensors)]
    found = by_arch or by_tensor
    if not found:
        names = ", ".join(a for k in HEAD_KINDS.values() for a in k.architectures)
        raise CheckpointError(f"{origin}: no task head (architectures {archs or 'not given'}, no score / "
                              f"multiple_choice_head tensors); heads gptedge exports: {names}")
    return found[0]


class TaskModel(nn.Module):
    """The reference GPT's body + a task head. forward(ids, mask) -> logits:
    sequence head: ids, mask (B, S) -> (B, L); multiple choice: ids, mask (B, N, S) -> (B, N)."""

    def __init__(self, body: GPT, kind: HeadKind, weight: torch.Tensor, bias: torch.Tensor | None,
                 activation: str | None = None):
        super().__init__()
        self.body, self.kind = body, kind
        self.weight = nn.Parameter(weight, requires_grad=False)  # (L, C) or (1, C), nn.Linear's layout
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)  # (1,)
        self.activation = SUMMARY_ACTIVATIONS[activation]()

    @property
    def cfg(self) -> GPTConfig:
        return self.body.cfg

    @property
    def num_outputs(self) -> int:
        return self.weight.shape[0]

    def extract_states(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """ids, mask (R, S) right-padded -> the state at each row's last attended position (R, C)."""
        pos = (mask.cumsum(1) - 1).clamp(min=0)  # (R, S), 0.. on the real tokens
        h, _ = self.body.states(ids, mask, pos)  # (R, S, C)
        last = (torch.arange(ids.shape[1]) * mask).argmax(-1)  # (R,) as transformers' last non-pad token
        return h[torch.arange(ids.shape[0]), last]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        S = input_ids.shape[-1]
        x = self.extract_states(input_ids.reshape(-1, S), attention_mask.reshape(-1, S))  # (R, C)
        y = x @ self.weight.T  # (R, L)
        if self.bias is not None:
            y = y + self.bias
        y = self.activation(y)
        return y if self.kind.name == HEAD_SEQUENCE else y.reshape(input_ids.shape[:-1])  # (B, L) / (B, N)


def _head_weights(kind: HeadKind, tensors: dict[str, torch.Tensor], cfg: GPTConfig, config: dict,
                  origin: str) -> tuple[torch.Tensor, torch.Tensor | None, str | None]:
    """-> (weight (L, C), bias or None, activation), every tensor and config field checked."""
    if kind.name == HEAD_SEQUENCE:
        names, activation = {"weight": "score.weight"}, None
    else:
        for key, ok in (("summary_type", "cls_index"), ("summary_use_proj", True), ("summary_proj_to_labels", True)):
            if config.get(key, ok) != ok:
                raise CheckpointError(f"{origin}: config.json {key}={config[key]!r} is not supported (only {ok!r})")
        activation = config.get("summary_activation")
        if activation not in SUMMARY_ACTIVATIONS:
            raise CheckpointError(f"{origin}: config.json summary_activation {activation!r} is not supported "
                                  "(none or 'tanh')")
        names = {"weight": "multiple_choice_head.summary.weight", "bias": "multiple_choice_head.summary.bias"}
    unexpected = sorted(set(tensors) - set(names.values()))
    if unexpected:
        raise CheckpointError(f"{origin}: unexpected tensor {unexpected[0]!r}")
    missing = [n for n in names.values() if n not in tensors]
    if missing:
        raise CheckpointError(f"{origin}: missing tensor {missing[0]!r}")
    weight = tensors[names["weight"]].to(torch.float32)
    rows = 1 if kind.name == HEAD_CHOICE else weight.shape[0]
    if weight.dim() != 2 or weight.shape != (rows, cfg.n_embd) or rows < 1:
        raise CheckpointError(f"{origin}: tensor {names['weight']!r} has shape {list(weight.shape)}, expected "
                              f"[{'1' if kind.name == HEAD_CHOICE else 'num_labels'}, {cfg.n_embd}]")
    bias = tensors[names["bias"]].to(torch.float32) if "bias" in names else None
    if bias is not None and tuple(bias.shape) != (1,):
        raise CheckpointError(f"{origin}: tensor {names['bias']!r} has shape {list(bias.shape)}, expected [1]")
    return weight.contiguous(), bias, activation


def load_task_checkpoint(source: str | Path) -> tuple[TaskModel, dict]:
    """A local HF checkpoint dir of a fine-tuned head -> (the reference TaskModel in eval mode, its config.json)."""
    source = Path(source)
    cfg = read_config(source)
    if family(cfg.arch).positions != "learned":  # head_graph.py writes GPT-2's embedding, positions and LayerNorm
        raise CheckpointError(f"{source}: a task head on a {cfg.arch} checkpoint is not supported (task heads export "
                              "for learned-position families: gpt2, openai-gpt); export its language model instead")
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    path = weights_file(source)
    tensors = read_tensors(path)
    head = split_head_tensors(tensors)
    kind = head_kind(config, head, str(source))
    weight, bias, activation = _head_weights(kind, head, cfg, config, path.name)
    state = load_state(cfg, tensors, path.name)
    with torch.device("meta"):
        body = GPT(cfg)
    body.load_state_dict(state, assign=True)
    return TaskModel(body, kind, weight, bias, activation).eval(), config
