"""The original GPT's task heads at its real widths (768 wide, 512 positions, 40,478 tokens; 2 of its 12 blocks, the
same code each, as in test_openai_gpt.py), seeded random weights in transformers' OpenAIGPTForSequenceClassification
and OpenAIGPTDoubleHeadsModel: exported (no tokenizer: the special tokens named by id, as the paper's were appended
to the vocabulary), validated, and compared with transformers on rows up to the full context."""

from __future__ import annotations

import numpy as np
import pytest

from gptedge.runtime import load_classifier

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.interop]

N_LAYER, VOCAB, CONTEXT = 2, 40478, 512
SPECIAL = {"start": VOCAB - 3, "delimiter": VOCAB - 2, "extract": VOCAB - 1}


@pytest.mark.parametrize("model_class, task", [("OpenAIGPTForSequenceClassification", "entailment"),
                                               ("OpenAIGPTDoubleHeadsModel", "multiple-choice")])
def test_real_shape_heads_match_transformers(tmp_path, model_class, task):
    from gptedge.export.head_export import export_task

    torch.manual_seed(0)
    config = transformers.OpenAIGPTConfig(num_labels=3, pad_token_id=0, n_layer=N_LAYER)
    assert (config.n_embd, config.vocab_size, config.n_positions) == (768, VOCAB, CONTEXT)
    model = getattr(transformers, model_class)(config).eval()
    model.save_pretrained(tmp_path / "ck")
    manifest = export_task(tmp_path / "ck", tmp_path / "out", task=task, special=SPECIAL)
    parity = manifest.parity.graph_vs_reference
    assert parity.max_abs_diff <= 1e-4 and parity.top1_agreement == 1.0
    clf = load_classifier(tmp_path / "out", device="cpu")
    rng = np.random.default_rng(0)
    lengths = (CONTEXT, 200, 17)  # the whole context, and right-padded rows
    rows = [[SPECIAL["start"], *rng.integers(0, VOCAB - 3, size=n - 2).tolist(), SPECIAL["extract"]] for n in lengths]
    ids = np.array([r + [0] * (CONTEXT - len(r)) for r in rows], dtype=np.int64)
    mask = (np.arange(CONTEXT) < np.array(lengths)[:, None]).astype(np.int64)
    with torch.no_grad():
        if task == "multiple-choice":
            want = model(input_ids=torch.from_numpy(ids[None]),
                         mc_token_ids=torch.tensor([[n - 1 for n in lengths]])).mc_logits.numpy()
            got = clf.logits(ids[None], mask[None])
        else:
            want = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
            got = clf.logits(ids, mask)
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-4
