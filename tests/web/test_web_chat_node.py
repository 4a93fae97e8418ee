"""The packed site's chat, in Node: transformers.js renders the chat template itself (tokenizer.apply_chat_template,
through the playground's chatPromptIds) and must give the ids gptedge's server renders (runtime/modeldir/
chat_template.py, then the tokenizer without added special tokens), on the Llama sample's own ChatML template and
tokenizer, and on a pack whose template came from `serve --chat-template` (write_web_model's chat_template); the
page's chat turn (chatLocal) then gives generate()'s greedy ids for those ids."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer

from gptedge.pack.web import write_web_model
from gptedge.runtime import load
from gptedge.runtime.modeldir.chat_template import find_chat_template, render_chat, special_tokens

from ..support.checkpoints import ROOT
from ..support.web_clients import need_node, run_node

pytestmark = pytest.mark.slow  # Node and transformers.js, the sample model packed

LLAMA = ROOT / "samples" / "sample-llama"
# The Llama sample's ChatML template without its bos_token: the GPT-2 sample's tokenizer has none
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CONVERSATIONS = [
    [{"role": "user", "content": "Will you walk with me to Highbury this morning?"}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Good morning, sir."},
     {"role": "user", "content": "Tell me of Bath \u2014 and of Mr. Elliot\u2019s \u201cplans\u201d.\n\nQuickly!"}],
]
NEW_TOKENS = 16

CHAT_JS = """
import { AutoTokenizer } from '@huggingface/transformers';
import { configureRuntime, loadModel, chatPromptIds, chatLocal } from './playground.js';
const [llama, pack, conversations, n] = [process.argv[2], process.argv[3], JSON.parse(process.argv[4]),
                                         Number(process.argv[5])];
await configureRuntime();
const tokenizer = await AutoTokenizer.from_pretrained(llama, { local_files_only: true });
const loaded = await loadModel(pack, { dtype: 'fp32' });
const out = { llama: [], pack: [], replies: [] };
for (const c of conversations) {
  out.llama.push(chatPromptIds({ tokenizer }, c));
  out.pack.push(chatPromptIds(loaded, c));
  out.replies.push((await chatLocal(loaded, c, { maxNewTokens: n, greedy: true })).ids);
}
console.log(JSON.stringify(out));
"""


def test_transformers_js_renders_the_chat_as_the_server_does(sample_recipe_dirs, tmp_path):
    need_node()
    pack = tmp_path / "pack"
    pack.mkdir()
    assert write_web_model([sample_recipe_dirs["fp32"]], pack, chat_template=CHATML)["chat_template"] is True
    assert json.loads((pack / "tokenizer_config.json").read_text())["chat_template"] == CHATML
    got = run_node(CHAT_JS, str(LLAMA), str(pack), json.dumps(CONVERSATIONS), str(NEW_TOKENS))

    llama_tokenizer = Tokenizer.from_file(str(LLAMA / "tokenizer.json"))
    template, tokens = find_chat_template(LLAMA), special_tokens(LLAMA)
    model = load(sample_recipe_dirs["fp32"], device="cpu")
    for i, conversation in enumerate(CONVERSATIONS):
        want = llama_tokenizer.encode(render_chat(template, conversation, True, tokens), add_special_tokens=False).ids
        assert got["llama"][i] == want and want[0] == 1, conversation  # bos first: the template writes it
        ids = model.tokenizer.encode(render_chat(CHATML, conversation, True), add_special_tokens=False).ids
        assert got["pack"][i] == ids, conversation
        assert got["replies"][i] == model.generate(ids, max_new_tokens=NEW_TOKENS, greedy=True).ids, conversation


def test_the_dirs_own_template_or_none(sample_recipe_dirs, tmp_path):
    """A source's chat_template.jinja (export's copy of the checkpoint's) reaches the pack; without one the pack
    says it has none (the page then greys the chat out)."""
    import shutil

    assert find_chat_template(sample_recipe_dirs["fp32"]) is None
    (tmp_path / "none").mkdir()
    assert write_web_model([sample_recipe_dirs["fp32"]], tmp_path / "none")["chat_template"] is False
    assert "chat_template" not in json.loads((tmp_path / "none" / "tokenizer_config.json").read_text())
    source = shutil.copytree(sample_recipe_dirs["fp32"], tmp_path / "with")
    (source / "chat_template.jinja").write_text(CHATML)
    (tmp_path / "own").mkdir()
    assert write_web_model([source], tmp_path / "own")["chat_template"] is True
    assert json.loads((tmp_path / "own" / "tokenizer_config.json").read_text())["chat_template"] == CHATML
