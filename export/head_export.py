"""gptedge export --task: a fine-tuned head checkpoint -> a classifier model dir, validated against the reference.

guard -> load (task_heads.py) -> the task and its special tokens -> graph (head_graph.py) -> manifest ->
validate (the graph's head logits against the PyTorch TaskModel, fp32 max |diff| <= 1e-4), atomically.

Special tokens. The GPT paper's start, delimiter and extract tokens are added to the vocabulary when the
model is fine-tuned; a checkpoint declares them the way transformers' tokenizers do, in
tokenizer_config.json or special_tokens_map.json: start = `bos_token`, delimiter = `sep_token`, extract =
`cls_token` (transformers' own DoubleHeads example adds its extract token as `cls_token`). A caller may
name them instead (`special_tokens={"extract": "<cls>"}`, or ids). A task whose templates use a token
the checkpoint does not declare is refused in one line, before any work.

The plain template: most GPT-2 classifiers fine-tuned with transformers declare no special token at all (the text
alone, the head on the last non-padding token, padding = config.json's pad_token_id, often end-of-text). A sequence
head whose checkpoint and caller name no extract token is exported with that template (tasks.plain_transformation),
so classify computes what transformers' GPT2ForSequenceClassification does on it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch

from gptedge import __version__
from gptedge.atomic import atomic_output_dir, check_output
from gptedge.onnx_files import WeightSink, save_onnx
from gptedge.runtime import contract as C
from gptedge.runtime.classify import load_classifier
from gptedge.runtime.errors import CheckpointError, InvalidArgumentError, ParityError
from gptedge.runtime.modeldir.manifest import (MODEL_FILE, GraphParity, Manifest, Parity, Source, write_json,
                                                write_manifest)
from gptedge.runtime.modeldir.tasks import (DECLARED_AS, EXTRACT, SPECIAL_ROLES, SpecialTokens, Task,
                                             plain_transformation, transformation)
from gptedge.runtime.modeldir.tokenizer import load_tokenizer
from gptedge.runtime.registry import TASKS

from .checkpoint import file_sha256, weights_file
from .exporter import check_opset
from .families import hf_config
from .head_graph import build_head_graph
from .hub import resolve_source
from .onnx_graph import DEFAULT_OPSET
from .task_heads import HEAD_CHOICE, TaskModel, load_task_checkpoint
from .tokenizer_files import write_tokenizer
from .validate import GRAPH_TOLERANCE, _max_diff

log = logging.getLogger(__name__)

TOKEN_FILES = ("tokenizer_config.json", "special_tokens_map.json")


def _declared(source: Path) -> dict[str, str]:
    """role -> token text, as tokenizer_config.json / special_tokens_map.json declare it."""
    found: dict[str, str] = {}
    for name in TOKEN_FILES:
        try:
            data = json.loads((source / name).read_text(encoding="utf-8")) if (source / name).is_file() else {}
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{source / name}: cannot read it ({type(e).__name__})") from None
        for role, key in DECLARED_AS.items():
            value = data.get(key) if isinstance(data, dict) else None
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str) and role not in found:
                found[role] = value
    return found


def special_tokens(roles: tuple[str, ...], source: Path, tokenizer, vocab_size: int,
                   given: dict[str, str | int] | None, task: str) -> SpecialTokens:
    """The ids of the roles a task's templates use: given by the caller, else declared by the checkpoint."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(SPECIAL_ROLES))
    if unknown:
        raise InvalidArgumentError(f"special token {unknown[0]!r} is not one of {', '.join(SPECIAL_ROLES)}")
    declared = {**_declared(source), **given}
    ids: dict[str, int] = {}
    for role in roles:
        token = declared.get(role)
        if token is None:
            raise CheckpointError(f"{source}: task {task} needs a {role} token and the checkpoint declares none "
                                  f"({DECLARED_AS[role]} in {' / '.join(TOKEN_FILES)}); name it with "
                                  f"--special-token {role}=TOKEN")
        tid = token if isinstance(token, int) else (tokenizer.token_to_id(token) if tokenizer is not None else None)
        if tid is None:
            raise CheckpointError(f"{source}: the {role} token {token!r} is not in the checkpoint's tokenizer")
        if not 0 <= tid < vocab_size:
            raise CheckpointError(f"{source}: the {role} token id {tid} is outside the model's vocabulary "
                                  f"(0..{vocab_size - 1})")
        ids[role] = tid
    for i, first in enumerate(ids):  # a delimiter equal to the extract token would split the text at the head
        for second in list(ids)[i + 1:]:
            if ids[first] == ids[second]:
                error = InvalidArgumentError if first in given or second in given else CheckpointError
                raise error(f"{source}: the {first} and {second} tokens are the same token (id {ids[first]}): task "
                            f"{task} needs a token of its own for each role")
    return SpecialTokens(**ids)


