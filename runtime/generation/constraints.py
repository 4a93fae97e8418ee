"""Constrained decoding: a JSON schema, a regular expression or a Lark grammar turned into one token mask per step
for one sequence (docs/serving.md#structured-output).

llguidance does the work (a Rust library, maintained by the guidance project and used by ONNX Runtime GenAI and
llama.cpp): it reads the model's own tokenizer.json, compiles a grammar once, and gives the set of tokens that
keep the text inside the grammar, as a bitmask, in tens of microseconds for a vocabulary of tens of thousands.
It is imported only when a request asks for a constraint, so the runtime without it still loads and generates.

The pieces, in the order a request meets them:
- ConstraintSpec: what a request asks for, as data (kind + source).
- ConstraintCompiler: one model's compiler; its llguidance tokenizer is built on first use (about 0.1 s for
  8k tokens), compiled constraints are cached by their spec. compile() raises ConstraintError (one line) for an
  unsupported schema feature or a bad grammar: the server checks before a request is admitted.
- Constraint: one compiled grammar with its first mask already computed; start() gives a row its own state.
- RowConstraint: one sequence's matcher and its next mask. apply() puts -inf outside the mask on a row of
  logits (V,); advance() feeds the chosen token; compute_mask() prepares the next mask (drops the GIL).
- MaskWorker: computes the next masks of the batch's constrained rows on one background thread while the model
  runs the step that needs them (the serving engine's use), so a constrained row adds no model-thread time
  beyond apply(), and an unconstrained row nothing at all.

JSON is compact (no whitespace between tokens) and every number has a finite length (bounded_numbers): a small
model left free to add whitespace or digits can fill its whole budget with them.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidArgumentError, missing_extra

KINDS = ("json_schema", "regex", "grammar")  # grammar: Lark, in llguidance's syntax
JSON_OPTIONS = {"whitespace_flexible": False}  # compact JSON: "," and ":" with nothing around them
STOP_GRAMMAR = "grammar"  # Generation.stop when the grammar is complete and allows nothing more
CACHED_CONSTRAINTS = 64  # compiled constraints kept per model (clients resend the same schema)
MAX_ERROR = 300  # characters of a compile error in the one-line message
MAX_SAFE_INTEGER = 2**53 - 1  # the largest integer every JSON reader keeps exactly (RFC 7493, I-JSON)
# a number's digits after the point, at most (bounded_numbers); llguidance refuses multipleOf below about 1e-11
FRACTION_DIGITS = 9
DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples"})  # their values are JSON data, not schemas


class ConstraintError(InvalidArgumentError):
    """A schema, regex or grammar this server cannot constrain to (unsupported feature, syntax error)."""


@dataclass(frozen=True)
class ConstraintSpec:
    """What a request constrains its output to. kind: one of KINDS; source: the schema as JSON text (the client's
    key order: an object's properties come out in its schema's order), the regex, or the Lark grammar."""

    kind: str
    source: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.source, str) or not self.source:
            raise InvalidArgumentError(f"a {self.kind} constraint needs a non-empty source")

    @classmethod
    def json_schema(cls, schema: dict | bool) -> ConstraintSpec:
        """A JSON schema's spec, its numbers bounded (bounded_numbers)."""
        return cls("json_schema", json.dumps(bounded_numbers(schema), ensure_ascii=False))


