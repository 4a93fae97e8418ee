"""Beam search's oracle: transformers' own generate(num_beams=N) on the same checkpoint, and the comparison of
gptedge's beams with it (the same sequences, scores within 1e-4)."""

from __future__ import annotations

from pathlib import Path


def transformers_beams(checkpoint, prompts, new_tokens: int, eos: int, pad: int, **options):
    """The oracle: transformers' own beam search on the same checkpoint (its dir, or the model already loaded from
    it) -> [(generated ids, score)] per prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded = isinstance(checkpoint, str | Path)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval() if loaded else checkpoint
    L = max(map(len, prompts))
    ids = torch.tensor([[pad] * (L - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (L - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad,
                             eos_token_id=eos, output_scores=True, return_dict_in_generate=True, **options)
    n = options["num_return_sequences"]
    result = []
    for b in range(len(prompts)):
        rows = []
        for k in range(n):
            seq = out.sequences[b * n + k, L:].tolist()
            rows.append((seq[:seq.index(eos) + 1] if eos in seq else seq, float(out.sequences_scores[b * n + k])))
        result.append(rows)
    return result


def assert_same(ours, theirs):
    for got, want in zip(ours, theirs, strict=True):
        assert got.sequences == [s for s, _ in want]
        assert max(abs(a - b) for a, (_, b) in zip(got.scores, want, strict=True)) < 1e-4
