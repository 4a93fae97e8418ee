"""Each special-token role of a task template takes its own token (issue #35): a delimiter equal to the extract
token (given on the command line or declared by the checkpoint) is refused in one line, before any export work; a
delimiter one id away still passes. Run on export's own resolver, with the test checkpoints' tokenizer files."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from gptedge.export.head_export import special_tokens
from gptedge.runtime.errors import CheckpointError, InvalidArgumentError

from ..support.task_checkpoints import VOCAB, write_tokenizer

ROLES = ("start", "delimiter", "extract")
START, DELIM, EXTRACT = 50257, 50258, 50259


@pytest.fixture
def source(tmp_path):
    write_tokenizer(tmp_path)  # declares <start> / <delim> / <extract> as bos / sep / cls tokens
    return tmp_path, Tokenizer.from_file(str(tmp_path / "tokenizer.json"))


@pytest.mark.parametrize("given", [{"delimiter": "<extract>"}, {"delimiter": EXTRACT}, {"extract": "<delim>"},
                                   {"start": "<delim>"}])
def test_a_role_given_the_token_of_another_is_a_bad_command_line(source, given):
    path, tok = source
    with pytest.raises(InvalidArgumentError, match=r"tokens are the same token \(id 5025[789]\): task entailment "
                                                   "needs a token of its own for each role$"):
        special_tokens(ROLES, path, tok, VOCAB, given, "entailment")


def test_a_checkpoint_declaring_one_token_twice_is_refused(source):
    path, tok = source
    (path / "tokenizer_config.json").write_text('{"bos_token": "<start>", "sep_token": "<extract>", '
                                                '"cls_token": "<extract>"}')
    with pytest.raises(CheckpointError, match="the delimiter and extract tokens are the same token"):
        special_tokens(ROLES, path, tok, VOCAB, None, "entailment")


@pytest.mark.parametrize("given, ids", [(None, (START, DELIM, EXTRACT)),
                                        ({"delimiter": EXTRACT - 1}, (START, DELIM, EXTRACT)),  # one id off
                                        ({"delimiter": 13}, (START, 13, EXTRACT))])
def test_distinct_tokens_still_pass(source, given, ids):
    path, tok = source
    got = special_tokens(ROLES, path, tok, VOCAB, given, "entailment")
    assert (got.start, got.delimiter, got.extract) == ids