def bounded_numbers(schema):
    """A copy of `schema` whose integers and numbers have a finite length: each integer or number schema without a
    lower (upper) bound gets -MAX_SAFE_INTEGER (+MAX_SAFE_INTEGER), and each number without multipleOf gets
    10^-FRACTION_DIGITS. Outputs stay valid against the schema as given (they are a subset), and a model that
    prefers digits cannot fill its budget with one number (llama.cpp's JSON grammar caps digits the same way).
    Data inside enum / const / default / examples is left alone."""
    if isinstance(schema, list):
        return [bounded_numbers(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: v if k in DATA_KEYWORDS else bounded_numbers(v) for k, v in schema.items()}
    kinds = out.get("type") if isinstance(out.get("type"), list) else [out.get("type")]
    if "integer" in kinds or "number" in kinds:
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -MAX_SAFE_INTEGER
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = MAX_SAFE_INTEGER
        if "number" in kinds and "multipleOf" not in out:
            out["multipleOf"] = float(f"1e-{FRACTION_DIGITS}")  # its repr is exact; 10.0 ** -9 is not
    return out


def _one_line(message: str) -> str:
    """llguidance's messages span lines (a caret under the bad column): joined into one, cut to MAX_ERROR."""
    line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    return line if len(line) <= MAX_ERROR else line[:MAX_ERROR] + "..."


def _llguidance():
    try:
        import llguidance
    except ImportError as e:
        raise missing_extra(e.name, "serve", "structured output (response_format, regex, grammar)") from None
    return llguidance


class ConstraintCompiler:
    """Compiles ConstraintSpecs for one model. tokenizer: the model's `tokenizers.Tokenizer`; vocab_size: the width
    of the graph's logits (tokens beyond the tokenizer's are never allowed); end_ids: the ids that end a sequence
    (Manifest.stop_ids), allowed once the grammar accepts. Thread-safe: the server compiles on worker threads."""

    def __init__(self, tokenizer, vocab_size: int, end_ids: tuple[int, ...]):
        self._tokenizer, self.vocab_size, self.end_ids = tokenizer, int(vocab_size), tuple(end_ids)
        self._ll_tokenizer = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[ConstraintSpec, Constraint] = OrderedDict()

    def _ll(self):
        """llguidance's tokenizer, built once (it indexes every token's bytes)."""
        with self._lock:
            if self._ll_tokenizer is None:
                llg = _llguidance()
                try:
                    self._ll_tokenizer = llg.LLTokenizer(self._tokenizer.to_str(), n_vocab=self.vocab_size,
                                                         eos_token=list(self.end_ids) or None)
                except Exception as e:  # llguidance raises ValueError / RuntimeError for a tokenizer it cannot read
                    raise ConstraintError(f"structured output is not available for this model's tokenizer: "
                                          f"{_one_line(str(e))}") from None
            return self._ll_tokenizer

    def compile(self, spec: ConstraintSpec) -> Constraint:
        """-> the compiled constraint (cached), or ConstraintError naming what is wrong, in one line."""
        with self._lock:
            if spec in self._cache:
                self._cache.move_to_end(spec)
                return self._cache[spec]
        constraint = Constraint(self._ll(), spec, self.vocab_size, self.end_ids)
        with self._lock:
            self._cache[spec] = constraint
            while len(self._cache) > CACHED_CONSTRAINTS:
                self._cache.popitem(last=False)
        return constraint


def _grammar(llg, spec: ConstraintSpec) -> str:
    if spec.kind == "json_schema":
        try:
            return llg.LLMatcher.grammar_from_json_schema(spec.source, overrides=JSON_OPTIONS)
        except ValueError as e:
            raise ConstraintError(f"invalid JSON schema: {_one_line(str(e))}") from None
    if spec.kind == "regex":
        return llg.LLMatcher.grammar_from_regex(spec.source)
    return llg.LLMatcher.grammar_from_lark(spec.source)


class Constraint:
    """One compiled grammar for one model: immutable once built; each sequence gets its own state (start())."""

    def __init__(self, ll_tokenizer, spec: ConstraintSpec, vocab_size: int, end_ids: tuple[int, ...]):
        llg = _llguidance()
        grammar = _grammar(llg, spec)
        is_error, messages = llg.LLMatcher.validate_grammar_with_warnings(grammar, ll_tokenizer)
        what = {"json_schema": "JSON schema", "regex": "regex", "grammar": "grammar"}[spec.kind]
        if is_error:
            raise ConstraintError(f"unsupported {what}: {_one_line(messages[0]) if messages else 'invalid'}")
        self.spec, self.vocab_size, self.end_ids = spec, vocab_size, end_ids
        self._matcher = llg.LLMatcher(ll_tokenizer, grammar, log_level=0)
        if self._matcher.is_error():
            raise ConstraintError(f"unsupported {what}: {_one_line(self._matcher.get_error())}")
        first = RowConstraint(self._matcher.deep_copy(), vocab_size, end_ids)
        first.compute_mask()  # every row starts from this mask: computed once, here, off the engine thread
        if not first.allowed.any():
            raise ConstraintError(f"the {what} allows no output with this model's tokens")
        self._first_allowed = first.allowed

    def start(self, extra_end_ids: tuple[int, ...] = ()) -> RowConstraint:
        """A fresh state for one sequence, its first mask ready. extra_end_ids: more ids that end this sequence
        once the grammar accepts (a chat template's end of turn)."""
        row = RowConstraint(self._matcher.deep_copy(), self.vocab_size, self.end_ids + tuple(extra_end_ids))
        row.allowed = self._first_allowed.copy()
        if extra_end_ids and self._matcher.is_accepting():
            row.allowed[list(extra_end_ids)] = True
        row.bias = np.where(row.allowed, np.float32(0), np.float32(-np.inf))
        row.stale = False
        return row


class RowConstraint:
    """One sequence's matcher and the mask of its next token. Not thread-safe: the engine thread and the
    MaskWorker take turns (the worker's future is awaited before the engine touches the row again)."""

    def __init__(self, matcher, vocab_size: int, end_ids: tuple[int, ...]):
        self.matcher, self.vocab_size, self.end_ids = matcher, vocab_size, list(end_ids)
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)  # llguidance's bitmask: bit i = token i
        self.allowed = np.zeros(vocab_size, dtype=bool)  # (V,) the next token's mask
        self.bias = np.zeros(vocab_size, dtype=np.float32)  # (V,) 0 where allowed, -inf elsewhere: added to logits
        self.stale = True  # allowed is not yet the mask for the state after the last token

    def compute_mask(self) -> None:
        """The next token's mask from the matcher's state (llguidance drops the GIL while it computes). The end ids
        are allowed exactly when the grammar accepts, forbidden otherwise."""
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")[: self.vocab_size]
        self.allowed = bits.astype(bool)
        if self.end_ids:
            self.allowed[self.end_ids] = self.matcher.is_accepting()
        self.bias = np.where(self.allowed, np.float32(0), np.float32(-np.inf))  # one add on the engine thread
        self.stale = False

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """logits (V,) -> a copy with -inf outside the mask (the mask is computed here if still stale)."""
        if self.stale:
            self.compute_mask()
        return logits + self.bias

    def advance(self, token: int) -> bool:
        """Feed the chosen token; False when the matcher refuses it (then `error` says why)."""
        self.stale = True
        return bool(self.matcher.consume_token(int(token)))

    @property
    def done(self) -> bool:
        """The grammar is complete and allows no more text: the sequence ends here."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str:
        return _one_line(self.matcher.get_error())


class MaskWorker:
    """One background thread computing the next masks of a batch's constrained rows while the model runs.
    begin(rows) -> a future to wait on before the rows' masks are applied (None when no row needs one)."""

    def __init__(self):
        self._pool: ThreadPoolExecutor | None = None  # started with the first constrained row

    def begin(self, rows: list[RowConstraint]) -> Future | None:
        stale = [r for r in rows if r.stale]
        if not stale:
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="gptedge-masks")
        return self._pool.submit(_compute_all, stale)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


def _compute_all(rows: list[RowConstraint]) -> None:
    for row in rows:
        row.compute_mask()