def _check_head(reference: TaskModel, name: str) -> None:
    """The task's line names the head it runs on; similarity's sum after the head needs a head without bias."""
    needs = TASKS.entry(name).head
    if needs != reference.kind.name:
        raise CheckpointError(f"task {name} needs a {needs} head; this checkpoint's is {reference.kind.name}")
    if TASKS.entry(name).combine == "sum" and reference.bias is not None:
        raise CheckpointError(f"task {name} adds the two orders' logits, which equals adding their states only for "
                              "a head without bias")


def plain(reference: TaskModel, source: Path, special: dict | None) -> bool:
    """Whether this export takes the plain template: a sequence head, and no extract token declared or given."""
    return (reference.kind.name != HEAD_CHOICE and EXTRACT not in (special or {})
            and EXTRACT not in _declared(source))


def _task(reference: TaskModel, config: dict, name: str, tokens: SpecialTokens, plain_template: bool = False) -> Task:
    labels = {}
    problem = config.get("problem_type")
    if reference.kind.name != HEAD_CHOICE and (problem in ("regression", "multi_label_classification")
                                               or reference.num_outputs == 1):
        # gptedge reads a sequence head's logits as one softmax over the labels; a regression score (num_labels 1,
        # transformers' default problem_type for it) or independent sigmoids would be reported as wrong labels
        what = problem or "regression (num_labels 1)"
        raise CheckpointError(f"this checkpoint's head is {what}; gptedge exports single-label classification "
                              "heads (a softmax over 2 or more labels)")
    if reference.kind.name != HEAD_CHOICE:
        given = config.get("id2label") if isinstance(config.get("id2label"), dict) else {}
        labels = {str(i): str(given.get(str(i), f"LABEL_{i}")) for i in range(reference.num_outputs)}
    pad = config.get("pad_token_id")
    declared = isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < reference.cfg.vocab_size
    template = plain_transformation(name, declared) if plain_template else transformation(name)
    return Task(name=name, head=reference.kind.name, transformation=template, special_tokens=tokens,
                id2label=labels, pad_id=pad if declared else 0)


def export_task(source: str | Path, out: str | Path, task: str | None = None,
                special: dict[str, str | int] | None = None, force: bool = False, opset: int = DEFAULT_OPSET,
                validate: bool = True, fused: bool = True, revision: str | None = None) -> Manifest:
    """A fine-tuned head checkpoint (local dir or Hub id) -> a classifier model dir; task: a TASKS member (default:
    classification for a sequence head, multiple-choice for a double-heads model)."""
    out = Path(out)
    check_opset(opset)
    if task is not None:
        TASKS.check(task)  # before the (slow) load
    check_output(out, force, inputs=[source])
    source, hub_info = resolve_source(source, revision)
    info = {"path": str(source.resolve()), "weights": weights_file(source).name,
            "sha256": file_sha256(weights_file(source)), **hub_info}
    reference, config = load_task_checkpoint(source)
    cfg = reference.cfg
    with atomic_output_dir(out, force, inputs=[source]) as tmp:
        has_tokenizer = write_tokenizer(source, tmp, cfg.vocab_size)
        tokenizer = load_tokenizer(tmp) if has_tokenizer else None
        name = task or reference.kind.default_task
        _check_head(reference, name)
        plain_template = plain(reference, source, special)
        if plain_template:
            log.info("%s declares no extract token: the plain template (the text alone, the head on the last "
                     "non-padding token), as transformers runs it", source)
        roles = () if plain_template else transformation(name).special_roles()
        spec = _task(reference, config, name, special_tokens(roles, source, tokenizer, cfg.vocab_size, special, name),
                     plain_template)
        fused_ops = _write_graph(reference, tmp / MODEL_FILE, opset, fused)
        hf = {**hf_config(cfg), "architectures": list(config.get("architectures") or []), "pad_token_id": spec.pad_id}
        if spec.id2label:
            hf.update(id2label=spec.id2label, label2id={v: int(k) for k, v in spec.id2label.items()})
        write_json(tmp / "config.json", hf)
        # the roles' tokens as transformers declares them: what another tool reads, and what verify holds the
        # manifest's special ids to (task_claims.py)
        declared = {DECLARED_AS[r]: tokenizer.id_to_token(getattr(spec.special_tokens, r))
                    for r in SPECIAL_ROLES if getattr(spec.special_tokens, r) is not None and tokenizer is not None}
        write_json(tmp / "tokenizer_config.json", {"model_max_length": cfg.n_positions, **declared})
        manifest = Manifest(shape=cfg.shape(), precision="fp32", eos_id=cfg.eos_token_id, bos_id=cfg.bos_token_id,
                            pad_id=spec.pad_id, inputs=(C.INPUT_IDS, C.ATTENTION_MASK),
                            outputs=(reference.kind.output,), task=spec,
                            source=Source(**info, opset=opset, gptedge_version=__version__, activation=cfg.activation,
                                          layer_norm_epsilon=cfg.layer_norm_epsilon, contrib_ops=fused_ops))
        manifest = write_manifest(tmp, manifest)
        if validate:
            parity = compare_head(reference, load_classifier(tmp, device="cpu"))
            manifest = write_manifest(tmp, manifest.replace(parity=Parity(graph_vs_reference=parity, device="cpu")))
    log.info("wrote %s (%s, %s head)", out, spec.name, spec.head)
    return manifest


