"""The plain template: a GPT2ForSequenceClassification fine-tuned with transformers and no added tokens
(the text alone, the head on the last non-padding token, padding = config.json's pad_token_id) exports without
--special-token, and classify equals transformers on it, for several pad conventions; a head checkpoint exported
without --task is refused in one line, or exported as its LM with --task lm."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from ..support.checkpoints import GPT2_VOCAB, copy_gpt2_tokenizer
from ..support.task_checkpoints import make_checkpoint

pytestmark = pytest.mark.slow  # a fine-tuned transformers checkpoint exported through the command

TEXTS = ["A man sleeps.", "Nobody is awake, and the night is long", "Hi<|endoftext|>", "<|endoftext|>"]


def plain_checkpoint(out, pad):
    """transformers' own GPT2ForSequenceClassification, GPT-2's tokenizer alone (no token added or declared)."""
    extra = {} if pad is None else {"pad_token_id": pad}
    ck = make_checkpoint("gpt2-seq", out, declare=False, vocab_size=GPT2_VOCAB, **extra)
    if pad is None:
        import json
        config = json.loads((ck / "config.json").read_text())
        config.pop("pad_token_id", None)
        (ck / "config.json").write_text(json.dumps(config))
    (ck / "tokenizer.json").unlink()
    copy_gpt2_tokenizer(ck)
    return ck


@pytest.mark.parametrize("pad", [50256, 0, None], ids=["pad-is-eos", "pad-0", "no-pad"])
def test_classify_equals_transformers_on_a_plain_checkpoint(tmp_path, pad):
    import torch

    from gptedge.export.head_export import export_task
    from gptedge.runtime import load_classifier
    from gptedge.runtime.modeldir.tasks import READS_LAST, READS_LAST_NON_PAD

    from ..support.task_checkpoints import hf_model

    ck = plain_checkpoint(tmp_path / "ck", pad)
    manifest = export_task(ck, tmp_path / "out")
    t = manifest.task.transformation
    assert t.sequences == (("text",),) and t.special_roles() == ()
    assert t.reads == (READS_LAST if pad is None else READS_LAST_NON_PAD)
    clf = load_classifier(tmp_path / "out", device="cpu")
    model = hf_model(ck)
    got = clf.classify_batch(TEXTS)
    for text, result in zip(TEXTS, got, strict=True):
        ids = clf.tokenizer.encode(text, add_special_tokens=False).ids
        with torch.no_grad():
            want = torch.softmax(model(torch.tensor([ids])).logits[0].double(), -1).numpy()
        np.testing.assert_allclose(result.probabilities, want, atol=2e-5, err_msg=text)
    if pad is not None:  # transformers' own batch: right-padded with the pad id
        encoded = [clf.tokenizer.encode(x, add_special_tokens=False).ids for x in TEXTS]
        width = max(map(len, encoded))
        ids = torch.tensor([e + [pad] * (width - len(e)) for e in encoded])
        mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in encoded])
        with torch.no_grad():
            want = torch.softmax(model(ids, attention_mask=mask).logits.double(), -1).numpy()
        np.testing.assert_allclose([r.probabilities for r in got], want, atol=2e-5)


def test_a_head_checkpoint_without_task_is_refused_unless_task_lm(runner, tmp_path):
    from gptedge.cli import main

    ck = plain_checkpoint(tmp_path / "ck", 50256)
    done = runner.invoke(main, ["export", str(ck), "-o", str(tmp_path / "out")])
    assert done.exit_code == 2 and "is a GPT2ForSequenceClassification checkpoint" in done.stderr, done.output
    assert "--task lm" in done.stderr and not (tmp_path / "out").exists()
    done = runner.invoke(main, ["export", str(ck), "-o", str(tmp_path / "lm"), "--task", "lm"])
    assert done.exit_code == 0, done.output
    done = runner.invoke(main, ["export", str(ck), "-o", str(tmp_path / "clf"), "--task", "classification"])
    assert done.exit_code == 0, done.output
    shutil.rmtree(tmp_path / "lm")
