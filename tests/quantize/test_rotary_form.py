"""The rotary taken back out of GroupQueryAttention (quantize/rotary_form.py) computes what the rotary inside it
does: a kv_buffer graph export wrote with do_rotary (export/graph_rotary.py), rewritten, gives the same logits and
the same cache on a left-padded prefill and decode steps; the fp16 targets write that form."""

from __future__ import annotations

import shutil
from collections import Counter

import numpy as np
import onnx
import pytest

from gptedge import runtime
from gptedge.export.exporter import export_checkpoint
from gptedge.quantize.rotary_form import rotary_outside
from gptedge.runtime.generation.generation import positions
from gptedge.runtime.modeldir.manifest import read_manifest, write_manifest

from ..support.lineage_checkpoints import VOCAB, write_variant_checkpoint


def _ops(path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


@pytest.fixture(scope="module", params=["gqa2-linear", "neox-partial-wide"])
def inside_and_outside(request, tmp_path_factory):
    """(dir with the rotary inside, a copy rewritten with it outside), both loaded."""
    root = tmp_path_factory.mktemp("rotary_form")
    checkpoint = write_variant_checkpoint(root / "ckpt", request.param, tokenizer=False)
    inside = root / "inside"
    export_checkpoint(checkpoint, inside, graph_variant="kv_buffer", validate=False)
    outside = root / "outside"
    shutil.copytree(inside, outside)
    model = onnx.load(str(outside / "model.onnx"))
    head_dim = read_manifest(outside).shape.head_dim
    assert rotary_outside(model, head_dim) == 2  # one attention per layer
    onnx.save(model, str(outside / "model.onnx"))
    write_manifest(outside, read_manifest(outside))
    return inside, outside


def test_the_forms_differ_where_they_should(inside_and_outside):
    inside, outside = (_ops(d / "model.onnx") for d in inside_and_outside)
    assert inside["RotaryEmbedding"] == 0 and outside["RotaryEmbedding"] == 4 and outside["Split"] == 2
    assert outside["Min"] == 0  # query_seqlens' node went with its only reader, and the constant only it read
    graph = onnx.load(str(inside_and_outside[1] / "model.onnx"), load_external_data=False).graph
    read = {i for n in graph.node for i in n.input} | {v.name for v in graph.input}
    assert [i.name for i in graph.initializer if i.name not in read] == []
    gqa = [n for n in onnx.load(str(inside_and_outside[1] / "model.onnx")).graph.node
           if n.op_type == "GroupQueryAttention"]
    assert all(len(n.input) == 11 and n.input[7:10] == ["", "", ""] for n in gqa)
    assert not any(a.name == "do_rotary" for n in gqa for a in n.attribute)


def test_both_forms_compute_the_same(inside_and_outside):
    a, b = (runtime.load(d, device="cpu") for d in inside_and_outside)
    rng = np.random.default_rng(0)
    lengths, width = (7, 4, 1), 7
    ids = np.zeros((3, width), np.int64)
    mask = np.zeros_like(ids)
    for r, n in enumerate(lengths):  # left-padded: each row rotated at its own positions
        ids[r, width - n:] = rng.integers(3, VOCAB, n)
        mask[r, width - n:] = 1
    past_a, past_b = a.empty_past(3), b.empty_past(3)
    for _ in range(4):  # the prefill, then decode steps
        pos = positions(mask)[:, -ids.shape[1]:]
        got_a, past_a = a.forward(ids, mask, pos, past_a)
        got_b, past_b = b.forward(ids, mask, pos, past_b)
        valid = mask[:, -ids.shape[1]:].astype(bool)
        assert np.abs(got_a - got_b)[valid].max() <= 1e-5
        keys = mask.astype(bool)
        for x, y in zip(past_a, past_b, strict=True):
            assert np.abs(x - y)[:, :, :keys.shape[1]].transpose(0, 2, 1, 3)[keys].max() <= 1e-5
        ids = rng.integers(3, VOCAB, (3, 1))
        mask = np.concatenate([mask, np.ones((3, 1), np.int64)], axis=1)


def test_fp16_targets_write_the_rotary_outside(inside_and_outside, tmp_path):
    from gptedge.quantize.quantizer import quantize_model_dir
    from gptedge.runtime.modeldir.recipe import QuantizeRecipe

    inside = inside_and_outside[0]
    quantize_model_dir(inside, tmp_path / "wo4", QuantizeRecipe(method="weight-only", bits=4))
    quantize_model_dir(inside, tmp_path / "half", QuantizeRecipe(method="fp16"))
    assert _ops(tmp_path / "wo4" / "model.onnx")["RotaryEmbedding"] == 0  # CPU targets keep it inside
    assert _ops(tmp_path / "half" / "model.onnx")["RotaryEmbedding"] == 4


def test_a_batch_whose_short_row_decodes_past_the_long_prompts_room(inside_and_outside):
    """generate lets a left-padded batch's short rows run on after the longest has met the context: the mask then
    grows wider than the context (every position still inside it). GroupQueryAttention's own rotary wants its
    cos / sin tables at least as long as the mask is wide; each row must still be what it is alone."""
    a, b = (runtime.load(d, device="cpu") for d in inside_and_outside)
    ctx = a.manifest.shape.context_length
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, VOCAB, ctx - 4).tolist(), rng.integers(3, VOCAB, 2).tolist()]
    got = [g.ids for g in a.generate_batch(prompts, max_new_tokens=50, greedy=True, ignore_eos=True)]
    assert [len(g) for g in got] == [4, 50]
    assert got == [g.ids for g in b.generate_batch(prompts, max_new_tokens=50, greedy=True, ignore_eos=True)]
    assert got == [a.generate(p, max_new_tokens=50, greedy=True, ignore_eos=True).ids for p in prompts]


def test_an_onnx_runtime_without_query_seqlens_is_named_in_one_line(inside_and_outside, monkeypatch):
    """onnxruntime 1.31 refuses the inside form's 17-input GroupQueryAttention with a schema error pages long (its
    first words below, as it printed them); load says what to install instead."""
    import types

    from gptedge.runtime.errors import ModelDirError
    from gptedge.runtime.graphs import session

    real = session.import_onnxruntime()

    def refuse(*args, **kwargs):
        raise RuntimeError('[ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model failed:This is an invalid model. '
                           'In Node, ("h.0.attn.gqa", GroupQueryAttention, "com.microsoft", -1) : ...')

    old = types.SimpleNamespace(**{n: getattr(real, n) for n in dir(real) if not n.startswith("__")})
    old.InferenceSession, old.__version__ = refuse, "1.31.0"
    monkeypatch.setattr(session, "import_onnxruntime", lambda: old)
    monkeypatch.setattr(session, "gqa_takes_query_seqlens", lambda: False)
    with pytest.raises(ModelDirError, match=r"^the graph's GroupQueryAttention reads query_seqlens .* onnxruntime "
                                            r"1\.31\.0 has no such input: install onnxruntime >= 1\.32"):
        runtime.load(inside_and_outside[0], device="cpu")
    monkeypatch.setattr(session, "gqa_takes_query_seqlens", lambda: True)  # any other failure: load's usual line
    with pytest.raises(ModelDirError, match="ONNX Runtime cannot load it .*INVALID_GRAPH"):
        runtime.load(inside_and_outside[0], device="cpu")


def test_the_installed_onnx_runtime_names_query_seqlens():
    from gptedge.runtime.graphs.session import gqa_takes_query_seqlens

    import onnxruntime

    want = tuple(int(x) for x in onnxruntime.__version__.split(".")[:2]) >= (1, 32)
    assert gqa_takes_query_seqlens() is want
