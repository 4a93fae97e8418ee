"""`gptedge pack --target web | mobile` on GPT-2's descendants: transformers.js reads config.json's model_type
(`llama`, `qwen2`, `gpt_neox`, all of which it implements) and the `onnx/model_<dtype>.onnx` files; in Node,
through the playground's own module, it gives gptedge's greedy ids (tests/support/web_clients.py's harness; it skips
where
node or the playground's node_modules is absent). The ORT-format model runs through gptedge's loop with the source
dir's ids, the GQA kv_buffer graph and MatMulNBits included."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gptedge import runtime
from gptedge.cli import main
from gptedge.export.exporter import export_checkpoint

from ..support.lineage_checkpoints import write_variant_checkpoint
from ..support.web_clients import need_node, run_node

PROMPTS = [[1, 5, 77, 140, 9, 300], [1, 200, 31]]
MODEL_TYPE = {"gqa2-linear": "llama", "qwen2-qkv-bias": "qwen2", "neox-parallel": "gpt_neox"}


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """variant -> its standard fp32 dir; "gqa2-linear-int8" / "-q4": the Llama one weight-only 8- and 4-bit;
    "gqa2-linear-kv": the Llama kv_buffer graph, 4-bit."""
    root = tmp_path_factory.mktemp("lineage_pack")
    out = {}
    for variant in MODEL_TYPE:
        checkpoint = write_variant_checkpoint(root / f"ck-{variant}", variant)
        out[variant] = root / variant
        export_checkpoint(checkpoint, out[variant], graph_variant="standard", validate=False)
        if variant == "gqa2-linear":
            export_checkpoint(checkpoint, root / "kv", graph_variant="kv_buffer", validate=False)
    runner = CliRunner()
    for name, source, bits in (("gqa2-linear-int8", out["gqa2-linear"], "8"),
                               ("gqa2-linear-q4", out["gqa2-linear"], "4"), ("gqa2-linear-kv", root / "kv", "4")):
        out[name] = root / name
        result = runner.invoke(main, ["quantize", str(source), "-o", str(out[name]), "--method", "weight-only",
                                      "--bits", bits])
        assert result.exit_code == 0, result.output
    return out


def pack(models, target: str, out, *extra) -> None:
    result = CliRunner().invoke(main, ["pack", *map(str, models), "--target", target, "-o", str(out), *extra])
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def web_packs(dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("lineage_web")
    packs = {"gqa2-linear": root / "llama"}
    pack([dirs["gqa2-linear"], dirs["gqa2-linear-int8"], dirs["gqa2-linear-q4"]], "web", packs["gqa2-linear"],
         "--no-page")
    for variant in ("qwen2-qkv-bias", "neox-parallel"):
        packs[variant] = root / variant
        pack([dirs[variant]], "web", packs[variant], "--no-page")
    return packs


def test_web_pack_is_transformers_js_layout_with_the_familys_model_type(web_packs):
    llama = web_packs["gqa2-linear"]
    assert sorted(p.name for p in (llama / "onnx").iterdir()) == ["model.onnx", "model_int8.onnx", "model_q4.onnx"]
    config = json.loads((llama / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] == 2 and config["num_attention_heads"] == 4 and config["head_dim"] == 16
    assert config["transformers.js_config"]["dtype"] == "int8"  # the recommended graph: the 8-bit one
    for variant in ("qwen2-qkv-bias", "neox-parallel"):
        assert json.loads((web_packs[variant] / "config.json").read_text())["model_type"] == MODEL_TYPE[variant]
        assert (web_packs[variant] / "tokenizer.json").is_file()


def test_web_pack_refuses_a_kv_buffer_graph_in_one_line(dirs, tmp_path):
    result = CliRunner().invoke(main, ["pack", str(dirs["gqa2-linear-kv"]), "--target", "web", "--no-page", "-o",
                                       str(tmp_path / "w")])  # --no-page: the refusal needs no JavaScript installed
    assert result.exit_code != 0 and "not web-ready: a kv_buffer graph" in result.output.strip().splitlines()[-1]
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
def test_transformers_js_gives_gptedge_greedy_ids(web_packs, dirs):
    """Ids, not text: on a random model the continuations are runs of byte-fallback tokens that are not UTF-8, which
    the tokenizers library decodes run by run (an invalid byte turns its whole run into U+FFFD) and transformers.js
    byte by byte; on valid text both give the same characters (test_lineage_commands checks gptedge's against
    transformers')."""
    from ..web.test_web_node import GENERATE_JS

    need_node()
    for variant, dtypes in (("gqa2-linear", {"fp32": "gqa2-linear", "int8": "gqa2-linear-int8",
                                             "q4": "gqa2-linear-q4"}),
                            ("qwen2-qkv-bias", {"fp32": "qwen2-qkv-bias"}),
                            ("neox-parallel", {"fp32": "neox-parallel"})):
        texts = ["hello world", "the end"]
        got = run_node(GENERATE_JS, str(web_packs[variant]), json.dumps(list(dtypes)), json.dumps(texts), "16")
        for dtype, name in dtypes.items():
            model = runtime.load(dirs[name], device="cpu")
            for text, js in zip(texts, got[dtype], strict=True):
                assert js["ids"] == model.generate(text, max_new_tokens=16, greedy=True).ids, (variant, dtype, text)


def test_mobile_pack_runs_the_gqa_kv_buffer_graph_with_the_source_ids(dirs, tmp_path):
    pack([dirs["gqa2-linear-kv"]], "mobile", tmp_path / "m")
    assert (tmp_path / "m" / "model.ort").read_bytes()[4:8] == b"ORTM"
    operators = json.loads((tmp_path / "m" / "gptedge-pack.json").read_text())["operators"]
    assert {"com.microsoft:GroupQueryAttention", "com.microsoft:MatMulNBits"} <= set(operators)
    source, phone = runtime.load(dirs["gqa2-linear-kv"], device="cpu"), runtime.load(tmp_path / "m", device="cpu")
    for prompt in PROMPTS:
        assert phone.generate(prompt, max_new_tokens=16, greedy=True).ids == source.generate(
            prompt, max_new_tokens=16, greedy=True).ids


@pytest.mark.parametrize("variant", ["qwen2-qkv-bias", "neox-parallel"])
def test_mobile_pack_of_qwen2_and_gpt_neox(dirs, variant, tmp_path):
    """Through the command line (`python -m gptedge.cli`, what the installed `gptedge` runs): its output is the one
    line saying what was written (neither the converter's own log nor ONNX Runtime's warning about logits_to_keep,
    an input with a default), and the phone's graph gives the source dir's ids."""
    from ..support.cli import run_gptedge

    result = run_gptedge("pack", str(dirs[variant]), "--target", "mobile", "-o", str(tmp_path / "m"))
    assert result.returncode == 0, result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("packed "), lines
    source, phone = runtime.load(dirs[variant], device="cpu"), runtime.load(tmp_path / "m", device="cpu")
    for prompt in PROMPTS:
        assert phone.generate(prompt, max_new_tokens=16, greedy=True).ids == source.generate(
            prompt, max_new_tokens=16, greedy=True).ids


def test_mobile_pack_keeps_the_chat_template(tmp_path):
    """The phone's folder is what serve and GenAI's apps read: the source's chat template travels with it."""
    checkpoint = write_variant_checkpoint(tmp_path / "ck", "gemma-mqa")
    config_path = checkpoint / "tokenizer_config.json"
    template = "{% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>{% endfor %}"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "chat_template": template}))
    export_checkpoint(checkpoint, tmp_path / "fp32", graph_variant="kv_buffer", validate=False)
    pack([tmp_path / "fp32"], "mobile", tmp_path / "m")
    assert (tmp_path / "m" / "chat_template.jinja").read_text() == template
    runtime.load(tmp_path / "m", device="cpu")
