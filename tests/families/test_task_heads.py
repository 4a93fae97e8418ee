"""The original GPT's task heads: export from transformers' own fine-tuned classes, parity with them,
the input transformations (entailment, similarity's two orders, multiple choice), the manifest, the loaders.

Oracles are transformers' models run on token rows built here from the checkpoint's own tokenizer.json, never
gptedge's reference or its row builder."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gptedge.runtime import load, load_classifier
from gptedge.runtime.errors import CheckpointError, ModelDirError
from gptedge.runtime.modeldir.tasks import article

from ..support.task_checkpoints import EXPORTS, HEADS, LABELS, hf_model, make_checkpoint

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.interop

START, DELIM, EXTRACT = 50257, 50258, 50259


@pytest.fixture(scope="module")
def checkpoints(task_checkpoints) -> dict:
    return task_checkpoints


@pytest.fixture(scope="module")
def dirs(task_dirs) -> dict:
    return task_dirs


def tokenize(checkpoint, text: str) -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def padded_rows(rows: list[list[int]], pad: int = 0) -> tuple[np.ndarray, np.ndarray]:
    width = max(map(len, rows))
    ids = np.array([r + [pad] * (width - len(r)) for r in rows], dtype=np.int64)
    mask = np.array([[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=np.int64)
    return ids, mask


def hf_sequence_logits(model, rows: list[list[int]]) -> np.ndarray:
    """transformers' sequence classifier on right-padded rows (pooled at the last non-pad token, its pad id)."""
    ids, mask = padded_rows(rows, model.config.pad_token_id)
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()


def hf_choice_logits(model, choices: list[list[int]]) -> np.ndarray:
    """transformers' double-heads model on one example (1, N, S), mc_token_ids at each choice's last token. No
    attention mask: with right padding no real token attends to the padding (OpenAIGPT's model cannot take a 3-D
    mask anyway)."""
    ids, mask = padded_rows(choices)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids[None]), mc_token_ids=torch.from_numpy(mask.sum(1)[None] - 1))
    return out.mc_logits.numpy()[0]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_the_article_of_a_task_name_is_the_one_the_server_and_load_say():
    """One rule for 'a' / 'an' (load's refusal, web_ready's, the server's wrong-endpoint 400): by the first letter."""
    assert [article(w) for w in ("entailment", "similarity", "Entailment", "multiple-choice", "")] == [
        "an", "a", "an", "a", "a"]


@pytest.mark.parametrize("head", list(HEADS))
def test_the_reference_head_is_transformers(checkpoints, head):
    """Rung 1 for heads: gptedge's PyTorch TaskModel against transformers' class on right-padded rows."""
    from gptedge.export.task_heads import load_task_checkpoint

    reference, _ = load_task_checkpoint(checkpoints[head])
    model = hf_model(checkpoints[head])
    rng = np.random.default_rng(1)
    rows = [rng.integers(0, 50257, size=n).tolist() for n in (9, 4, 1)]
    ids, mask = padded_rows(rows, model.config.pad_token_id or 0)
    with torch.no_grad():
        if head.endswith("-seq"):
            want = hf_sequence_logits(model, rows)
            got = reference(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
        else:
            want = hf_choice_logits(model, rows)[None]
            got = reference(torch.from_numpy(ids[None]), torch.from_numpy(mask[None])).numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-5


@pytest.mark.parametrize("name", list(EXPORTS))
def test_export_records_parity_and_the_graph_matches_transformers(checkpoints, dirs, name):
    """Rung 3 for heads: the manifest's figure (graph vs reference), then the graph against transformers directly;
    the graph outputs the head's logits only: no KV cache, no vocabulary-wide logits."""
    import onnx

    ck = checkpoints["gpt2-seq" if name == "gpt2-sim" else name]
    clf = load_classifier(dirs[name], device="cpu")
    parity = clf.manifest.parity.graph_vs_reference
    assert parity.max_abs_diff <= 1e-4 and parity.tolerance == 1e-4 and parity.top1_agreement == 1.0
    choice = name.endswith("-mc")
    assert parity.output == ("mc_logits" if choice else "logits")
    graph = onnx.load(str(dirs[name] / "model.onnx"))
    assert [i.name for i in graph.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in graph.graph.output] == [parity.output]
    assert not [n for n in graph.graph.node if n.op_type == "Gemm"]  # no LM head
    model = hf_model(ck)
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, 50260, size=n).tolist() for n in (7, 12, 3)]
    ids, mask = padded_rows(rows, 5)  # any pad id: the mask says where the rows end
    if choice:
        got, want = clf.logits(ids[None], mask[None])[0], hf_choice_logits(model, rows)
    else:
        got, want = clf.logits(ids, mask), hf_sequence_logits(model, rows)
        assert got.shape == (3, 3)
    assert np.abs(got - want).max() <= 1e-4


