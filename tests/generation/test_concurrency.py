"""A LoadedModel shared by threads: every call gets exactly what it gets alone (no per-call state)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

CALLS = [  # (prompt, options): greedy and seeded sampling, batches and streams mixed
    ("Hello world", {"greedy": True}),
    ("It is a truth universally acknowledged", {"top_k": 20, "temperature": 0.8, "seed": 1}),
    ("In the beginning", {"top_p": 0.9, "seed": 2}),
    ([11, 12, 13, 14, 15], {"greedy": True, "repetition_penalty": 1.3}),
    ("Hello world", {"top_k": 5, "seed": 3}),
    ("A", {"greedy": True}),
    ("The", {"temperature": 1.2, "seed": 4}),
    ("It was the best of times", {"top_k": 40, "seed": 5}),
]


def _run(model, i: int):
    prompt, options = CALLS[i % len(CALLS)]
    kind = i % 3
    if kind == 0:
        return model.generate(prompt, max_new_tokens=12, **options).ids
    if kind == 1:
        stream = model.stream(prompt, max_new_tokens=12, **options)
        text = "".join(stream)
        assert text == stream.result.text
        return stream.result.ids
    return model.generate_batch([prompt, "Padding row, longer than most prompts"], max_new_tokens=12,
                                **options)[0].ids


@pytest.mark.slow  # eight threads x 30 tokens, both graphs
@pytest.mark.parametrize("graph", ["standard", "kv_buffer"])
def test_eight_threads_get_their_solo_results(gpt2_loaded, gpt2_kv_buffer_loaded, graph):
    model = gpt2_loaded if graph == "standard" else gpt2_kv_buffer_loaded
    n = 4 * len(CALLS)
    solo = [_run(model, i) for i in range(n)]
    assert len({tuple(s) for s in solo}) > 3  # the calls really differ
    pool = ThreadPoolExecutor(max_workers=8)
    try:
        together = list(pool.map(lambda i: _run(model, i), range(n), timeout=300))  # a hang fails, never blocks
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    assert together == solo
