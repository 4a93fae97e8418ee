"""The task-head reference's parts (export/task_heads.py) without transformers: which head a checkpoint carries, each
head tensor and config field refused in one line, and TaskModel's pooling and head maths on a tiny seeded body
(the state at each row's last attended token, the bias, tanh, the (B, N) reshape for multiple choice).
test_task_heads.py compares the whole model with transformers."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from gptedge.export.config import GPTConfig  # noqa: E402 - after the torch skip
from gptedge.export.reference import GPT  # noqa: E402 - after the torch skip
from gptedge.export.task_heads import HEAD_KINDS, TaskModel, _head_weights, head_kind  # noqa: E402 - after the skip
from gptedge.runtime.errors import CheckpointError  # noqa: E402 - after the torch skip
from gptedge.runtime.modeldir.tasks import HEAD_CHOICE, HEAD_SEQUENCE  # noqa: E402 - after the torch skip

CFG = GPTConfig(vocab_size=40, n_positions=16, n_embd=8, n_layer=1, n_head=2)
SEQ, CHOICE = HEAD_KINDS[HEAD_SEQUENCE], HEAD_KINDS[HEAD_CHOICE]


def test_the_head_kinds_as_transformers_names_them():
    assert (SEQ.prefix, SEQ.output, SEQ.default_task) == ("score.", "logits", "classification")
    assert (CHOICE.prefix, CHOICE.output, CHOICE.default_task) == ("multiple_choice_head.", "mc_logits",
                                                                   "multiple-choice")
    assert "GPT2ForSequenceClassification" in SEQ.architectures and "GPT2DoubleHeadsModel" in CHOICE.architectures


def test_the_head_is_the_architectures_else_the_tensors():
    assert head_kind({"architectures": ["GPT2ForSequenceClassification"]}, {}, "ck") is SEQ
    assert head_kind({"architectures": ["OpenAIGPTDoubleHeadsModel"]}, {"score.weight": 0}, "ck") is CHOICE
    assert head_kind({"architectures": ["GPT2LMHeadModel"]}, {"multiple_choice_head.summary.weight": 0}, "ck") is CHOICE
    assert head_kind({}, {"score.weight": 0}, "ck") is SEQ
    assert head_kind({"architectures": None}, {"score.weight": 0}, "ck") is SEQ


def test_no_head_is_one_line_naming_what_gptedge_exports():
    with pytest.raises(CheckpointError) as caught:
        head_kind({"architectures": ["GPT2LMHeadModel"]}, {"lm_head.weight": 0}, "ck")
    assert str(caught.value) == (
        "ck: no task head (architectures ['GPT2LMHeadModel'], no score / multiple_choice_head tensors); heads gptedge "
        "exports: GPT2ForSequenceClassification, OpenAIGPTForSequenceClassification, GPT2DoubleHeadsModel, "
        "OpenAIGPTDoubleHeadsModel")
    with pytest.raises(CheckpointError, match=r"^ck: no task head \(architectures not given, "):
        head_kind({}, {}, "ck")


def test_a_sequence_head_is_its_score_weight():
    w = torch.randn(3, 8, dtype=torch.float16)
    weight, bias, activation = _head_weights(SEQ, {"score.weight": w}, CFG, {}, "m.safetensors")
    assert weight.dtype == torch.float32 and weight.shape == (3, 8) and bias is None and activation is None
    assert torch.equal(weight, w.float()) and weight.is_contiguous()
    one = _head_weights(SEQ, {"score.weight": torch.randn(1, 8)}, CFG, {}, "m")[0]
    assert one.shape == (1, 8)


@pytest.mark.parametrize("tensors, line", [
    ({}, "m: missing tensor 'score.weight'"),
    ({"score.weight": torch.zeros(3, 8), "score.bias": torch.zeros(3)}, "m: unexpected tensor 'score.bias'"),
    ({"score.weight": torch.zeros(3, 7)}, "m: tensor 'score.weight' has shape [3, 7], expected [num_labels, 8]"),
    ({"score.weight": torch.zeros(0, 8)}, "m: tensor 'score.weight' has shape [0, 8], expected [num_labels, 8]"),
    ({"score.weight": torch.zeros(8)}, "m: tensor 'score.weight' has shape [8], expected [num_labels, 8]"),
    ({"score.weight": torch.zeros(1, 3, 8)}, "m: tensor 'score.weight' has shape [1, 3, 8], expected [num_labels, 8]"),
])
def test_sequence_head_tensors_that_do_not_fit(tensors, line):
    with pytest.raises(CheckpointError) as caught:
        _head_weights(SEQ, tensors, CFG, {}, "m")
    assert str(caught.value) == line


MC = "multiple_choice_head.summary."


def test_a_choice_head_is_its_summary_and_activation():
    tensors = {MC + "weight": torch.randn(1, 8), MC + "bias": torch.randn(1)}
    weight, bias, activation = _head_weights(CHOICE, tensors, CFG, {"summary_activation": "tanh"}, "m")
    assert weight.shape == (1, 8) and bias.shape == (1,) and activation == "tanh"
    config = {"summary_type": "cls_index", "summary_use_proj": True, "summary_proj_to_labels": True}
    assert _head_weights(CHOICE, tensors, CFG, config, "m")[2] is None


@pytest.mark.parametrize("config, line", [
    ({"summary_type": "last"}, "m: config.json summary_type='last' is not supported (only 'cls_index')"),
    ({"summary_use_proj": False}, "m: config.json summary_use_proj=False is not supported (only True)"),
    ({"summary_proj_to_labels": False}, "m: config.json summary_proj_to_labels=False is not supported (only True)"),
    ({"summary_activation": "relu"}, "m: config.json summary_activation 'relu' is not supported (none or 'tanh')"),
])
def test_choice_head_configs_gptedge_cannot_run(config, line):
    tensors = {MC + "weight": torch.randn(1, 8), MC + "bias": torch.randn(1)}
    with pytest.raises(CheckpointError) as caught:
        _head_weights(CHOICE, tensors, CFG, config, "m")
    assert str(caught.value) == line


@pytest.mark.parametrize("tensors, line", [
    ({MC + "weight": torch.zeros(1, 8)}, f"m: missing tensor '{MC}bias'"),
    ({MC + "weight": torch.zeros(2, 8), MC + "bias": torch.zeros(1)},
     f"m: tensor '{MC}weight' has shape [2, 8], expected [1, 8]"),
    ({MC + "weight": torch.zeros(1, 8), MC + "bias": torch.zeros(2)},
     f"m: tensor '{MC}bias' has shape [2], expected [1]"),
    ({MC + "weight": torch.zeros(1, 8), MC + "bias": torch.zeros(())},
     f"m: tensor '{MC}bias' has shape [], expected [1]"),
])
def test_choice_head_tensors_that_do_not_fit(tensors, line):
    with pytest.raises(CheckpointError) as caught:
        _head_weights(CHOICE, tensors, CFG, {}, "m")
    assert str(caught.value) == line


@pytest.fixture(scope="module")
def body() -> GPT:
    return GPT(CFG).init_weights(0).eval()


def rows(*lengths: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    width = max(lengths)
    ids = torch.randint(0, 40, (len(lengths), width), generator=g)
    mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    return ids * mask, mask


def test_the_state_read_is_the_last_attended_tokens(body):
    w = torch.randn(3, 8, generator=torch.Generator().manual_seed(2))
    model = TaskModel(body, SEQ, w, None)
    ids, mask = rows(5, 2, 1)
    got = model(ids, mask)
    assert got.shape == (3, 3) and model.num_outputs == 3 and model.cfg is CFG
    for r, n in enumerate((5, 2, 1)):  # each row alone, unpadded: its last token's state through the head
        h, _ = body.states(ids[r:r + 1, :n], mask[r:r + 1, :n], torch.arange(n)[None])
        torch.testing.assert_close(got[r], h[0, -1] @ w.T)


def test_bias_tanh_and_the_choice_reshape(body):
    w, b = torch.randn(1, 8, generator=torch.Generator().manual_seed(3)), torch.tensor([0.25])
    plain = TaskModel(body, CHOICE, w, b)
    tanh = TaskModel(body, CHOICE, w, b, "tanh")
    ids, mask = rows(4, 3, 2, 4, 1, 2)
    ids, mask = ids.reshape(2, 3, -1), mask.reshape(2, 3, -1)  # (B=2, N=3, S)
    got = plain(ids, mask)
    assert got.shape == (2, 3)
    flat = TaskModel(body, SEQ, w, None)(ids.reshape(6, -1), mask.reshape(6, -1))[:, 0]  # (6,) without the bias
    torch.testing.assert_close(got.reshape(-1), flat + 0.25)
    torch.testing.assert_close(tanh(ids, mask), torch.tanh(got))
    assert not plain.weight.requires_grad and not plain.bias.requires_grad


@pytest.mark.parametrize("head, kind, outputs", [("gpt2-seq", HEAD_SEQUENCE, 3), ("gpt2-mc", HEAD_CHOICE, 1)])
def test_a_checkpoint_loads_as_its_head_with_its_config(tmp_path, head, kind, outputs):
    import json

    from gptedge.export.task_heads import load_task_checkpoint

    from ..support.task_checkpoints import make_checkpoint

    ck = make_checkpoint(head, tmp_path / head)
    model, config = load_task_checkpoint(ck)
    assert config == json.loads((ck / "config.json").read_text(encoding="utf-8"))
    assert model.kind.name == kind and model.num_outputs == outputs and not model.training
    assert (model.bias is None) == (kind == HEAD_SEQUENCE)
    ids = torch.tensor([[5, 6, 7], [8, 9, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = model(ids, mask) if kind == HEAD_SEQUENCE else model(ids[None], mask[None])
    assert out.shape == ((2, 3) if kind == HEAD_SEQUENCE else (1, 2)) and torch.isfinite(out).all()
