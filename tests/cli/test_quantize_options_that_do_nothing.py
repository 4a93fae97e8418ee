"""`gptedge quantize` refuses an option its recipe would not read (issue #35): exit 2, one line naming the option
and who takes it, nothing written, before any work. The same option given to a method that reads it still runs (the
passing side of each boundary is the cheap one: the refusal comes first, so only a few good rows quantize)."""

from __future__ import annotations

import pytest

from gptedge.cli import main

from ..support.checkpoints import ROOT

CALIBRATION = str(ROOT / "samples" / "calibration" / "emma_ch1-4.txt")
REFUSED = [
    (["--method", "weight-only", "--per-tensor"], "--per-channel/--per-tensor applies to --method dynamic or static"),
    (["--method", "weight-only", "--per-channel"], "--per-channel/--per-tensor applies to --method dynamic or static"),
    (["--method", "fp16", "--per-tensor"], "--per-channel/--per-tensor applies to"),
    (["--method", "fp16", "--reduce-range"], "--reduce-range/--full-range applies to --method dynamic only"),
    (["--method", "static", "--calibration", CALIBRATION, "--full-range"], "--reduce-range/--full-range applies"),
    (["--method", "weight-only", "--activation-scale", "per-tensor"], "--activation-scale applies to --method dynamic"),
    (["--method", "dynamic", "--block-size", "64"], "--block-size applies to --method weight-only only"),
    (["--method", "dynamic", "--accuracy-level", "0"], "--accuracy-level applies to --method weight-only only"),
    (["--method", "static", "--calibration", CALIBRATION, "--scale-search", "range"], "--scale-search applies to"),
    (["--method", "dynamic", "--keep-8bit", "*"], "keeping linears at 8 bits applies to weight-only 4-bit"),
    (["--method", "weight-only", "--symmetric"], "--symmetric/--asymmetric applies to 4-bit weights only"),
    (["--method", "weight-only", "--bits", "8", "--asymmetric"], "asymmetric applies to 4-bit weights (bits 4)"),
    (["--method", "weight-only", "--bits", "8", "--keep-8bit", "*"], "keeping linears at 8 bits applies to"),
    (["--method", "dynamic", "--calibration", CALIBRATION], "--calibration applies to --method static, --awq"),
    (["--method", "weight-only", "--bits", "4", "--calibration", CALIBRATION], "--calibration applies to"),
    (["--method", "fp16", "--calibration", CALIBRATION], "--calibration applies to"),
    (["--method", "dynamic", "--calibration-sequences", "4"], "--calibration-sequences applies with --calibration"),
    (["--method", "weight-only", "--calibration-length", "64"], "--calibration-length applies with --calibration"),
    (["--method", "dynamic", "--quantize-head"], "--quantize-head/--float-head applies to task-head dirs"),
    (["--method", "dynamic", "--float-head"], "--quantize-head/--float-head applies to task-head dirs"),
    (["--method", "dynamic", "--prefer", "size"], "--prefer applies to --max-kl only"),
    (["--method", "dynamic", "--gptq", "--calibration", CALIBRATION], "--gptq applies to weight-only"),
    (["--kv-cache", "fp16"], "--kv-cache fp16 needs a kv_buffer graph"),  # was exit 1
]


@pytest.mark.parametrize("options, says", REFUSED, ids=[" ".join(o[1:]).replace(CALIBRATION, "TEXT")
                                                        for o, _ in REFUSED])
def test_an_option_the_recipe_would_not_read_is_refused(runner, gpt2_model_dir, tmp_path, options, says):
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q"), *options])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"Error: {says}"), result.output
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("options", [["--method", "weight-only", "--bits", "4", "--symmetric", "--block-size", "16"],
                                     ["--method", "weight-only", "--embedding-bits", "4", "--asymmetric"],
                                     ["--method", "dynamic", "--per-tensor", "--full-range"]],
                         ids=["w4-symmetric", "embedding-4-asymmetric", "dynamic-per-tensor"])
def test_the_same_options_to_a_method_that_reads_them_run(runner, gpt2_model_dir, tmp_path, options):
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q"), *options])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "q" / "gptedge.json").is_file()


@pytest.mark.parametrize("extra, code", [(0, 0), (1, 2)], ids=["as-many-windows-as-the-text-holds", "one-more"])
def test_calibration_sequences_past_what_the_text_holds_are_refused(runner, gpt2_model_dir, tmp_path, extra, code):
    """Was: --calibration-sequences 100000 on a short text calibrated for minutes on overlapping windows."""
    from gptedge.runtime.modeldir.tokenizer import encode, load_tokenizer

    text = tmp_path / "short.txt"
    text.write_text(open(CALIBRATION, encoding="utf-8").read()[:700], encoding="utf-8")
    holds = len(encode(load_tokenizer(gpt2_model_dir), text.read_text(encoding="utf-8"))) - 128 + 1
    assert 2 <= holds <= 60
    result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q"), "--method", "static",
                                  "--calibration", str(text), "--calibration-sequences", str(holds + extra)])
    assert result.exit_code == code, result.output
    if code:
        assert result.output.startswith(f"Error: --calibration-sequences {holds + 1}: the calibration text "), \
            result.output
        assert f"holds {holds} windows of 128 tokens" in result.output and not (tmp_path / "q").exists()
