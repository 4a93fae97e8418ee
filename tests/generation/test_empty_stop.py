"""One rule for empty stop strings (issue #35): the Python API refuses one as the server's `stop` field and
`generate --stop ''` do (it was silently dropped by the API and the CLI while the server answered 400)."""

from __future__ import annotations

import pytest

from gptedge.runtime.errors import InvalidArgumentError
from gptedge.runtime.serving.requests import CompletionRequest


@pytest.mark.parametrize("stop", [[""], ["x", ""], ("", "y")])
def test_an_empty_stop_string_is_refused(gpt2_loaded, stop):
    with pytest.raises(InvalidArgumentError, match="^a stop string is empty"):
        gpt2_loaded.generate("Hi", max_new_tokens=2, stop=stop)
    with pytest.raises(InvalidArgumentError, match="^a stop string is empty"):
        CompletionRequest((1,), 2, stop=stop)


def test_a_one_character_stop_string_still_works(gpt2_loaded):
    free = gpt2_loaded.generate("Hi", max_new_tokens=12, ignore_eos=True, greedy=True)
    cut = next(c for c in free.text if c.strip())  # a character the free text holds
    out = gpt2_loaded.generate("Hi", max_new_tokens=12, ignore_eos=True, greedy=True, stop=[cut])
    assert out.stop == "stop_string" and out.text == free.text[:free.text.index(cut)]
