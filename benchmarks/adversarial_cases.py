"""The adversarial pass's command-line cases (adversarial.py runs them): every command given what a careful and a
hostile user would, and model dirs tampered one thing at a time (adversarial_dirs.py's breakages, and more).
Arguments are templates: {lm} {kvb} {dyn} {w4} {llama} {cls} {mob} {ck} {clsck} model dirs and checkpoints,
{text} {binary} {empty} {jsonl}... files, {tmp} the case's scratch dir, {out} a path in it not yet made,
{earlier} an earlier output the user keeps (a case that changes it is data-loss)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from adversarial import Case
from adversarial_dirs import CASES as DIR_CASES
from adversarial_dirs import edit, flip_byte, write

MANIFEST = "gptedge.json"


def cli(cid: str, args: list[str], expect: str = "usage", oracle=None, timeout_s: int = 60) -> Case:
    return Case(cid, args[0], "cli", args, expect, oracle, timeout_s=timeout_s)


# -- oracles: None when the result is right, else why not ------------------------------------------------------------
def greedy_matches_api(model: str, prompt: str, n: int):
    def check(result, ctx):
        want = ctx.model(model).generate(prompt, max_new_tokens=n, greedy=True).text
        got = result.stdout.rstrip("\n")
        return None if got == want.rstrip("\n") else f"CLI {got[:60]!r} != API {want[:60]!r}"
    return check


def json_out(check):
    def oracle(result, ctx):
        try:
            data = json.loads(result.stdout)
        except ValueError:
            return f"not JSON: {result.stdout[:80]!r}"
        return check(data, ctx)
    return oracle


def stops_at_context(data, ctx):
    n = len(data["prompt_ids"]) + len(data["ids"]) if "prompt_ids" in data else None
    return None if data.get("stop") == "context" and n in (None, 128) else f"stop {data.get('stop')}, {n} tokens"


def perplexity_matches_api(text: str, stride=None):
    def check(data, ctx):
        from gptedge.runtime.generation.evaluate import perplexity

        m = ctx.model("lm")
        want = perplexity(m, m.encode(Path(ctx.paths[text]).read_text(encoding="utf-8")), stride).perplexity
        got = data["perplexity"]
        return None if math.isclose(got, want, rel_tol=1e-5) else f"ppl {got} != API {want}"
    return check


def dir_verifies(precision: str | None = None):
    """The output dir loads, verifies (every claim against its graph) and says `precision`."""
    def check(result, ctx):
        from gptedge.runtime.verify import FAIL, verify_model_dir

        out = Path(ctx.paths["out"])
        manifest = json.loads((out / MANIFEST).read_text())
        if precision and manifest["precision"] != precision:
            return f"precision {manifest['precision']}, want {precision}"
        failed = [f.line for f in verify_model_dir(out, device="cpu") if f.status == FAIL]
        return f"verify: {failed[:2]}" if failed else None
    return check


def info_is_manifest(model: str):
    def check(result, ctx):
        manifest = json.loads((Path(ctx.paths[model]) / MANIFEST).read_text())
        return None if manifest["precision"] in result.stdout and manifest["model_file"] in result.stdout \
            else "info does not show the manifest"
    return check


def classify_matches_api(text_args: tuple[str, str]):
    def check(data, ctx):
        from gptedge.runtime import load_classifier

        want = load_classifier(ctx.paths["cls"], device="cpu").classify(text_args)
        got = data if isinstance(data, dict) else data[0]
        return None if got["label"] == want.label else f"label {got['label']} != API {want.label}"
    return check


def cli_cases() -> list[Case]:
    c: list[Case] = []
    # -- export --------------------------------------------------------------------------------------------------
    c += [
        cli("export-missing-source", ["export", "{missing}", "-o", "{out}"], "fail"),
        cli("export-source-is-a-file", ["export", "{text}", "-o", "{out}"], "refuse"),
        cli("export-no-out", ["export", "{ck}"], "usage"),
        cli("export-out-is-source", ["export", "{ck}", "-o", "{ck}", "--force"], "refuse"),
        cli("export-out-inside-source", ["export", "{ck}", "-o", "{ck}/sub"], "refuse"),
        cli("export-onto-earlier-output", ["export", "{ck}", "-o", "{earlier}"], "refuse"),
        cli("export-force-onto-earlier-output", ["export", "{ck}", "-o", "{earlier}", "--force"], "refuse"),
        cli("export-opset-16", ["export", "{ck}", "-o", "{out}", "--opset", "16"], "usage"),
        cli("export-opset-huge", ["export", "{ck}", "-o", "{out}", "--opset", "99999999999999999999"], "usage"),
        cli("export-graph-unknown", ["export", "{ck}", "-o", "{out}", "--graph", "paged"], "usage"),
        cli("export-task-unknown", ["export", "{ck}", "-o", "{out}", "--task", "ner"], "usage"),
        cli("export-head-without-task", ["export", "{clsck}", "-o", "{out}"], "usage"),
        cli("export-task-on-lm", ["export", "{ck}", "-o", "{out}", "--task", "entailment"], "refuse"),
        cli("export-special-token-no-equals", ["export", "{clsck}", "-o", "{out}", "--task", "entailment",
                                               "--special-token", "extract"], "usage"),
        cli("export-special-token-bad-role", ["export", "{clsck}", "-o", "{out}", "--task", "entailment",
                                              "--special-token", "middle=<extract>"], "usage"),
        cli("export-special-token-unknown-text", ["export", "{clsck}", "-o", "{out}", "--task", "entailment",
                                                  "--special-token", "extract=<nope>"], "refuse"),
        cli("export-special-token-id-out-of-vocab", ["export", "{clsck}", "-o", "{out}", "--task", "entailment",
                                                     "--special-token", "extract=99999999"], "refuse"),
        cli("export-delimiter-equals-extract", ["export", "{clsck}", "-o", "{out}", "--task", "entailment",
                                                "--special-token", "delimiter=<extract>"], "refuse"),
        cli("export-special-token-without-task", ["export", "{ck}", "-o", "{out}", "--special-token",
                                                  "extract=<|endoftext|>"], "usage"),
        cli("export-device-option", ["export", "{ck}", "-o", "{out}", "--device", "cpu"], "usage"),
        cli("export-revision-on-local", ["export", "{ck}", "-o", "{out}", "--revision", "main"], "refuse"),
        cli("export-kv-buffer-openai-gpt-task", ["export", "{clsck}", "-o", "{out}", "--task", "entailment",
                                                 "--graph", "kv_buffer"], "refuse"),
        cli("export-head-as-lm", ["export", "{clsck}", "-o", "{out}", "--task", "lm"], "ok", dir_verifies("fp32"),
            timeout_s=120),
        cli("export-llama-kv-buffer", ["export", "{llama_src}", "-o", "{out}", "--graph", "kv_buffer"], "ok",
            dir_verifies("fp32"), timeout_s=180),
    ]
    # -- quantize: every method and the options that do nothing for it -------------------------------------------
    q = ["quantize", "{lm}", "-o", "{out}"]
    c += [
        cli("quantize-no-method", q, "usage"),
        cli("quantize-method-unknown", [*q, "--method", "int3"], "usage"),
        cli("quantize-already-quantized", ["quantize", "{dyn}", "-o", "{out}", "--method", "dynamic"], "fail"),
        cli("quantize-classifier-dir-lm-options", ["quantize", "{cls}", "-o", "{out}", "--method", "dynamic",
                                                   "--kv-cache", "int8"], "refuse"),
        cli("quantize-onto-source", ["quantize", "{lm}", "-o", "{lm}", "--method", "dynamic", "--force"], "refuse"),
        cli("quantize-onto-earlier-output", [*q[:3], "{earlier}", "--method", "dynamic"], "refuse"),
        cli("quantize-mobile-pack", ["quantize", "{mob}", "-o", "{out}", "--method", "dynamic"], "fail"),
        cli("quantize-missing-dir", ["quantize", "{missing}", "-o", "{out}", "--method", "dynamic"], "fail"),
        cli("quantize-hf-checkpoint", ["quantize", "{ck}", "-o", "{out}", "--method", "dynamic"], "fail"),
        cli("quantize-static-no-calibration", [*q, "--method", "static"], "usage"),
        cli("quantize-static-binary-calibration", [*q, "--method", "static", "--calibration", "{binary}"], "refuse"),
        cli("quantize-static-empty-calibration", [*q, "--method", "static", "--calibration", "{empty}"], "refuse"),
        cli("quantize-static-one-word-calibration", [*q, "--method", "static", "--calibration", "{one_word}"],
            "refuse"),
        cli("quantize-static-huge-sequences", [*q, "--method", "static", "--calibration", "{calib}",
                                               "--calibration-sequences", "100000"], "refuse", timeout_s=60),
        cli("quantize-calibration-sequences-0", [*q, "--method", "static", "--calibration", "{calib}",
                                                 "--calibration-sequences", "0"], "usage"),
        cli("quantize-calibration-length-1", [*q, "--method", "static", "--calibration", "{calib}",
                                              "--calibration-length", "1"], "usage"),
        cli("quantize-calibration-length-past-context", [*q, "--method", "static", "--calibration", "{calib}",
                                                         "--calibration-length", "100000"], "refuse"),
        cli("quantize-dynamic-with-calibration", [*q, "--method", "dynamic", "--calibration", "{calib}"], "usage"),
        cli("quantize-weight-only-per-tensor", [*q, "--method", "weight-only", "--per-tensor"], "usage"),
        cli("quantize-weight-only-per-channel", [*q, "--method", "weight-only", "--per-channel"], "usage"),
        cli("quantize-dynamic-bits-4", [*q, "--method", "dynamic", "--bits", "4"], "usage"),
        cli("quantize-dynamic-block-size", [*q, "--method", "dynamic", "--block-size", "64"], "usage"),
        cli("quantize-dynamic-symmetric", [*q, "--method", "dynamic", "--symmetric"], "usage"),
        cli("quantize-dynamic-awq", [*q, "--method", "dynamic", "--awq"], "usage"),
        cli("quantize-fp16-per-tensor", [*q, "--method", "fp16", "--per-tensor"], "usage"),
        cli("quantize-fp16-reduce-range", [*q, "--method", "fp16", "--reduce-range"], "usage"),
        cli("quantize-static-reduce-range", [*q, "--method", "static", "--calibration", "{calib}",
                                             "--reduce-range"], "usage"),
        cli("quantize-weight-only-8bit-symmetric", [*q, "--method", "weight-only", "--bits", "8", "--symmetric"],
            "usage"),
        cli("quantize-weight-only-8bit-keep-8bit", [*q, "--method", "weight-only", "--bits", "8", "--keep-8bit",
                                                    "*"], "usage"),
        cli("quantize-keep-8bit-star", [*q, "--method", "weight-only", "--bits", "4", "--keep-8bit", "*"],
            "refuse"),
        cli("quantize-keep-8bit-matches-nothing", [*q, "--method", "weight-only", "--bits", "4", "--keep-8bit",
                                                   "no.such.linear"], "refuse"),
        cli("quantize-block-size-3", [*q, "--method", "weight-only", "--block-size", "3"], "usage"),
        cli("quantize-block-size-0", [*q, "--method", "weight-only", "--block-size", "0"], "usage"),
        cli("quantize-accuracy-level-9", [*q, "--method", "weight-only", "--accuracy-level", "9"], "usage"),
        cli("quantize-quantize-head-on-lm", [*q, "--method", "dynamic", "--quantize-head"], "usage"),
        cli("quantize-attention-weight-only", [*q, "--method", "weight-only", "--quantize-attention"], "refuse"),
        cli("quantize-attention-fused-graph", [*q, "--method", "static", "--calibration", "{calib}",
                                               "--quantize-attention"], "refuse"),
        cli("quantize-kv-cache-standard-graph", [*q, "--kv-cache", "fp16"], "usage"),
        cli("quantize-kv-int8-no-calibration", ["quantize", "{kvb}", "-o", "{out}", "--kv-cache", "int8"], "usage"),
        cli("quantize-max-kl-negative", [*q, "--max-kl", "-1"], "usage"),
        cli("quantize-max-kl-nan", [*q, "--max-kl", "nan"], "usage"),
        cli("quantize-max-kl-with-method", [*q, "--max-kl", "0.1", "--method", "dynamic"], "usage"),
        cli("quantize-prefer-without-max-kl", [*q, "--method", "dynamic", "--prefer", "size"], "usage"),
        cli("quantize-dynamic-per-tensor-ok", [*q, "--method", "dynamic", "--per-tensor"], "ok",
            dir_verifies("int8"), timeout_s=120),
        cli("quantize-dynamic-reduce-range-ok", [*q, "--method", "dynamic", "--reduce-range"], "ok",
            dir_verifies("int8"), timeout_s=120),
        cli("quantize-w4-symmetric-ok", [*q, "--method", "weight-only", "--bits", "4", "--symmetric"], "ok",
            dir_verifies(), timeout_s=120),
        cli("quantize-w4-keep-8bit-ok", [*q, "--method", "weight-only", "--bits", "4", "--keep-8bit", "*.0.*"],
            "ok", dir_verifies(), timeout_s=120),
        cli("quantize-w8-accuracy-0-ok", [*q, "--method", "weight-only", "--accuracy-level", "0"], "ok",
            dir_verifies(), timeout_s=120),
        cli("quantize-static-ok", [*q, "--method", "static", "--calibration", "{calib}", "--calibration-sequences",
                                   "4"], "ok", dir_verifies("int8"), timeout_s=180),
        cli("quantize-fp16-ok", [*q, "--method", "fp16"], "ok", dir_verifies("fp16"), timeout_s=120),
        cli("quantize-kv-fp16-ok", ["quantize", "{kvb}", "-o", "{out}", "--kv-cache", "fp16"], "ok",
            dir_verifies(), timeout_s=120),
        cli("quantize-classifier-dynamic-ok", ["quantize", "{cls}", "-o", "{out}", "--method", "dynamic",
                                               "--quantize-head"], "ok", timeout_s=120),
    ]
    # -- generate --------------------------------------------------------------------------------------------------
    g = ["generate", "{lm}", "-p"]
    c += [
        cli("generate-no-prompt", ["generate", "{lm}"], "usage"),
        cli("generate-empty-prompt", [*g, ""], "usage"),
        cli("generate-n-0", [*g, "Hi", "-n", "0"], "usage"),
        cli("generate-n-negative", [*g, "Hi", "-n", "-5"], "usage"),
        cli("generate-n-float", [*g, "Hi", "-n", "2.5"], "usage"),
        cli("generate-n-huge-standard", [*g, "Hi", "-n", "1000000000", "--json", "--greedy"], "ok",
            json_out(stops_at_context)),
        cli("generate-n-huge-kv-buffer", ["generate", "{kvb}", "-p", "Hi", "-n", "1000000000", "--json", "--greedy"],
            "ok", json_out(stops_at_context)),
        cli("generate-n-overflow", [*g, "Hi", "-n", "99999999999999999999999", "--json", "--greedy"], "ok",
            json_out(stops_at_context)),
        cli("generate-temperature-nan", [*g, "Hi", "--temperature", "nan"], "usage"),
        cli("generate-temperature-inf", [*g, "Hi", "--temperature", "inf"], "usage"),
        cli("generate-temperature-negative", [*g, "Hi", "--temperature", "-0.1"], "usage"),
        cli("generate-top-p-0", [*g, "Hi", "--top-p", "0"], "usage"),
        cli("generate-top-p-1.5", [*g, "Hi", "--top-p", "1.5"], "usage"),
        cli("generate-top-k-negative", [*g, "Hi", "--top-k", "-1"], "usage"),
        cli("generate-repetition-penalty-0", [*g, "Hi", "--repetition-penalty", "0"], "usage"),
        cli("generate-seed-negative", [*g, "Hi", "--seed", "-1"], "usage"),
        cli("generate-stop-empty", [*g, "Hi", "--stop", ""], "usage"),
        cli("generate-num-beams-0", [*g, "Hi", "--num-beams", "0"], "usage"),
        cli("generate-beams-with-sampling", [*g, "Hi", "--num-beams", "2", "--temperature", "0.5"], "usage"),
        cli("generate-beams-with-stop", [*g, "Hi", "--num-beams", "2", "--stop", "x"], "usage"),
        cli("generate-return-more-than-beams", [*g, "Hi", "--num-beams", "2", "--num-return-sequences", "3"],
            "usage"),
        cli("generate-return-sequences-without-beams", [*g, "Hi", "--num-return-sequences", "2"], "usage"),
        cli("generate-prompt-past-context", [*g, "word " * 300], "usage"),
        cli("generate-prompt-exactly-context", [*g, " a" * 128, "-n", "1"], "usage"),
        cli("generate-prompt-one-under-context", [*g, " a" * 127, "-n", "5", "--json", "--greedy"], "ok",
            json_out(lambda d, ctx: None if len(d["ids"]) == 1 and d["stop"] == "context" else str(d)[:100])),
        cli("generate-classifier-dir", ["generate", "{cls}", "-p", "Hi"], "refuse"),
        cli("generate-mobile-pack-ok", ["generate", "{mob}", "-p", "Hi", "-n", "3", "--greedy"], "ok",
            greedy_matches_api("lm", "Hi", 3)),
        cli("generate-missing-dir", ["generate", "{missing}", "-p", "Hi"], "fail"),
        cli("generate-file-as-dir", ["generate", "{text}", "-p", "Hi"], "fail"),
        cli("generate-hf-checkpoint-dir", ["generate", "{ck}", "-p", "Hi"], "refuse"),
        cli("generate-device-tpu", [*g, "Hi", "--device", "tpu"], "usage"),
        cli("generate-threads-0", [*g, "Hi", "--threads", "0"], "usage"),
        cli("generate-greedy-oracle", [*g, "It is a truth", "-n", "8", "--greedy"], "ok",
            greedy_matches_api("lm", "It is a truth", 8)),
        cli("generate-greedy-kv-buffer-oracle", ["generate", "{kvb}", "-p", "It is a truth", "-n", "8", "--greedy"],
            "ok", greedy_matches_api("lm", "It is a truth", 8)),
        cli("generate-unicode-prompt", [*g, "naïve café – 日本語 🙂", "-n", "3", "--greedy"], "ok",
            greedy_matches_api("lm", "naïve café – 日本語 🙂", 3)),
        cli("generate-control-chars", [*g, "a\x00b\x1bc", "-n", "2", "--greedy"], "ok",
            greedy_matches_api("lm", "a\x00b\x1bc", 2)),
        cli("generate-llama-greedy", ["generate", "{llama}", "-p", "It is", "-n", "6", "--greedy"], "ok",
            greedy_matches_api("llama", "It is", 6)),
        cli("generate-beams-ok", [*g, "Hi", "--num-beams", "2", "--num-return-sequences", "2", "-n", "3"], "ok"),
        cli("generate-json-ok", [*g, "Hi", "-n", "2", "--json", "--greedy"], "ok",
            json_out(lambda d, ctx: None if len(d["ids"]) == 2 else str(d)[:80])),
    ]
    # -- eval ------------------------------------------------------------------------------------------------------
    e = ["eval", "{lm}", "--text"]
    c += [
        cli("eval-no-text", ["eval", "{lm}"], "usage"),
        cli("eval-missing-text", [*e, "{missing}"], "refuse"),
        cli("eval-empty-text", [*e, "{empty}"], "refuse"),
        cli("eval-one-token", [*e, "{one_word}"], "refuse"),
        cli("eval-binary-text", [*e, "{binary}"], "refuse"),
        cli("eval-dir-as-text", [*e, "{lm}"], "usage"),
        cli("eval-stride-0", [*e, "{text}", "--stride", "0"], "usage"),
        cli("eval-stride-past-context", [*e, "{text}", "--stride", "129"], "refuse"),
        cli("eval-classifier", ["eval", "{cls}", "--text", "{text}"], "refuse"),
        cli("eval-oracle", [*e, "{text}", "--json"], "ok", json_out(perplexity_matches_api("text"))),
        cli("eval-stride-at-context-oracle", [*e, "{text}", "--stride", "128", "--json"], "ok",
            json_out(perplexity_matches_api("text", 128))),
        cli("eval-stride-1-oracle", [*e, "{u2028}", "--stride", "1", "--json"], "ok",
            json_out(perplexity_matches_api("u2028", 1))),
    ]
    # -- compare and bench -----------------------------------------------------------------------------------------
    c += [
        cli("compare-no-text", ["compare", "{lm}", "{dyn}"], "usage"),
        cli("compare-empty-text", ["compare", "{lm}", "{dyn}", "--text", "{empty}"], "refuse"),
        cli("compare-binary-text", ["compare", "{lm}", "{dyn}", "--text", "{binary}"], "refuse"),
        cli("compare-max-tokens-1", ["compare", "{lm}", "{dyn}", "--text", "{text}", "--max-tokens", "1"], "usage"),
        cli("compare-prompts-0", ["compare", "{lm}", "{dyn}", "--text", "{text}", "--prompts", "0"], "usage"),
        cli("compare-different-vocab", ["compare", "{lm}", "{llama}", "--text", "{text}"], "refuse"),
        cli("compare-classifier-with-text", ["compare", "{cls}", "--text", "{text}"], "refuse"),
        cli("compare-labelled-lm", ["compare", "{lm}", "--labelled", "{jsonl}"], "refuse"),
        cli("compare-labelled-bad-line", ["compare", "{cls}", "--labelled", "{jsonl_bad_line}"], "refuse",
            lambda r, ctx: None if "line 2" in r.stderr else "the error does not name line 2"),
        cli("compare-labelled-unknown-label", ["compare", "{cls}", "--labelled", "{jsonl_unknown_label}"], "refuse"),
        cli("compare-labelled-empty", ["compare", "{cls}", "--labelled", "{jsonl_empty}"], "refuse"),
        cli("compare-labelled-and-text", ["compare", "{cls}", "--labelled", "{jsonl}", "--text", "{text}"], "usage"),
        cli("compare-markdown-onto-input", ["compare", "{lm}", "{dyn}", "--text", "{text}", "--markdown",
                                            "{text}", "--max-tokens", "64", "--prompts", "1"], "refuse"),
        cli("compare-peer-unknown", ["compare", "{lm}", "--text", "{text}", "--peers", "vllm"], "usage"),
        cli("compare-u2028-labelled-ok", ["compare", "{cls}", "--labelled", "{jsonl}", "--json"], "ok"),
        cli("bench-no-models", ["bench"], "usage"),
        cli("bench-batch-0", ["bench", "{lm}", "--batch", "0"], "usage"),
        cli("bench-context-past", ["bench", "{lm}", "--context", "100000", "--repeat", "1"], "refuse"),
        cli("bench-prompt-past-context", ["bench", "{lm}", "--prompt", "200", "--new", "2", "--repeat", "1"],
            "refuse"),
        cli("bench-classifier", ["bench", "{cls}", "--repeat", "1"], "refuse"),
        cli("bench-missing", ["bench", "{missing}"], "fail"),
        cli("bench-peer-unknown", ["bench", "{lm}", "--peers", "vllm"], "usage"),
        cli("bench-ok", ["bench", "{lm}", "--prompt", "4", "--new", "4", "--repeat", "1", "--json"], "ok",
            json_out(lambda d, ctx: None if d else "no rows")),
    ]
    # -- info, verify ----------------------------------------------------------------------------------------------
    c += [
        cli("info-missing", ["info", "{missing}"], "fail"),
        cli("info-file", ["info", "{text}"], "fail"),
        cli("info-empty-dir", ["info", "{tmp}"], "fail"),
        cli("info-lm", ["info", "{lm}"], "ok", info_is_manifest("lm")),
        cli("info-classifier", ["info", "{cls}"], "ok", info_is_manifest("cls")),
        cli("info-mobile", ["info", "{mob}"], "ok", info_is_manifest("mob")),
        cli("info-llama", ["info", "{llama}"], "ok", info_is_manifest("llama")),
        cli("verify-missing", ["verify", "{missing}"], "fail"),
        cli("verify-empty-dir", ["verify", "{tmp}"], "fail"),
        cli("verify-checkpoint", ["verify", "{ck}"], "fail"),
        *[cli(f"verify-{m}-ok", ["verify", "{" + m + "}"], "ok") for m in ("lm", "kvb", "dyn", "w4", "llama", "cls",
                                                                            "mob")],
    ]
    # -- pack ------------------------------------------------------------------------------------------------------
    c += [
        cli("pack-no-target", ["pack", "{lm}", "-o", "{out}"], "usage"),
        cli("pack-web-platform", ["pack", "{lm}", "--target", "web", "-o", "{out}", "--platform", "arm"], "usage"),
        cli("pack-mobile-no-page", ["pack", "{lm}", "--target", "mobile", "-o", "{out}", "--no-page"], "usage"),
        cli("pack-onto-input", ["pack", "{lm}", "--target", "mobile", "-o", "{lm}", "--force"], "refuse"),
        cli("pack-onto-earlier", ["pack", "{lm}", "--target", "mobile", "-o", "{earlier}"], "refuse"),
        cli("pack-web-mobile-dir", ["pack", "{mob}", "--target", "web", "-o", "{out}", "--no-page"], "fail"),
        cli("pack-mobile-mobile-dir", ["pack", "{mob}", "--target", "mobile", "-o", "{out}"], "fail"),
        cli("pack-web-two-checkpoints", ["pack", "{lm}", "{llama}", "--target", "web", "-o", "{out}", "--no-page"],
            "refuse"),
        # same shape, config and tokenizer, other weights (other recorded checkpoint hashes): refused, not one site
        cli("pack-web-same-shape-two-checkpoints", ["pack", "{lm}", "{otherdyn}", "--target", "web", "-o", "{out}",
                                                    "--no-page"], "refuse"),
        cli("pack-web-same-dir-twice", ["pack", "{lm}", "{lm}", "--target", "web", "-o", "{out}", "--no-page"],
            "refuse"),
        cli("pack-mobile-two-dirs", ["pack", "{lm}", "{dyn}", "--target", "mobile", "-o", "{out}"], "refuse"),
        cli("pack-checkpoint", ["pack", "{ck}", "--target", "web", "-o", "{out}", "--no-page"], "fail"),
        cli("pack-classifier-web", ["pack", "{cls}", "--target", "web", "-o", "{out}", "--no-page"], "refuse"),
        cli("pack-web-ok", ["pack", "{lm}", "{dyn}", "--target", "web", "-o", "{out}", "--no-page"], "ok",
            timeout_s=120),
        cli("pack-mobile-ok", ["pack", "{w4}", "--target", "mobile", "-o", "{out}"], "ok", timeout_s=120),
    ]
    # -- classify --------------------------------------------------------------------------------------------------
    pair = ("A man sleeps.", "A person rests.")
    k = ["classify", "{cls}"]
    c += [
        cli("classify-no-input", k, "usage"),
        cli("classify-text-for-entailment", [*k, "just one text"], "usage"),
        cli("classify-empty-text", [*k, ""], "usage"),
        cli("classify-pair-and-text", [*k, "x", "--pair", "a", "b"], "usage"),
        cli("classify-choice-for-entailment", [*k, "x", "--choice", "a", "--choice", "b"], "usage"),
        cli("classify-pair-empty-oracle", [*k, "--pair", "", "", "--json"], "ok",
            json_out(classify_matches_api(("", "")))),  # the template's own tokens around empty texts: a valid row
        cli("classify-batch-0", [*k, "--pair", "a", "b", "--batch-size", "0"], "usage"),
        cli("classify-jsonl-missing", [*k, "--jsonl", "{missing}"], "refuse"),
        cli("classify-jsonl-binary", [*k, "--jsonl", "{binary}"], "refuse"),
        cli("classify-jsonl-bad-line", [*k, "--jsonl", "{jsonl_bad_line}"], "refuse",
            lambda r, ctx: None if "line 2" in r.stderr else "the error does not name line 2"),
        cli("classify-jsonl-missing-field", [*k, "--jsonl", "{jsonl_missing_field}"], "refuse"),
        cli("classify-jsonl-array", [*k, "--jsonl", "{jsonl_array}"], "refuse"),
        cli("classify-jsonl-deep", [*k, "--jsonl", "{jsonl_deep}"], "refuse"),
        cli("classify-jsonl-empty", [*k, "--jsonl", "{jsonl_empty}"], "refuse"),
        cli("classify-jsonl-blank-lines", [*k, "--jsonl", "{jsonl_blank_lines}"], "refuse"),
        cli("classify-lm-dir", ["classify", "{lm}", "hello"], "refuse"),
        cli("classify-pair-past-context", [*k, "--pair", "word " * 100, "word " * 100], "refuse"),
        cli("classify-pair-oracle", [*k, "--pair", *pair, "--json"], "ok", json_out(classify_matches_api(pair))),
        cli("classify-jsonl-u2028-ok", [*k, "--jsonl", "{jsonl}", "--json"], "ok",
            lambda r, ctx: None if len(r.stdout.strip().split("\n")) == 3 else f"{r.stdout[:100]!r}"),
    ]
    # -- serve's options (refused before it serves; exit 2 with the range) --------------------------------------
    s = ["serve", "{lm}", "--port", "0"]
    c += [
        cli("serve-port-negative", ["serve", "{lm}", "--port", "-1"], "usage"),
        cli("serve-port-70000", ["serve", "{lm}", "--port", "70000"], "usage"),
        cli("serve-max-batch-0", [*s, "--max-batch", "0"], "usage"),
        cli("serve-max-body-small", [*s, "--max-body", "10"], "usage"),
        cli("serve-max-tokens-limit-0", [*s, "--max-tokens-limit", "0"], "usage"),
        cli("serve-queue-negative", [*s, "--max-queue", "-1"], "usage"),
        cli("serve-web-missing-folder", [*s, "--web", "{missing}"], "refuse"),
        cli("serve-missing-dir", ["serve", "{missing}", "--port", "0"], "fail"),
        cli("serve-checkpoint", ["serve", "{ck}", "--port", "0"], "refuse"),
        cli("serve-host-bad", [*s, "--host", "999.1.1.1"], "refuse"),
    ]
    return c


# -- tampered model dirs: adversarial_dirs.py's 19 plus these, each refused --------------------------------------
def _truncate(name: str, keep: int):
    def apply(d: Path) -> None:
        raw = (d / name).read_bytes()
        (d / name).write_bytes(raw[:keep])
    return apply


def _remove(name: str):
    return lambda d: (d / name).unlink()


MORE_BREAKAGES = [
    ("manifest-not-json", "lm", write(MANIFEST, "{nope")),
    ("manifest-empty", "lm", write(MANIFEST, "")),
    ("manifest-a-list", "lm", write(MANIFEST, "[]")),
    ("manifest-format-99", "lm", edit(MANIFEST, lambda m: m.update(format=99))),
    ("manifest-unknown-precision", "lm", edit(MANIFEST, lambda m: m.update(precision="int3"))),
    ("manifest-context-doubled", "lm", edit(MANIFEST, lambda m: m["shape"].update(context_length=256))),
    ("manifest-vocab-edited", "lm", edit(MANIFEST, lambda m: m["shape"].update(vocab_size=100))),
    ("manifest-graph-claims-kv-buffer", "lm", edit(MANIFEST, lambda m: m.update(graph="kv_buffer"))),
    ("model-truncated", "lm", _truncate("model.onnx", 1000)),
    ("model-empty", "lm", _truncate("model.onnx", 0)),
    ("model-removed", "lm", _remove("model.onnx")),
    ("tokenizer-not-json", "lm", write("tokenizer.json", "{nope")),
    ("tokenizer-removed", "lm", _remove("tokenizer.json")),
    ("tokenizer-other-vocab", "lm", lambda d: (d / "tokenizer.json").write_bytes(
        (Path(d).parents[2] / "inputs" / "llama" / "tokenizer.json").read_bytes())),
    ("genai-not-json", "lm", write("genai_config.json", "{")),
    ("tokenizer-config-not-json", "lm", write("tokenizer_config.json", "nope")),
    ("config-id2label-extra", "classifier", edit("config.json", lambda c: c.update(
        id2label={**c.get("id2label", {}), "7": "other"}))),
    ("w4-flipped-byte", "w4", flip_byte),
    ("kvb-flipped-byte", "kvb", flip_byte),
    ("chat-template-broken", "llama", write("chat_template.jinja", "{% for m in messages %}{{ m.content ")),
    ("llama-eos-edited", "llama", edit(MANIFEST, lambda m: m.update(eos_token_id=5) if "eos_token_id" in m
                                       else m["tokens"].update(eos_id=5) if "tokens" in m else m.update(eos_id=5))),
]
SOURCE_OF = {"lm": "lm", "dynamic": "dyn", "w4": "w4", "classifier": "cls", "kvb": "kvb", "llama": "llama"}
COMMANDS = {"verify": ["verify", "{d}"], "generate": ["generate", "{d}", "-p", "Hi", "-n", "2"],
            "pack": ["pack", "{d}", "--target", "mobile", "-o", "{out}"],
            "classify": ["classify", "{d}", "--pair", "a", "b"], "info": ["info", "{d}"]}


def tampered(cid: str, source: str, breakage, args: list[str]) -> Case:
    """A copy of the model dir `source` broken by `breakage` (in the case's scratch dir, as {d}), then `args`."""
    return Case(cid, args[0], "tampered", list(args), "refuse", timeout_s=120,
                extra={"source": SOURCE_OF[source], "breakage": breakage})


def dir_cases() -> list[Case]:
    cases = [tampered(f"dir-{name}-{command[0]}" + (f"-{command[3]}" if command[0] == "pack" else ""), kind, breakage,
                      command) for name, kind, breakage, command in DIR_CASES]
    for name, kind, breakage in MORE_BREAKAGES:
        verbs = ["verify", "classify"] if kind == "classifier" else ["verify", "generate", "pack"]
        cases += [tampered(f"dir-{name}-{v}", kind, breakage, COMMANDS[v]) for v in verbs]
    return cases
