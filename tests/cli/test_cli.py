"""The gptedge command through click's CliRunner: output streams and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gptedge import __version__
from gptedge.cli import main
from gptedge.runtime.generation.sampling import SamplingParams

from ..support.cli import one_line_error


def test_help_and_version(runner):
    for flag in ("-h", "--help"):
        result = runner.invoke(main, [flag])
        assert result.exit_code == 0 and "export" in result.output and "generate" in result.output
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_every_command_has_help(runner):
    """`COMMAND -h` for each command (bench and compare's --peers type once broke it on click 8.2+)."""
    for name in main.commands:
        result = runner.invoke(main, [name, "-h"])
        assert result.exit_code == 0 and result.output.startswith(f"Usage: main {name}"), (name, result.output)
    assert "ctranslate2,llama.cpp,optimum" in runner.invoke(main, ["compare", "-h"]).output


def test_export_command(runner, gpt2_checkpoint, tmp_path):
    result = runner.invoke(main, ["export", str(gpt2_checkpoint), "-o", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert "graph vs reference max |diff|" in result.stderr and result.stdout == ""
    manifest = json.loads((tmp_path / "m" / "gptedge.json").read_text())
    assert manifest["parity"]["greedy_vs_reference"]["identical"]


def test_generate_streams_text_on_stdout_and_timings_on_stderr(runner, gpt2_model_dir, gpt2_loaded):
    result = runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "Hello world", "-n", "10", "--greedy",
                                  "--device", "cpu"])
    assert result.exit_code == 0, result.output
    want = gpt2_loaded.generate("Hello world", max_new_tokens=10, greedy=True).text
    assert result.stdout == want + "\n"
    assert "tok/s" in result.stderr and "loaded" in result.stderr and "CPUExecutionProvider" in result.stderr


def test_generate_json(runner, gpt2_model_dir):
    result = runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "Hello world", "-n", "6", "--top-k", "5",
                                  "--top-p", "0.9", "--temperature", "0.7", "--repetition-penalty", "1.2",
                                  "--seed", "3", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["prompt_ids"] == [15496, 995] and len(out["ids"]) == 6
    assert out["stop"] == "max_new_tokens" and out["tokens_per_s"] > 0 and isinstance(out["text"], str)


def test_info_shows_manifest_and_providers(runner, gpt2_model_dir):
    result = runner.invoke(main, ["info", str(gpt2_model_dir), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["manifest"]["shape"]["n_layer"] == 2
    assert "CPUExecutionProvider" in out["providers_available"] and out["providers_used"] == ["CPUExecutionProvider"]


# Bad input (docs/design.md#failures-and-bad-input) is in tests/cli/test_bad_*.py, through the real command in a
# subprocess.


# --- every option reaches the library (docs/design.md#the-parity-ladder: a test that fails when an option is ignored)
# -------------


class Calls:
    """Records the calls of a monkeypatched function; returns `value(*args, **kwargs)`."""

    def __init__(self, value=None):
        self.value, self.calls = value, []

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.value(*args, **kwargs) if callable(self.value) else self.value


@pytest.fixture
def captured_load(monkeypatch, gpt2_loaded):
    """gptedge.runtime.load recorded; it hands back the session's model with generate/stream recorded too."""
    import gptedge.runtime

    model = gpt2_loaded
    record = Calls(lambda *a, **k: proxy)

    class Proxy:
        def __getattr__(self, name):
            return getattr(model, name)

    proxy = Proxy()
    proxy.generate = Calls(model.generate)
    proxy.stream = Calls(model.stream)
    monkeypatch.setattr(gptedge.runtime, "load", record)
    return record, proxy


def test_generate_passes_every_option(runner, captured_load, gpt2_model_dir):
    from gptedge.cli.options import default_threads

    load, model = captured_load
    args = ["generate", str(gpt2_model_dir), "-p", "Hello", "-n", "3", "--top-k", "5", "--top-p", "0.9",
            "--temperature", "0.7", "--repetition-penalty", "1.2", "--seed", "4", "--stop", "xyz", "--stop", "q",
            "--device", "cpu", "--threads", "1"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    (_, load_kw), = load.calls
    assert load_kw["device"] == "cpu" and load_kw["session"].threads == 1
    (prompt,), kw = model.stream.calls[0]
    assert prompt == "Hello" and kw == dict(max_new_tokens=3, stop=("xyz", "q"), sampling=SamplingParams(
        top_k=5, top_p=0.9, temperature=0.7, repetition_penalty=1.2, seed=4, greedy=False))
    result = runner.invoke(main, ["generate", str(gpt2_model_dir), "-p", "Hi", "--greedy", "--json"])
    assert result.exit_code == 0, result.output
    assert load.calls[1][1]["device"] == "auto" and load.calls[1][1]["session"].threads == default_threads()
    (prompt,), kw = model.generate.calls[0]
    assert kw["sampling"] == SamplingParams(greedy=True) and kw["max_new_tokens"] == 64
    assert json.loads(result.stdout)["prompt"] == "Hi"


def test_export_passes_every_option(runner, monkeypatch, gpt2_checkpoint, tmp_path):
    from types import SimpleNamespace as NS

    import gptedge.export.exporter as exporter
    from gptedge.runtime.modeldir.manifest import Manifest, ModelShape  # --force replaces only a dir holding a manifest

    parity = NS(graph_vs_reference=NS(max_abs_diff=0.0, output="logits", step="prefill", top1_agreement=1.0),
                greedy_vs_reference=NS(tokens_compared=1, prompts=1))
    export = Calls(NS(parity=parity))
    monkeypatch.setattr(exporter, "export_checkpoint", export)
    out = tmp_path / "m"
    out.mkdir()
    (out / "gptedge.json").write_text(json.dumps(Manifest(shape=ModelShape("gpt2", 1, 1, 1, 1, 1)).to_dict()))
    args = ["export", str(gpt2_checkpoint), "-o", str(out)]
    assert runner.invoke(main, [*args, "--force", "--opset", "18", "--plain-ops", "--graph", "kv_buffer",
                                "--revision", "v2"]).exit_code == 0
    assert runner.invoke(main, [*args[:-1], str(tmp_path / "new")]).exit_code == 0
    assert [c[1] for c in export.calls] == [
        dict(force=True, opset=18, fused=False, graph_variant="kv_buffer", revision="v2"),
        dict(force=False, opset=17, fused=True, graph_variant="standard", revision=None)]
    assert [c[0] for c in export.calls] == [(str(gpt2_checkpoint), str(out)),
                                            (str(gpt2_checkpoint), str(tmp_path / "new"))]


def test_quantize_passes_every_option(runner, monkeypatch, gpt2_model_dir, tmp_path):
    from types import SimpleNamespace as NS

    import gptedge.quantize.quantizer as q

    done = NS(parity=NS(vs_fp32=NS(top1_agreement=1.0, max_abs_logit_diff=0.0, device="cpu", greedy_agreement=1.0)),
              quantization=NS(quantized_nodes={}, awq=False))
    quantize = Calls(done)
    monkeypatch.setattr(q, "quantize_model_dir", quantize)
    (tmp_path / "cal.txt").write_text("calibration text " * 20, encoding="utf-8")  # 40 tokens: 25 windows of 16
    out = tmp_path / "q"
    out.mkdir()
    # each option to a method that reads it (one it would not read is refused: test_quantize_options_that_do_nothing)
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(out), "--method", "static",
                                  "--per-tensor", "--quantize-attention", "--calibration", str(tmp_path / "cal.txt"),
                                  "--calibration-sequences", "3", "--calibration-length", "16", "--force"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q2"), "--method", "dynamic"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q3"), "--method",
                                  "weight-only", "--bits", "4", "--symmetric", "--embedding-bits", "4", "--float16",
                                  "--block-size", "64", "--accuracy-level", "0"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q4"), "--method", "fp16"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q5"), "--method", "dynamic",
                                  "--activation-scale", "per-tensor", "--full-range"])
    assert result.exit_code == 0, result.output
    (first, second, third, fourth, fifth) = quantize.calls
    assert (fifth[0][2].activation_scale, fifth[0][2].reduce_range) == ("per-tensor", False)
    recipe = third[0][2]
    assert (recipe.bits, recipe.symmetric, recipe.embedding_bits, recipe.float16) == (4, True, 4, True)
    assert (recipe.block_size, recipe.accuracy_level) == (64, 0)
    assert fourth[0][2] == q.QuantizeRecipe(method="fp16") and fourth[0][2].bits == 16
    assert first[0][:2] == (str(gpt2_model_dir), str(out))
    recipe = first[0][2]
    assert recipe == q.QuantizeRecipe(method="static", per_channel=False, quantize_attention=True,
                                      calibration_sequences=3, calibration_length=16)
    assert first[1]["force"] is True and first[1]["calibration_text"] == "calibration text " * 20
    recipe = second[0][2]
    assert recipe == q.QuantizeRecipe(method="dynamic", per_channel=True, block_size=32, accuracy_level=4,
                                      quantize_attention=False, calibration_sequences=32, calibration_length=128,
                                      activation_scale="per-row", reduce_range=True, quantize_head=False)
    assert second[1]["force"] is False and second[1]["calibration_text"] is None