def test_entailment_is_start_premise_delimiter_hypothesis_extract(checkpoints, dirs):
    ck = checkpoints["gpt2-seq"]
    clf = load_classifier(dirs["gpt2-seq"], device="cpu")
    pairs = [("A man is sleeping.", "Nobody is awake."), ("It rains.", "The street is wet and grey today."),
             ("Emma was handsome, clever, and rich.", "Emma had a comfortable home.")]
    rows = [[START, *tokenize(ck, p), DELIM, *tokenize(ck, h), EXTRACT] for p, h in pairs]
    want = hf_sequence_logits(hf_model(ck), rows)  # (3, 3)
    results = clf.classify_batch(pairs)  # one right-padded batch
    for result, w in zip(results, want, strict=True):
        assert result.labels == tuple(LABELS.values())
        np.testing.assert_allclose(result.logits, w, atol=1e-4)
        np.testing.assert_allclose(result.probabilities, softmax(w.astype(np.float64)), atol=1e-5)
        assert result.label == LABELS[int(w.argmax())]
    one = clf.classify({"premise": pairs[1][0], "hypothesis": pairs[1][1]})  # alone, and as a mapping
    np.testing.assert_allclose(one.logits, results[1].logits, atol=1e-5)


def test_similarity_adds_both_orders_states_before_the_head(checkpoints, dirs):
    """The paper's similarity: h(start a delim b extract) + h(start b delim a extract), then the head; computed
    here from transformers' hidden states and the checkpoint's score weight."""
    ck = checkpoints["gpt2-seq"]
    model = hf_model(ck)
    a, b = "The cat sat on the mat.", "A dog lay on the rug"
    ta, tb = tokenize(ck, a), tokenize(ck, b)
    states = []
    for row in ([START, *ta, DELIM, *tb, EXTRACT], [START, *tb, DELIM, *ta, EXTRACT]):
        with torch.no_grad():
            states.append(model.transformer(torch.tensor([row])).last_hidden_state[0, -1])
    want = ((states[0] + states[1]) @ model.score.weight.T).detach().numpy()  # (3,)
    clf = load_classifier(dirs["gpt2-sim"], device="cpu")
    got = clf.classify((a, b))
    np.testing.assert_allclose(got.logits, want, atol=1e-4)
    np.testing.assert_allclose(clf.classify((b, a)).logits, want, atol=1e-4)  # symmetric by construction
    one_order = hf_sequence_logits(model, [[START, *ta, DELIM, *tb, EXTRACT]])[0]
    assert np.abs(np.array(got.logits) - one_order).max() > 1e-3  # not just one order


@pytest.mark.parametrize("name", ["gpt2-mc", "openai-mc"])
def test_multiple_choice_is_one_row_per_answer_and_a_softmax_across_them(checkpoints, dirs, name):
    ck = checkpoints[name]
    clf = load_classifier(dirs[name], device="cpu")
    context, answers = "The sky on a clear day is", ["blue", "green as grass", "a carrot", "dark"]
    rows = [[START, *tokenize(ck, context), DELIM, *tokenize(ck, c), EXTRACT] for c in answers]
    want = hf_choice_logits(hf_model(ck), rows)  # (4,)
    got = clf.classify({"context": context, "choices": answers})
    assert got.labels == tuple(answers)
    np.testing.assert_allclose(got.logits, want, atol=1e-4)
    np.testing.assert_allclose(got.probabilities, softmax(want.astype(np.float64)), atol=1e-5)
    assert got.label == answers[int(want.argmax())]
    # examples with 4 and 2 answers in one call: each as it is alone
    two = clf.classify_batch([(context, answers), (context, answers[:2])])
    np.testing.assert_allclose(two[0].logits, got.logits, atol=1e-5)
    np.testing.assert_allclose(two[1].logits, want[:2], atol=1e-4)


