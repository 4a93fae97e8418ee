"""Real JavaScript clients of a web pack, in Node: transformers.js (through the playground's own module, as the page
calls it) gives gptedge's greedy ids for every web recipe; onnxruntime-web's WASM backend creates a session for
every graph kind gptedge writes (the claim behind runtime/modeldir/web_ready.py's WASM_CONTRIB_OPS)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from gptedge.pack.selftest import SELFTEST_FILE
from gptedge.runtime import load
from ..support.web_clients import need_node, run_node

pytestmark = pytest.mark.slow  # the sample model in four recipes, packed and run by real clients

PROMPTS = ["It is a truth universally acknowledged, that", "The", "Hello"]
NEW_TOKENS = 32

GENERATE_JS = """
import { configureRuntime, loadModel, generateLocal } from './playground.js';
const [base, dtypes, prompts, n] = [process.argv[2], JSON.parse(process.argv[3]), JSON.parse(process.argv[4]),
                                    Number(process.argv[5])];
await configureRuntime();
const out = {};
for (const dtype of dtypes) {
  const loaded = await loadModel(base, { dtype });
  out[dtype] = [];
  for (const p of prompts) {
    const r = await generateLocal(loaded, p, { maxNewTokens: n, greedy: true });
    out[dtype].push({ ids: r.ids, text: r.text });
  }
  await loaded.model.dispose();
}
const fallback = await loadModel(base);  // no dtype: the pack's recommended graph
out.default = fallback.dtype;
console.log(JSON.stringify(out));
"""

SESSIONS_JS = """
import * as ort from 'onnxruntime-web';

ort.env.wasm.numThreads = 1;
const out = {};
for (const path of process.argv.slice(2)) {
  const session = await ort.InferenceSession.create(path);
  out[path] = session.outputNames;
  await session.release();
}
console.log(JSON.stringify(out));
"""


@pytest.fixture(scope="module")
def packed(sample_recipe_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("web") / "pack"
    done = subprocess.run([sys.executable, "-m", "gptedge.cli", "pack", *(str(d) for d in sample_recipe_dirs.values()),
                           "--target", "web", "-o", str(out), "--no-page"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return out


def test_transformers_js_gives_gptedge_greedy_ids(packed, sample_recipe_dirs):
    need_node()
    dtypes = {"fp32": "fp32", "dynamic": "q8", "w8": "int8", "w4": "q4"}
    got = run_node(GENERATE_JS, str(packed), json.dumps(list(dtypes.values())), json.dumps(PROMPTS), str(NEW_TOKENS))
    assert got["default"] == "q8"
    for name, dtype in dtypes.items():
        model = load(sample_recipe_dirs[name], device="cpu")
        for prompt, js in zip(PROMPTS, got[dtype], strict=True):
            want = model.generate(prompt, max_new_tokens=NEW_TOKENS, greedy=True)
            assert js["ids"] == want.ids, (name, prompt)
            assert js["text"] == want.text, (name, prompt)


def test_onnxruntime_web_wasm_creates_every_graph_kind(sample_recipe_dirs, gpt2_kv_buffer_loaded):
    need_node()
    graphs = [str(d / "model.onnx") for d in sample_recipe_dirs.values()]
    graphs.append(str(gpt2_kv_buffer_loaded.model_dir / "model.onnx"))  # GroupQueryAttention
    got = run_node(SESSIONS_JS, *graphs)
    assert sorted(got) == sorted(graphs)
    assert all(outputs[0] == "logits" for outputs in got.values())


SELFTEST_JS = """
import { configureRuntime, loadModel, readSelfTest, runSelfTest, formatSelfTest } from './playground.js';
const [base, tampered] = [process.argv[2], JSON.parse(process.argv[3])];
await configureRuntime();
const golden = await readSelfTest(base);
const out = {};
for (const { dtype } of golden.graphs) {
  const loaded = await loadModel(base, { dtype });
  const own = await runSelfTest(loaded, golden);
  // a wrong model: the fp32 graph's golden cases held against this graph
  const wrong = await runSelfTest(loaded, { graphs: [{ ...golden.graphs.find((g) => g.dtype === 'fp32'), dtype }] });
  out[dtype] = { own: [own.pass, own.maxDelta, formatSelfTest(own)], wrong: [wrong.pass, formatSelfTest(wrong)],
                 tampered: formatSelfTest(await runSelfTest(loaded, tampered)) };
  await loaded.model.dispose();
}
console.log(JSON.stringify(out));
"""


def test_golden_self_test_passes_on_its_graphs_and_fails_on_others(packed):
    """Every graph of the pack passes its own golden self-test in Node (native onnxruntime, as the Python runtime
    ran); the fp32 golden held against a quantized graph fails, and so does a golden file with one logit moved."""
    need_node()
    golden = json.loads((packed / SELFTEST_FILE).read_text())
    assert [g["dtype"] for g in golden["graphs"]] == ["fp32", "q8", "int8", "q4"]
    assert all(len(g["cases"]) == 3 and g["tolerance"] > 0 and g["why_tolerance"] for g in golden["graphs"])
    tampered = json.loads(json.dumps(golden))
    for g in tampered["graphs"]:
        g["cases"][1]["top"][0][0][1] += 4 * g["tolerance"]  # the first step's best logit of the second prompt
    got = run_node(SELFTEST_JS, str(packed), json.dumps(tampered))
    for dtype, result in got.items():
        passed, delta, line = result["own"]
        assert passed and delta < 1e-5 and line.startswith("self-test: pass (max |Δlogit| = "), (dtype, line)
        assert result["tampered"].startswith("self-test: fail (max |Δlogit| = "), (dtype, result["tampered"])
        if dtype != "fp32":
            assert not result["wrong"][0] and "fail" in result["wrong"][1], (dtype, result["wrong"])