def test_eval_passes_every_option(runner, monkeypatch, captured_load, gpt2_model_dir, tmp_path):
    import gptedge.runtime.generation.evaluate as evaluate

    load, _ = captured_load
    ppl = Calls(evaluate.perplexity)
    monkeypatch.setattr(evaluate, "perplexity", ppl)
    (tmp_path / "t.txt").write_text("Hello world, it is a truth universally acknowledged", encoding="utf-8")
    result = runner.invoke(main, ["eval", str(gpt2_model_dir), "--text", str(tmp_path / "t.txt"), "--stride", "3",
                                  "--device", "cpu", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("perplexity ")
    (model, ids, stride), _ = ppl.calls[0]
    assert stride == 3 and ids == model.encode((tmp_path / "t.txt").read_text())
    assert load.calls[0][1]["device"] == "cpu" and load.calls[0][1]["session"].threads == 1


def test_compare_passes_every_option(runner, monkeypatch, captured_load, gpt2_model_dir, tmp_path):
    import gptedge.measure.compare as compare

    load, _ = captured_load
    run = Calls(compare.compare)
    monkeypatch.setattr(compare, "compare", run)
    (tmp_path / "t.txt").write_text("Hello world, it is a truth universally acknowledged " * 20, encoding="utf-8")
    result = runner.invoke(main, ["compare", str(gpt2_model_dir), str(gpt2_model_dir), "--text",
                                  str(tmp_path / "t.txt"), "--prompts", "2", "--new-tokens", "3", "--max-tokens", "40",
                                  "--prompt-tokens", "9", "--device", "cpu", "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    (models, ids), kw = run.calls[0]
    assert len(models) == 2 and len(ids) == 40 and kw["prompts"] == 2 and kw["new_tokens"] == 3
    assert kw["prompt_length"] == 9
    proxy = captured_load[1]
    assert {len(a[0]) for a, _ in proxy.generate.calls} == {9}  # the greedy prompts are 9 tokens long
    assert [c[1]["device"] for c in load.calls] == ["cpu", "cpu"] and load.calls[0][1]["session"].threads == 1
    assert len(json.loads(result.stdout)) == 2
    _, proxy = captured_load  # greedy agreement / tok/s: ids only, as the peers' loops (no text decoding timed)
    assert proxy.generate.calls and all(kw["with_text"] is False for _, kw in proxy.generate.calls)


def test_compare_passes_peers_and_source(runner, monkeypatch, captured_load, gpt2_model_dir, gpt2_checkpoint, tmp_path):
    """--peers, --source and --threads reach open_peers; what it builds reaches compare; its skip lines go to stderr."""
    from contextlib import contextmanager

    import gptedge.measure.compare as compare
    import gptedge.measure.peers.score as peer_accuracy

    opened, scorers = [], [object()]

    @contextmanager
    def fake_open(names, source, model_dir, threads, **kw):
        opened.append((names, source, model_dir, threads))
        yield scorers, ["peer llama.cpp skipped: not here"]

    real = compare.compare
    run = Calls(lambda models, ids, **kw: real(models, ids, **{**kw, "peers": []}))
    monkeypatch.setattr(peer_accuracy, "open_peers", fake_open)
    monkeypatch.setattr(compare, "compare", run)
    (tmp_path / "t.txt").write_text("Hello world, it is a truth universally acknowledged " * 20, encoding="utf-8")
    base = ["compare", str(gpt2_model_dir), "--text", str(tmp_path / "t.txt"), "--prompts", "1", "--new-tokens", "2",
            "--threads", "1", "--json"]
    result = runner.invoke(main, [*base, "--peers", "optimum,llama.cpp", "--source", str(gpt2_checkpoint)])
    assert result.exit_code == 0, result.output
    assert opened == [(["optimum", "llama.cpp"], Path(gpt2_checkpoint), Path(gpt2_model_dir), 1)]
    assert run.calls[0][1]["peers"] is scorers and "peer llama.cpp skipped: not here" in result.stderr
    result = runner.invoke(main, [*base, "--peers", "ctranslate2"])  # the checkpoint REF's manifest records
    assert result.exit_code == 0, result.output
    assert opened[1][1] == Path(gpt2_checkpoint).resolve()
    result = runner.invoke(main, base)
    assert result.exit_code == 0 and len(opened) == 2 and run.calls[2][1]["peers"] == []


def test_bench_passes_every_option(runner, monkeypatch, gpt2_model_dir, gpt2_checkpoint):
    import gptedge.measure.bench as bench
    import gptedge.measure.peers.bench as peer_bench
    from gptedge.measure.bench import BenchRow

    ours = Calls(BenchRow("gptedge", 0.1, 0.01, 100.0, 50.0))
    peers = Calls([BenchRow("peer", 0.1, 0.01, 100.0, 50.0)])
    monkeypatch.setattr(bench, "bench_gptedge", ours)
    monkeypatch.setattr(peer_bench, "bench_peers", peers)
    result = runner.invoke(main, ["bench", str(gpt2_model_dir), "--prompt", "5", "--new", "7", "--batch", "2",
                                  "--threads", "1", "--repeat", "2", "--peers", "torch,optimum", "--source",
                                  str(gpt2_checkpoint), "--device", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    (model, prompts, new, threads, repeat, device), _ = ours.calls[0]
    assert (model, len(prompts), len(prompts[0]), new, threads, repeat, device) == (str(gpt2_model_dir), 2, 5, 7, 1, 2,
                                                                                    "cpu")
    (names, source, _, peer_prompts, new, threads, repeat), _ = peers.calls[0]
    assert names == ["torch", "optimum"] and str(source) == str(gpt2_checkpoint) and peer_prompts == prompts
    assert (new, threads, repeat) == (7, 1, 2)
    setup = json.loads(result.stdout)["setup"]
    assert setup["threads"] == 1 and setup["batch"] == 2 and setup["device"] == "cpu"
    result = runner.invoke(main, ["bench", str(gpt2_model_dir), "--context", "20", "--new", "8"])
    assert result.exit_code == 0, result.output
    (_, prompts, new, *_), _ = ours.calls[1]
    assert len(prompts[0]) == 12 and new == 8 and "| gptedge |" in result.stdout


def test_info_passes_device(runner, captured_load, gpt2_model_dir):
    load, _ = captured_load
    assert runner.invoke(main, ["info", str(gpt2_model_dir), "--device", "cpu"]).exit_code == 0
    assert runner.invoke(main, ["info", str(gpt2_model_dir)]).exit_code == 0
    assert [c[1]["device"] for c in load.calls] == ["cpu", "auto"]


def test_verbose_logs_progress(gpt2_model_dir, tmp_path):
    import subprocess
    import sys

    quiet, loud = (subprocess.run([sys.executable, "-m", "gptedge.cli", *flag, "info", str(gpt2_model_dir)],
                                  capture_output=True, text=True, cwd=tmp_path) for flag in ([], ["-v"]))
    assert quiet.returncode == loud.returncode == 0
    assert "INFO gptedge" not in quiet.stderr and "INFO gptedge.runtime" in loud.stderr


# The test files that count for test_every_option_is_tested: where each command's options are
# exercised (--markdown / --plot: the real compare run in test_eval_compare; --precision: test_fp16; serve: the real
# server in test_serve and test_serve_hostile; pack: test_pack_web / test_pack_mobile; serve --web:
# test_serve_playground; verify: test_model_integrity; classify and export --task: test_classify_cli; compare
# --labelled: test_classify_compare; quantize --keep-8bit: test_int4_mixed; serve --chat-template: test_serve_chat;
# quantize --scale-search / --awq: test_quantizers; --gptq: test_gptq; --max-kl / --prefer: test_recipe_search;
# serve --spin-us: test_serve_spin; fetch-web: test_fetch_web; quantize's options per method:
# test_quantize_options_that_do_nothing).
OPTION_TESTS = ["tests/cli/test_cli.py", "tests/cli/test_quantize_options_that_do_nothing.py",
                "tests/measure/test_eval_compare.py", "tests/serve/test_serve.py",
                "tests/quantize/test_fp16.py", "tests/web/test_pack_web.py", "tests/web/test_pack_mobile.py",
                "tests/serve/test_serve_playground.py", "tests/serve/test_serve_hostile.py",
                "tests/modeldir/test_model_integrity.py", "tests/families/test_classify_cli.py",
                "tests/measure/test_classify_compare.py", "tests/quantize/test_int4_mixed.py",
                "tests/serve/test_serve_chat.py", "tests/quantize/test_quantizers.py",
                "tests/quantize/test_recipe_search.py", "tests/serve/test_prefix_reuse.py",
                "tests/web/test_fetch_web.py", "tests/serve/test_serve_spin.py", "tests/quantize/test_gptq.py",
                "tests/quantize/test_rotate_down.py"]


def test_every_option_is_tested():
    """Each command's options appear, quoted, in one of the OPTION_TESTS files."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    source = "".join((root / name).read_text() for name in OPTION_TESTS)
    for name, command in main.commands.items():
        for param in command.params:
            if isinstance(param, __import__("click").Option):
                assert any(f"\"{opt}\"" in source for opt in param.opts + param.secondary_opts), (name, param.opts)


def test_generate_beam_options(runner, gpt2_model_dir, gpt2_loaded):
    """--num-beams / --length-penalty / --early-stopping / --num-return-sequences reach beam search as given."""
    args = ["generate", str(gpt2_model_dir), "-p", "Hello world", "-n", "10", "--json", "--device", "cpu"]
    for extra, options in [
        (["--num-beams", "3", "--num-return-sequences", "2"], dict(num_beams=3, num_return_sequences=2)),
        (["--num-beams", "4", "--length-penalty", "-0.5", "--early-stopping", "never", "--num-return-sequences", "3"],
         dict(num_beams=4, length_penalty=-0.5, early_stopping="never", num_return_sequences=3)),
        (["--num-beams", "2", "--early-stopping"], dict(num_beams=2, early_stopping=True)),
    ]:
        result = runner.invoke(main, [*args, *extra])
        assert result.exit_code == 0, result.output
        got = json.loads(result.output.strip().splitlines()[-1])["sequences"]
        want = gpt2_loaded.beam_search(["Hello world"], 10, **options)[0]
        assert [s["ids"] for s in got] == want.sequences and [s["score"] for s in got] == want.scores
        assert [s["text"] for s in got] == want.texts
    bad = runner.invoke(main, [*args, "--num-beams", "2", "--seed", "1"])
    assert bad.exit_code == 2 and "takes no sampling options" in bad.output


def test_quantize_kv_cache_value_is_checked(runner, gpt2_model_dir, tmp_path):
    """--kv-cache end to end (every value, the graph, the manifest, the pool): test_kv_cache.py; here a bad value."""
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "x"), "--kv-cache", "int3"])
    assert "'int3' is not one of 'fp32', 'fp16', 'int8', 'int4'" in one_line_error(result)
    assert result.exit_code == 2 and not (tmp_path / "x").exists()


def test_serve_http_httptools_without_httptools_is_one_line_before_the_model_loads(runner, gpt2_model_dir,
                                                                                   monkeypatch):
    import sys

    pytest.importorskip("uvicorn")
    monkeypatch.setitem(sys.modules, "uvicorn.protocols.http.httptools_impl", None)  # as if httptools were missing
    result = runner.invoke(main, ["serve", str(gpt2_model_dir), "--http", "httptools", "--port", "0"])
    assert result.exit_code == 2 and "loaded" not in result.output
    assert "'--http'" in result.output and "httptools is not installed" in result.output