def test_the_manifest_records_the_task_as_data_and_an_lm_manifest_is_unchanged(dirs, gpt2_model_dir):
    m = json.loads((dirs["gpt2-sim"] / "gptedge.json").read_text())
    task = m["task"]
    assert task["name"] == "similarity" and task["head"] == "sequence-classification"
    assert task["id2label"] == {str(k): v for k, v in LABELS.items()}
    assert task["special_tokens"] == {"start": START, "delimiter": DELIM, "extract": EXTRACT}
    assert task["transformation"] == {"fields": ["a", "b"], "combine": "sum", "sequences": [
        ["start", "a", "delimiter", "b", "extract"], ["start", "b", "delimiter", "a", "extract"]]}
    assert task["pad_id"] == 50256  # the checkpoint's pad_token_id
    assert m["inputs"] == ["input_ids", "attention_mask"] and m["outputs"] == ["logits"]
    mc = json.loads((dirs["gpt2-mc"] / "gptedge.json").read_text())["task"]
    assert mc["transformation"]["combine"] == "choices" and mc["id2label"] == {}
    lm = json.loads((gpt2_model_dir / "gptedge.json").read_text())
    assert "task" not in lm  # a language model's manifest is what an older gptedge wrote and reads
    assert load(gpt2_model_dir, device="cpu").manifest.task is None


def test_each_loader_refuses_the_other_kind_in_one_line(dirs, gpt2_model_dir):
    with pytest.raises(ModelDirError, match="similarity classifier .* not a language model"):
        load(dirs["gpt2-sim"], device="cpu")
    with pytest.raises(ModelDirError, match="is a language model, not a classifier"):
        load_classifier(gpt2_model_dir, device="cpu")


def test_a_checkpoint_without_the_special_tokens_is_refused_in_one_line_unless_they_are_named(tmp_path):
    """A checkpoint that declares its extract token but not the others. (One that declares no extract token at all
    takes the plain template: test_plain_template.py.)"""
    import json

    from gptedge.export.head_export import export_task

    ck = make_checkpoint("gpt2-seq", tmp_path / "ck", declare=False)
    (ck / "tokenizer_config.json").write_text(json.dumps({"cls_token": "<extract>"}))
    with pytest.raises(CheckpointError, match=r"needs a start token and the checkpoint declares none \(bos_token"):
        export_task(ck, tmp_path / "out", task="entailment")
    assert not (tmp_path / "out").exists()
    m = export_task(ck, tmp_path / "out", task="entailment",
                    special={"start": "<start>", "delimiter": "<delim>", "extract": EXTRACT})
    assert (m.task.special_tokens.start, m.task.special_tokens.delimiter, m.task.special_tokens.extract) == (
        START, DELIM, EXTRACT)
    with pytest.raises(CheckpointError, match="'<nope>' is not in the checkpoint's tokenizer"):
        export_task(ck, tmp_path / "out2", task="entailment", special={"start": "<nope>", "delimiter": 1, "extract": 2})


def test_the_task_must_fit_the_checkpoints_head(checkpoints, tmp_path):
    from gptedge.export.head_export import export_task

    with pytest.raises(CheckpointError, match="task entailment needs a sequence-classification head; this "
                                              "checkpoint's is multiple-choice"):
        export_task(checkpoints["gpt2-mc"], tmp_path / "out", task="entailment")
    with pytest.raises(CheckpointError, match="task multiple-choice needs a multiple-choice head"):
        export_task(checkpoints["gpt2-seq"], tmp_path / "out", task="multiple-choice")


@pytest.mark.parametrize("name", ["gpt2-mc", "openai-mc"])
def test_a_double_heads_checkpoint_still_exports_its_lm_head(checkpoints, tmp_path, name):
    """The LM head of *DoubleHeadsModel is the tied embedding: a plain export of the same checkpoint keeps it."""
    from gptedge.export.exporter import export_checkpoint

    export_checkpoint(checkpoints[name], tmp_path / "lm")
    lm = load(tmp_path / "lm", device="cpu")
    ids = np.random.default_rng(3).integers(0, 50257, size=(1, 10), dtype=np.int64)
    got = lm.forward(ids, np.ones_like(ids), np.arange(10)[None], lm.empty_past(1))[0]
    with torch.no_grad():
        want = hf_model(checkpoints[name])(input_ids=torch.from_numpy(ids)).logits.numpy()
    assert np.abs(got - want).max() <= 1e-4
