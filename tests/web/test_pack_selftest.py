"""The golden self-test's cases (pack/selftest.py) on a tiny model, without the web clients: the greedy ids are
generate()'s, the top logits are the teacher-forced run's best, and a dir without a tokenizer gets id prompts.
(The replay on a device: test_web_node.py, test_web_browser.py.)"""

from __future__ import annotations

import numpy as np

from gptedge.pack.selftest import NEW_TOKENS, PROMPTS, TOP_K, golden_cases
from gptedge.runtime import load

from ..support.checkpoints import tiny_reference, write_checkpoint


def test_cases_are_generates_greedy_run_and_its_top_logits(gpt2_model_dir):
    cases = golden_cases(gpt2_model_dir)
    model = load(gpt2_model_dir, device="cpu")
    assert [c["prompt"] for c in cases] == list(PROMPTS)
    for c in cases:
        want = model.generate(c["prompt"], max_new_tokens=NEW_TOKENS, greedy=True)
        assert (c["prompt_ids"], c["ids"]) == (want.prompt_ids, want.ids)
        assert len(c["top"]) == len(c["ids"]) and all(len(step) == TOP_K for step in c["top"])
        # the last step's logits, from a run over the whole sequence: (1, P + N - 1, V)
        ids = np.array([c["prompt_ids"] + c["ids"][:-1]])
        row = model.forward(ids, np.ones_like(ids), np.arange(ids.shape[1])[None], model.empty_past(1))[0][0, -1]
        assert [i for i, _ in c["top"][-1]] == list(np.argsort(-row, kind="stable")[:TOP_K])
        np.testing.assert_allclose([v for _, v in c["top"][-1]], np.sort(row)[::-1][:TOP_K], atol=1e-6)


def test_a_dir_without_a_tokenizer_gets_id_prompts(tmp_path):
    from gptedge.export.exporter import export_checkpoint

    ck = write_checkpoint(tiny_reference("gpt2"), tmp_path / "ck", tokenizer=False)
    export_checkpoint(ck, tmp_path / "dir", validate=False)
    cases = golden_cases(tmp_path / "dir")
    assert [len(c["prompt_ids"]) for c in cases] == [max(1, len(p) // 4) for p in PROMPTS]
    assert all(len(c["ids"]) == NEW_TOKENS for c in cases)
