"""quantize --max-kl: candidates tried by estimated bytes, the first within the budget (confirmed held out) written
with the search in its manifest, or with --prefer speed the fastest of those within it, timed here; a budget nothing
meets is a one-line error naming the closest candidate."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gptedge.cli import main
from gptedge.quantize import recipe_search as rs
from gptedge.runtime import load
from gptedge.runtime.errors import QuantizationError
from gptedge.runtime.modeldir.manifest import ModelShape, read_manifest
from gptedge.runtime.modeldir.recipe import QuantizeRecipe

pytestmark = pytest.mark.slow  # each search quantizes and scores several recipes

CALIBRATION = "samples/calibration/emma_ch1-4.txt"
TWO = (("--bits 4", dict(bits=4)), ("--bits 8 --awq", dict(bits=8, awq=True)))


def test_candidates_are_ordered_by_estimated_bytes():
    shape = ModelShape(arch="gpt2", n_layer=12, n_head=12, head_dim=64, vocab_size=50257, context_length=1024)
    order = sorted(rs.CANDIDATES, key=lambda c: rs.estimated_bytes(QuantizeRecipe("weight-only", **c[1]), shape))
    assert [o for o, _ in order] == [o for o, _ in rs.CANDIDATES]  # the table is written smallest first
    four, eight = (rs.estimated_bytes(QuantizeRecipe("weight-only", bits=b), shape) for b in (4, 8))
    assert 0.5 < four / eight < 0.75  # 4-bit linears, the 8-bit tied embedding


def test_prefer_speed_adds_the_wider_blocks():
    wider = [o for o, f in rs.SPEED_CANDIDATES if f.get("block_size", 32) > 32]
    assert {o.split()[-1] for o in wider} == {"64", "128"} and {o.split()[1] for o in wider} == {"4", "8"}
    assert {o for o, _ in rs.CANDIDATES} < {o for o, _ in rs.SPEED_CANDIDATES}


def test_split_text_cuts_at_a_paragraph():
    text = "\n\n".join(f"paragraph {i} " + "word " * 20 for i in range(20))
    a, b = rs.split_text(text)
    assert a + b == text and b.startswith("\n\n") and 0.6 < len(a) / len(text) < 0.8


@pytest.fixture(autouse=True)
def few_tokens(monkeypatch):
    monkeypatch.setattr(rs, "MAX_TOKENS", 256)  # two windows a part on the tiny model: enough to rank, quick


def test_a_loose_budget_takes_the_smallest_and_records_the_search(gpt2_model_dir, tmp_path):
    result = CliRunner().invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q"), "--max-kl", "10",
                                       "--calibration", CALIBRATION, "--prefer", "size"])
    assert result.exit_code == 0, result.output
    m = read_manifest(tmp_path / "q")
    s = m.quantization.search
    assert s.chosen == "--bits 4 --gptq" and len(s.candidates) == 1 and s.max_kl == 10
    assert s.prefer == "size"  # the one preference offered (nothing is timed), recorded as given
    assert (m.quantization.bits, m.quantization.awq, m.quantization.gptq) == (4, False, True)
    c = s.candidates[0]
    assert 0 < c.kl_calibration <= 10 and c.kl_held_out is not None and c.size_bytes > 0
    assert s.calibration_tokens == s.held_out_tokens == 256  # each part capped at MAX_TOKENS
    load(tmp_path / "q", device="cpu")  # the manifest (rewritten with the search) still matches its files
    assert not list(Path(tmp_path).glob(".max-kl-*"))  # the scratch candidates are gone


def test_a_budget_below_4bit_skips_to_8bit(gpt2_model_dir, tmp_path):
    first = rs.search_recipe(gpt2_model_dir, tmp_path / "a", 10.0, Path(CALIBRATION).read_text(), candidates=TWO)
    k4 = first.quantization.search.candidates[0].kl_calibration
    m = rs.search_recipe(gpt2_model_dir, tmp_path / "b", k4 / 2, Path(CALIBRATION).read_text(), candidates=TWO)
    s = m.quantization.search
    assert [c.options for c in s.candidates] == ["--bits 4", "--bits 8 --awq"]
    assert s.candidates[0].kl_calibration > k4 / 2 and s.candidates[0].kl_held_out is None  # not confirmed: over K
    assert s.chosen == "--bits 8 --awq" and (m.quantization.bits, m.quantization.awq) == (8, True)
    assert s.candidates[1].size_bytes > s.candidates[0].size_bytes


def test_a_budget_far_below_a_width_skips_the_rest_of_it(gpt2_model_dir, tmp_path):
    three = (TWO[0], ("--bits 4 --block-size 16", dict(bits=4, block_size=16)), TWO[1])
    first = rs.search_recipe(gpt2_model_dir, tmp_path / "a", 10.0, Path(CALIBRATION).read_text(), candidates=TWO)
    k4 = first.quantization.search.candidates[0].kl_calibration
    m = rs.search_recipe(gpt2_model_dir, tmp_path / "b", k4 / (2 * rs.FAR), Path(CALIBRATION).read_text(),
                         candidates=three)
    assert [c.options for c in m.quantization.search.candidates] == ["--bits 4", "--bits 8 --awq"]


def test_a_budget_nothing_meets_names_the_closest(gpt2_model_dir, tmp_path):
    with pytest.raises(QuantizationError, match=r"no recipe meets --max-kl 1e-12: the closest is `--bits 8"):
        rs.search_recipe(gpt2_model_dir, tmp_path / "q", 1e-12, Path(CALIBRATION).read_text(), candidates=TWO)
    assert not (tmp_path / "q").exists() and not list(Path(tmp_path).glob(".max-kl-*"))


def test_cli_refusals(gpt2_model_dir, tmp_path):
    runner = CliRunner()
    for args, message, code in [
        (["--max-kl", "0.001"], "--max-kl needs --calibration TEXT_FILE", 2),
        (["--max-kl", "0.001", "--method", "weight-only", "--calibration", CALIBRATION], "give it no --method", 2),
        (["--max-kl", "-1", "--calibration", CALIBRATION], "--max-kl must be a positive KL", 2),
        (["--max-kl", "0.001", "--calibration", CALIBRATION, "--prefer", "fastest"], "Invalid value for '--prefer'", 2),
        (["--max-kl", "0.001", "--calibration", CALIBRATION, "--rotate-down"],
         "--rotate-down: --max-kl chooses the recipe itself", 2),
        (["--max-kl", "0.001", "--calibration", CALIBRATION, "--block-size", "64"],
         "--block-size: --max-kl chooses the recipe itself", 2),
        (["--max-kl", "0.001", "--calibration", CALIBRATION, "--per-tensor"],
         "--per-channel/--per-tensor: --max-kl chooses", 2),
    ]:
        result = runner.invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "x"), *args])
        assert result.exit_code == code and message in result.output, result.output
        assert result.output.strip().splitlines()[-1].startswith("Error: ") and not (tmp_path / "x").exists()


NARROW = (("--bits 4", dict(bits=4)), ("--bits 4 --block-size 16", dict(bits=4, block_size=16)))  # tiny: n_embd 32


def test_prefer_speed_times_every_candidate_within_the_budget_and_writes_the_fastest(gpt2_model_dir, tmp_path):
    result = CliRunner().invoke(main, ["quantize", str(gpt2_model_dir), "-o", str(tmp_path / "q"), "--max-kl", "10",
                                       "--calibration", CALIBRATION, "--prefer", "speed"])
    assert result.exit_code == 0, result.output
    s = read_manifest(tmp_path / "q").quantization.search
    assert s.prefer == "speed" and "tok/s here (the fastest of" in result.output
    timed = [c for c in s.candidates if c.decode_tok_s is not None]
    assert len(timed) >= 2 and all(c.kl_held_out is not None and c.kl_held_out <= 10 * rs.HELD_OUT_SLACK
                                   for c in timed)  # only candidates within the budget are timed
    assert s.chosen == max(timed, key=lambda c: c.decode_tok_s).options
    load(tmp_path / "q", device="cpu")
    assert not list(Path(tmp_path).glob(".max-kl-*"))


def test_prefer_speed_writes_the_fastest_even_when_it_is_larger(gpt2_model_dir, tmp_path, monkeypatch):
    rates = {}

    def timer(dirs, vocab, threads, rounds=rs.TIMING_ROUNDS):  # the larger dir (more bytes) is the faster one here
        sizes = [sum(f.stat().st_size for f in d.rglob("*")) for d in dirs]
        rates.update({d.name: float(size) for d, size in zip(dirs, sizes, strict=True)})
        return sizes

    monkeypatch.setattr(rs, "time_candidates", timer)
    m = rs.search_recipe(gpt2_model_dir, tmp_path / "q", 10.0, Path(CALIBRATION).read_text(), prefer="speed",
                         candidates=NARROW)
    s = m.quantization.search
    assert [c.options for c in s.candidates] == ["--bits 4", "--bits 4 --block-size 16"]  # smallest first
    assert s.chosen == "--bits 4 --block-size 16" and m.quantization.block_size == 16 and len(rates) == 2
    assert [c.decode_tok_s for c in s.candidates] == [rates["c0"], rates["c1"]]
    size = rs.search_recipe(gpt2_model_dir, tmp_path / "s", 10.0, Path(CALIBRATION).read_text(), candidates=NARROW)
    assert size.quantization.search.chosen == "--bits 4"  # --prefer size: the smallest


def test_prefer_speed_stops_past_the_bytes_cap(gpt2_model_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(rs, "time_candidates", lambda dirs, vocab, threads: [1.0] * len(dirs))
    text = Path(CALIBRATION).read_text()
    pair = (TWO[0], ("--bits 8 --block-size 16", dict(bits=8, block_size=16)))
    both = rs.search_recipe(gpt2_model_dir, tmp_path / "a", 10.0, text, prefer="speed", candidates=pair)
    assert len(both.quantization.search.candidates) == 2  # within the default cap of the 4-bit's bytes
    monkeypatch.setattr(rs, "SPEED_BYTES_CAP", 1.001)  # the tiny shape: 8-bit at 16 is ~1.02x the 4-bit's bytes
    m = rs.search_recipe(gpt2_model_dir, tmp_path / "q", 10.0, text, prefer="speed", candidates=pair)
    assert [c.options for c in m.quantization.search.candidates] == ["--bits 4"]  # past the cap: never quantized


def test_prefer_speed_skips_a_larger_candidate_of_a_block_size_already_within_k(gpt2_model_dir, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(rs, "time_candidates", lambda dirs, vocab, threads: [1.0] * len(dirs))
    m = rs.search_recipe(gpt2_model_dir, tmp_path / "q", 10.0, Path(CALIBRATION).read_text(), prefer="speed",
                         candidates=TWO)  # both at blocks of 32
    assert [c.options for c in m.quantization.search.candidates] == ["--bits 4"]
    k4 = m.quantization.search.candidates[0].kl_calibration
    tight = rs.search_recipe(gpt2_model_dir, tmp_path / "t", k4 / 2, Path(CALIBRATION).read_text(), prefer="speed",
                             candidates=TWO)  # the 4-bit is over K: the 8-bit one is tried and written
    assert tight.quantization.search.chosen == "--bits 8 --awq"


def test_at_equal_bytes_the_layout_without_the_rotation_is_tried_first(gpt2_model_dir, tmp_path, monkeypatch):
    """The rotated and the plain 8-bit layouts of one block size have the same bytes; the plain one (no extra ops) is
    tried first, and where it meets K the rotated one is not tried (the same kernel, three more ops a layer)."""
    monkeypatch.setattr(rs, "time_candidates", lambda dirs, vocab, threads: [1.0] * len(dirs))
    pair = (("--bits 8 --rotate-down --block-size 16", dict(bits=8, rotate_down=True, block_size=16)),
            ("--bits 8 --block-size 16", dict(bits=8, block_size=16)))
    text = Path(CALIBRATION).read_text()
    m = rs.search_recipe(gpt2_model_dir, tmp_path / "q", 10.0, text, prefer="speed", candidates=pair)
    assert [c.options for c in m.quantization.search.candidates] == ["--bits 8 --block-size 16"]
    tight = rs.search_recipe(gpt2_model_dir, tmp_path / "s", 10.0, text, candidates=pair)
    assert tight.quantization.search.chosen == "--bits 8 --block-size 16" and not tight.quantization.rotate_down
