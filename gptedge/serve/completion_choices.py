"""One /v1/completions request's choices: what each gathers from its engine events, and which are returned.

A request of P prompts with `n` choices and `best_of` >= n generates best_of choices per prompt (one engine
request each, all queued together so they are prefilled together where the admission budget allows) and returns
n per prompt, indexed prompt x n + choice as OpenAI's API did. With best_of > n the n returned are those with
the highest cumulative logprob of their generated tokens (OpenAI's semantics); usage counts every generated
token, the discarded choices' too, and each prompt's tokens once.

Text has one owner, the engine: its TokenEvents carry the text each token completes (TextStream) and, with
logprobs, the token's own text and where it starts in the choice's text. This module only concatenates them
(and, for an echoed prompt, the offsets of the prompt's tokens, from the same rule: text_stream.token_offsets).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from gptedge.runtime.generation.sampling import SamplingParams
from gptedge.runtime.serving.engine import FinishReason, TokenEvent
from gptedge.runtime.serving.prompt_logprobs import PromptLogprobs

from .openai_schema import CompletionParams, Logprobs


@dataclass
class ChoiceState:
    """What one choice has gathered so far. prompt_offsets: each echoed prompt token's place in `echo` (only with
    echo and logprobs)."""

    echo: str  # the prompt's text when echo is on, else ""
    logprobs: Logprobs | None
    prompt_offsets: list[int] | None = None
    text: str = ""
    finish_reason: FinishReason | None = None
    completion_tokens: int = 0
    cumulative_logprob: float = 0.0  # of the generated tokens: what best_of ranks by
    prompt_entries: Logprobs | None = field(default=None, repr=False)

    def take(self, event: TokenEvent, token_text, top_n: int | None) -> tuple[Logprobs | None, Logprobs | None]:
        """Add one event -> (the echoed prompt's logprobs entries it adds, the generated token's entry); each None
        when it adds none. token_text(id): an alternative's (or a prompt token's) own text."""
        prompt = None
        if event.prompt_logprobs is not None and self.logprobs is not None and self.prompt_offsets is not None:
            prompt = self._prompt_entries(event.prompt_logprobs, token_text, top_n)
            _extend(self.logprobs, prompt)
        entry = None
        if event.token_id is not None and event.logprob is not None:
            self.cumulative_logprob += event.logprob
        if self.logprobs is not None and event.token_id is not None:
            entry = Logprobs()
            top = {token_text(t): lp for t, lp in list((event.top_logprobs or {}).items())[:top_n]}
            name = event.token_text if event.token_text is not None else token_text(event.token_id)
            offset = event.text_offset if event.text_offset is not None else len(self.text)
            entry.add(name, event.logprob, top, len(self.echo) + offset)
            _extend(self.logprobs, entry)
        self.text += event.text
        if event.finish_reason is not None:
            self.finish_reason = event.finish_reason
            self.completion_tokens = len(event.generation.ids) if event.generation is not None else 0
        return prompt, entry

    def _prompt_entries(self, scored: PromptLogprobs, token_text, top_n: int | None) -> Logprobs:
        out = Logprobs()
        for tok, lp, top, offset in zip(scored.token_ids, scored.logprobs, scored.top, self.prompt_offsets,
                                        strict=True):
            alternatives = None if top is None else {token_text(t): v for t, v in list(top.items())[:top_n]}
            out.add(token_text(tok), lp, alternatives, offset)
        return out


def _extend(block: Logprobs, more: Logprobs) -> None:
    for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        getattr(block, name).extend(getattr(more, name))


def seeded(sampling: SamplingParams, count: int) -> list[SamplingParams]:
    """count choices' sampling: with a seed, choice j samples from seed + j (the same seed would make them one
    choice repeated); without, each its own fresh generator. Chat's n uses it too."""
    return [sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + j) for j in range(count)]


def choice_sampling(params: CompletionParams) -> list[SamplingParams]:
    """Each of a prompt's best_of choices' sampling (seeded)."""
    return seeded(params.sampling, params.best_of)


def returned(params: CompletionParams, states: list[ChoiceState]) -> list[ChoiceState]:
    """states (prompt-major, best_of per prompt) -> the n per prompt the response holds, in index order."""
    if params.best_of == params.n:
        return states
    out = []
    for p in range(len(states) // params.best_of):
        mine = states[p * params.best_of:(p + 1) * params.best_of]
        out.extend(sorted(mine, key=lambda c: -c.cumulative_logprob)[:params.n])  # stable: ties keep order
    return out
