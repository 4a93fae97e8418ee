"""quantize --kv-cache: a kv_buffer graph's cache stored as fp16 / int8 / int4.

One tiny seeded GPT-2 (kv_buffer, fp32) and the same graph with each cache (fp32 weights, no --method): the
weights are the same in all four, so every difference is the cache's. (With weight-only weights, whose
kernel quantizes activations per block, a cache's tiny change can flip an activation's rounding: that is
the weights' noise, measured in benchmarks/results/kv-cache-2026-11-25.md, not the cache's.)
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.runtime import load
from gptedge.runtime.errors import ModelDirError, QuantizationError
from gptedge.runtime.graphs.sequence_pool import pool_for
from gptedge.runtime.modeldir.manifest import MANIFEST_NAME, Manifest, ModelShape

from ..support.checkpoints import EXCERPT, ROOT, tiny_config, write_checkpoint
from ..support.engine import pool_greedy

pytestmark = pytest.mark.slow  # every cache type exported, quantized and generated over the whole context

CACHES = ("fp32", "fp16", "int8", "int4")
CALIBRATION = ROOT / "samples" / "calibration" / "emma_ch1-4.txt"  # not the evaluation excerpt
ELEMENT = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8, "int4": np.uint8}


@pytest.fixture(scope="module")
def cache_dirs(tmp_path_factory) -> dict[str, Path]:
    """Weights drawn with std 0.3 (as test_genai's), so greedy continuations vary instead of repeating one
    token, which would hide a wrong cache position."""
    from gptedge.export.exporter import export_checkpoint
    from gptedge.export.reference import GPT
    from gptedge.quantize.quantizer import quantize_model_dir

    root = tmp_path_factory.mktemp("kv-cache")
    ck = write_checkpoint(GPT(tiny_config()).init_weights(3, std=0.3).eval(), root / "ck")
    text = CALIBRATION.read_text(encoding="utf-8")[:20000]
    dirs = {"fp32": root / "fp32"}
    export_checkpoint(ck, dirs["fp32"], graph_variant="kv_buffer")
    for cache in CACHES[1:]:
        dirs[cache] = root / cache
        quantize_model_dir(dirs["fp32"], dirs[cache], None, calibration_text=text, kv_cache=cache)
    return dirs


@pytest.fixture(scope="module")
def loaded(cache_dirs):
    return {cache: load(d, device="cpu") for cache, d in cache_dirs.items()}


def _teacher_forced(model, ids: np.ndarray) -> np.ndarray:
    """Logits (L - 8, V) of each position after the first 8, fed one token at a time through the cache."""
    state = model.variant.start(1, len(ids))
    out = [state.run(ids[None, :8], np.ones((1, 8), np.int64), np.arange(8)[None]).copy()]
    for t in range(8, len(ids) - 1):
        out.append(state.run(ids[None, t:t + 1], np.ones((1, t + 1), np.int64), np.array([[t]])).copy())
    return np.concatenate(out)


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean KL(p || q) over rows, from logits (numpy only: the oracle does not call gptedge's)."""
    lp = p_logits - p_logits.max(-1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    lq = q_logits - q_logits.max(-1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
    return float((np.exp(lp) * (lp - lq)).sum(-1).mean())


def test_greedy_ids_of_an_fp16_cache_equal_fp32s_over_the_whole_context(loaded):
    prompts = [[464, 3290, 373, 257], [40, 1101, 257, 1263, 290, 2415, 13, 383]]
    context = loaded["fp32"].manifest.shape.context_length  # 128: the cache fills to its last position
    want = [r.ids for r in loaded["fp32"].generate_batch(prompts, context - 8, greedy=True, ignore_eos=True,
                                                          with_text=False)]
    assert sum(map(len, want)) == 2 * (context - 8) and min(len(set(w)) for w in want) > 10  # no one-token loop
    got = [r.ids for r in loaded["fp16"].generate_batch(prompts, context - 8, greedy=True, ignore_eos=True,
                                                        with_text=False)]
    assert got == want
    # int8 rounds each key and value to 1/127 of its channel's range: on this random model, whose logits are
    # nearly tied (std 0.3 weights, 50,257 tokens), that flips a greedy choice within ~30 tokens (measured 27
    # and 26), after which the continuations part; its per-position closeness is bounded below
    got = [r.ids for r in loaded["int8"].generate_batch(prompts, 16, greedy=True, ignore_eos=True, with_text=False)]
    assert got == [w[:16] for w in want]


def test_quantized_caches_stay_close_to_fp32s_at_every_position(loaded):
    """Teacher forced through the cache over the whole context of real text: mean KL(fp32 || cache) and top-1
    agreement per position. Measured on this model: fp16 3.7e-7 / 100 %, int8 3.4e-4 / 97.5 %, int4 0.060 /
    65 % (15 levels a channel on a random model's flat distributions; the trained sample model: int8 2.2e-5 /
    99.6 %, int4 0.0040 / 94.9 %, benchmarks/results/kv-cache-2026-11-25.md). A cache that is not converted
    gives KL 0; one whose scale is off by 2x (saturating) or whose positions are misplaced, far more."""
    ids = np.asarray(loaded["fp32"].encode(EXCERPT.read_text(encoding="utf-8")[:4000])[:128], np.int64)
    ref = _teacher_forced(loaded["fp32"], ids)
    for cache, kl_bound, agree_bound in (("fp16", 2e-6, 1.0), ("int8", 1e-3, 0.95), ("int4", 0.12, 0.5)):
        got = _teacher_forced(loaded[cache], ids)
        kl, agree = _kl(ref, got), float((ref.argmax(-1) == got.argmax(-1)).mean())
        assert 0 < kl < kl_bound and agree >= agree_bound, (cache, kl, agree)


def test_pool_and_generation_buffers_are_the_declared_type_and_smaller(loaded):
    sizes = {}
    for cache, model in loaded.items():
        pool = pool_for(model.variant, 4, 64)  # gptedge serve's pool
        assert {b.dtype for b in pool.kv} == {np.dtype(ELEMENT[cache])}
        sizes[cache] = sum(b.nbytes for b in pool.kv)
        state = model.variant.start(2, 64)  # a generation's buffers (ONNX Runtime's own)
        assert {b.numpy().dtype for b in state.buffers} == {np.dtype(ELEMENT[cache])}
    assert [sizes["fp32"] // sizes[c] for c in CACHES] == [1, 2, 4, 8]


def test_serve_pool_decodes_with_a_quantized_cache(loaded):
    """The engine's pool (prefill into the scratch row, join, step) gives generate's greedy ids."""
    prompt = [464, 3290, 373, 257, 1110]
    for cache in ("int8", "int4"):
        model = loaded[cache]
        want = model.generate_batch([prompt], 12, greedy=True, ignore_eos=True, with_text=False)[0].ids
        assert pool_greedy(model, prompt, 12) == want, cache


def test_serve_pool_prefills_a_group_with_a_quantized_cache(loaded):
    """Two newcomers prefilled in one run (left-padded to the longer), then decoded together: generate's greedy ids
    for each."""
    prompts = [[464, 3290, 373, 257, 1110], [40, 716]]
    for cache in ("int8", "int4"):
        model = loaded[cache]
        want = [model.generate_batch([p], 10, greedy=True, ignore_eos=True, with_text=False)[0].ids for p in prompts]
        pool = pool_for(model.variant, 2, 64)
        tokens = pool.prefill_group([0, 1], prompts).argmax(-1)
        got = [[int(t)] for t in tokens]
        for _ in range(9):
            tokens = pool.step([0, 1], tokens).argmax(-1)
            for ids, t in zip(got, tokens, strict=True):
                ids.append(int(t))
        assert got == want, cache


def test_scales_are_the_calibrated_max_over_qmax(cache_dirs, loaded):
    from gptedge.quantize import kv_cache as kv

    source = loaded["fp32"]
    graph = onnx.load(str(cache_dirs["int8"] / "model.onnx"))
    scales = {t.name: onnx.numpy_helper.to_array(t) for t in graph.graph.initializer
              if t.name.startswith("kv_cache.")}
    shape = source.manifest.shape
    assert len(scales) == 2 * shape.n_layer
    text_ids = source.encode(CALIBRATION.read_text(encoding="utf-8")[:20000])
    L = shape.context_length  # windows of the whole context, 32 x 128 tokens in all (the default budget)
    amax = None
    for start in np.linspace(0, len(text_ids) - L, 32 * 128 // L).astype(int):
        window = np.asarray(text_ids[start:start + L], np.int64)[None]
        pos = np.arange(L)[None]  # the oracle: the fp32 source's presents, read off a plain forward
        _, presents = source.forward(window, np.ones_like(window), pos, source.empty_past(1))
        seen = [np.abs(p).max(axis=(0, 2)) for p in presents]  # (nh, hs)
        amax = seen if amax is None else [np.maximum(a, s) for a, s in zip(amax, seen, strict=True)]
    key0 = scales["kv_cache.0.key_scale"]
    assert key0.shape == (1, shape.n_head, 1, shape.head_dim)
    np.testing.assert_allclose(key0[0, :, 0], amax[0] * kv.MARGIN["int8"] / 127, rtol=1e-6)
    np.testing.assert_allclose(scales["kv_cache.1.value_scale"][0, :, 0], amax[3] * kv.MARGIN["int8"] / 127,
                               rtol=1e-6)


def test_manifest_records_the_cache_and_stays_readable_by_older_gptedge(cache_dirs):
    for cache in CACHES:
        data = json.loads((cache_dirs[cache] / MANIFEST_NAME).read_text())
        if cache == "fp32":  # as format 2 wrote it: an older gptedge reads it
            assert "kv_cache" not in data and data["format_version"] == 2
        else:  # an older gptedge refuses format 3 in one line rather than binding float buffers
            assert data["kv_cache"] == cache and data["format_version"] == 3
    shape = ModelShape("gpt2", 2, 4, 8, 100, 64)
    assert Manifest.from_dict({"shape": vars(shape), "format_version": 2}).kv_cache == "fp32"
    with pytest.raises(ModelDirError, match="kv cache 'int3' is not one of fp32, fp16, int8, int4"):
        Manifest.from_dict({"shape": vars(shape), "format_version": 3, "kv_cache": "int3"})


@pytest.mark.parametrize("graph_cache, claimed", [("int8", "fp32"), ("int8", "int4"), ("int4", "int8"),
                                                  ("fp16", "fp32"), ("fp32", "int8")])
def test_a_manifest_that_misstates_the_cache_is_refused(cache_dirs, tmp_path, graph_cache, claimed):
    edited = tmp_path / "m"
    shutil.copytree(cache_dirs[graph_cache], edited)
    data = json.loads((edited / MANIFEST_NAME).read_text())
    data["kv_cache"], data["format_version"] = claimed, 3
    (edited / MANIFEST_NAME).write_text(json.dumps(data))
    with pytest.raises(ModelDirError, match=f"says kv_cache {claimed}, the graph"):
        load(edited, device="cpu")


def test_cli_kv_cache_option(cache_dirs, gpt2_model_dir, tmp_path):
    runner = CliRunner()
    kvb = str(cache_dirs["fp32"])
    cases = [([kvb, "--kv-cache", "int3"], "'int3' is not one of 'fp32', 'fp16', 'int8', 'int4'", 2),
             ([kvb, "--kv-cache", "int8"], "--kv-cache int8 needs --calibration", 2),
             ([str(gpt2_model_dir), "--kv-cache", "fp16"], "needs a kv_buffer graph", 2),  # a bad command line
             ([kvb, "--kv-cache", "fp16", "--method", "fp16"], "an fp16 graph's cache is fp16 already", 2),
             ([kvb, "--method", None], "--method is required (or --kv-cache", 2)]  # neither: nothing to do
    for args, message, code in cases:
        method = [] if "--method" in args else ["--method", "weight-only"]
        args = args[:-2] if args[-1] is None else args
        result = runner.invoke(main, ["quantize", args[0], "-o", str(tmp_path / "x"), *method, *args[1:]])
        lines = [line for line in result.output.strip().splitlines() if line.strip()]
        assert result.exit_code == code and len(lines) == 1 and lines[0].startswith("Error: "), result.output
        assert message in result.output, result.output
        assert not (tmp_path / "x").exists()
    result = runner.invoke(main, ["quantize", kvb, "-o", str(tmp_path / "ok"), "--method", "weight-only",
                                  "--kv-cache", "int8", "--calibration", str(CALIBRATION)])
    assert result.exit_code == 0, result.output
    graph = onnx.load(str(tmp_path / "ok" / "model.onnx"), load_external_data=False)
    assert graph.graph.input[3].type.tensor_type.elem_type == onnx.TensorProto.INT8
    info = runner.invoke(main, ["info", str(tmp_path / "ok")])
    assert json.loads(info.output[info.output.index("{"):])["kv_cache"] == "int8"


def test_check_kv_cache_refuses_unknown_names():
    from gptedge.quantize.kv_cache import check_kv_cache

    with pytest.raises(QuantizationError, match="kv cache 'bf16' is not one of"):
        check_kv_cache("bf16", "kv_buffer", False)


def test_genai_runs_every_cache_with_gptedges_greedy_ids(cache_dirs, loaded):
    """GenAI takes the cache's type and shape from the graph: no genai_config field is needed (genai_config.py)."""
    og = pytest.importorskip("onnxruntime_genai")
    prompt = [464, 3290, 373, 257]
    for cache in CACHES[1:]:
        want = loaded[cache].generate(prompt, max_new_tokens=24, greedy=True, with_text=False).ids  # to eos
        model = og.Model(str(cache_dirs[cache]))
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(prompt) + 24)
        generator = og.Generator(model, params)
        generator.append_tokens(np.array([prompt], np.int32))
        while not generator.is_done():
            generator.generate_next_token()
        assert list(map(int, generator.get_sequence(0)))[len(prompt):] == list(want), cache