def _write_graph(reference: TaskModel, path: Path, opset: int, fused: bool) -> tuple[str, ...]:
    """model.onnx (+ .data) -> the contrib ops it uses (as exporter.write_graph)."""
    weights = {k: v.detach().float().numpy() for k, v in reference.body.state_dict().items()}
    bias = None if reference.bias is None else reference.bias.detach().numpy()
    activation = "tanh" if isinstance(reference.activation, torch.nn.Tanh) else None
    with WeightSink.for_size(path, sum(w.nbytes for w in weights.values())) as sink:
        graph = build_head_graph(reference.cfg, weights, reference.kind, reference.weight.detach().numpy(), bias,
                                 activation, opset, fused=fused, sink=sink)
    save_onnx(graph, path)
    return tuple(sorted({n.op_type for n in graph.graph.node if n.domain == "com.microsoft"}))


def head_inputs(reference: TaskModel, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Seeded right-padded rows: (3, S) for a sequence head, (2, 3, S) for multiple choice; rows of several lengths."""
    rng = np.random.default_rng(seed)
    S = min(12, reference.cfg.n_positions)
    shape = (2, 3, S) if reference.kind.name == HEAD_CHOICE else (3, S)
    ids = rng.integers(0, reference.cfg.vocab_size, size=shape, dtype=np.int64)
    lengths = rng.integers(1, S + 1, size=shape[:-1])
    lengths.flat[0] = S  # one full row
    mask = (np.arange(S) < lengths[..., None]).astype(np.int64)
    return ids, mask


@torch.no_grad()
def compare_head(reference: TaskModel, loaded, tolerance: float = GRAPH_TOLERANCE) -> GraphParity:
    """The graph's head logits against the reference's on seeded rows -> the figures the manifest records."""
    ids, mask = head_inputs(reference)
    want = reference(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    got = loaded.logits(ids, mask)
    if want.shape != got.shape:
        raise ParityError(f"head: {reference.kind.output} has shape {list(got.shape)}, the reference "
                          f"{list(want.shape)}")
    diff, idx = _max_diff(want, got)
    agree = float((want.argmax(-1) == got.argmax(-1)).mean())
    figures = GraphParity(diff, reference.kind.output, "head", idx, top1_agreement=agree, tolerance=tolerance,
                          batch=ids.shape[0], prompt_tokens=ids.shape[-1], decode_steps=0)
    log.info("head vs reference: max |diff| %.2e, top-1 %.4f", diff, agree)
    if diff > tolerance:
        raise ParityError(f"head vs reference: max |diff| {diff:.3e} > {tolerance:.0e} in {reference.kind.output} "
                          f"at index {list(idx)}; top-1 agreement {agree:.2%}")
    return figures
