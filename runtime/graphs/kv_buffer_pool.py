"""The continuous batch on a kv_buffer graph: every sequence owns a row of one preallocated cache.

Per layer, keys and values live in one host array (2 x capacity, nh, max_len, hs). Joined sequences
occupy rows 0..n-1, so a decode step binds the contiguous prefix (n, nh, max_len, hs) as past and
present and GroupQueryAttention writes the new position of every row in place. Rows capacity.. are
scratch rows where newcomers are prefilled: a group of k whose prompts fit one run together is
prefilled at once in k scratch rows, left-padded to the longest (an empty past, so ONNX Runtime's CPU
GroupQueryAttention takes any batch; the padding is masked, and the LM head reads the last position,
every row's last prompt token); a prompt too long for one run is prefilled alone in chunks in the
first scratch row (GroupQueryAttention takes a multi-position run over a non-empty past for batch 1
only). Scratch rows cost memory only where a prompt touched them (numpy_small_pages).

All rows share one timeline of T positions: row r's cache is the window [T - len_r, T), and the
attention mask hides everything before it. A newcomer's prefilled window is copied from the
scratch row to the end of the timeline (rows move right first if it is longer than T); when
T reaches max_len, or SLACK positions at its start are needed by no row, rows move left. A finished row is
replaced by the last row, so the prefix stays dense. Copies cost len positions x layers, e.g. 2.4 MB for a
32-token prompt of GPT-2 small; nothing is copied on an ordinary decode step.

A newcomer whose prompt starts with a cached prefix (the server's prefix cache) has those positions' keys and
values written into the scratch row first, and runs the rest alone over them as a past (the rest of a group
still runs together); read_kv copies a joined row's positions back out for the cache.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .. import contract as C
from .graph_variant import GraphVariant
from .huge_pages import numpy_small_pages
from .sequence_pool import Prefill, drain, prefill_runs


# Positions at the start of the shared timeline that no row needs any more before the rows move left.
# Without it the timeline sweeps the whole buffer and touches every page of it: serving GPT-2 small INT8
# to 16 clients (--max-batch 16) peaked at 1,481 MiB RSS. With it the touched span stays within the
# longest live sequence + SLACK; a move copies every row's window (8 rows x 160 positions: ~94 MB,
# every 64 steps).
SLACK = 64


class SlotPool:
    reuses_prefixes = True  # a cached prefix is written into the scratch row, read back from a joined row

    def __init__(self, variant: GraphVariant, capacity: int, max_length: int):
        shape = variant.shape
        self.variant, self.capacity, self.max_length = variant, capacity, max_length
        self._session, self._names = variant.session, variant.names
        # Zeroed, so a masked position never holds NaN bits (0 x NaN would leak through attention);
        # untouched pages cost no memory, provided they are small ones: numpy would ask for 2 MB pages on arrays over
        # 4 MB, and a row's window touches a few KB in each head's (max_len, hs) block (serving GPT-2 small INT8 to
        # 16 clients peaked at 1,482 MiB RSS with every row of the cache resident).
        with numpy_small_pages():
            # (2 x capacity, nh, max_len, width) in the cache's type (runtime/modeldir/kv_cache.py): int8 is a
            # quarter of fp32
            self.kv = [np.zeros((2 * capacity, shape.kv_heads, max_length, variant.kv_width), variant.kv_dtype)
                       for _ in range(2 * shape.n_layer)]
        self._rows: list[int] = []  # row -> seq, rows 0..n-1
        self._lengths: list[int] = []  # row -> positions held
        self._timeline = 0  # T
        self._decode = self._binding(capacity)  # its rows are rebound whenever n changes
        self._decode_rows = -1
        self._inputs: tuple[np.ndarray, ...] = ()
        self.keeps_prompt_logits = True
        self.prompt_logits: dict[int, np.ndarray] = {}  # seq -> (L, V) float32, from a keep_all prefill

    def _binding(self, rows: int, positions: int = 0):
        """positions 0: the LM head on each row's last position, logits (rows, 1, V); else on every one of
        `positions`, logits (rows, positions, V) (a prompt-logprobs prefill)."""
        binding = self._session.io_binding()
        self.variant.bind_keep(binding, 0 if positions else 1)
        binding.logits = np.empty((rows, positions or 1, self.variant.shape.vocab_size),
                                  self.variant.logits_dtype)  # kept alive
        return binding

    def _bind_kv(self, binding, rows: slice) -> None:
        """Bind rows of every cache as past and present, and logits (n, 1, V) for as many rows."""
        n = rows.stop - rows.start
        logits = binding.logits[:n]
        binding.bind_output(C.LOGITS, "cpu", 0, logits.dtype, list(logits.shape), logits.ctypes.data)
        for past, present, buf in zip(self._names.past_names, self._names.present_names, self.kv, strict=True):
            view = buf[rows]  # (n, nh, max_len, hs), contiguous: a prefix or one row
            for bind, name in ((binding.bind_input, past), (binding.bind_output, present)):
                bind(name, "cpu", 0, view.dtype, list(view.shape), view.ctypes.data)

    def _run(self, binding, ids: np.ndarray, mask: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """-> last-position logits (n, V) float32: with fp32 logits a view of the binding's array, which the
        binding's next run overwrites (a prefill binds its own; the decode binding is step's, read before the next
        step)."""
        self._inputs = tuple(np.ascontiguousarray(a, dtype=np.int64) for a in (ids, mask, pos))
        for name, array in zip((C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS), self._inputs, strict=True):
            binding.bind_cpu_input(name, array)
        self._session.run_with_iobinding(binding)
        return binding.logits[: ids.shape[0], -1, :].astype(np.float32, copy=False)

    # -- the pool's interface ------------------------------------------------------------------------
    def prefill(self, seq: int, prompt_ids: Sequence[int], chunk: int | None,
                prefix: np.ndarray | None = None, *, keep_all: bool = False) -> Prefill:
        if keep_all and prefix is not None:  # the engine never reuses a prefix whose logits are asked for
            raise RuntimeError("prompt logits need every position run: no cached prefix")
        if len(self._rows) >= self.capacity:
            raise RuntimeError("sequence pool is full")  # the engine admits at most `capacity`
        scratch = slice(self.capacity, self.capacity + 1)  # the scratch row
        binding = self._binding(1)
        self._bind_kv(binding, scratch)
        ids = np.asarray(prompt_ids, dtype=np.int64)[None]  # (1, L)
        cached = 0
        if prefix is not None:  # (2 x n_layer, nh, P, width): the first P positions, run over as a past
            cached = prefix.shape[2]
            for buf, kv in zip(self.kv, prefix, strict=True):
                buf[self.capacity, :, :cached] = kv
        logits, kept = None, []
        for start, end in prefill_runs(ids.shape[1], chunk, cached):
            if keep_all:  # a binding per run: its logits are (1, end - start, V)
                binding = self._binding(1, end - start)
                self._bind_kv(binding, scratch)
            logits = self._run(binding, ids[:, start:end], np.ones((1, end), np.int64),
                               np.arange(start, end, dtype=np.int64)[None])[0]
            if keep_all:
                kept.append(binding.logits[0].astype(np.float32))
            if end < ids.shape[1]:
                yield  # a chunk done: the engine decodes the running batch before the next one
        self._join(seq, ids.shape[1])
        if keep_all:
            self.prompt_logits[seq] = np.concatenate(kept)  # (L, V)
        return logits

    def prefill_group(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]],
                      prefixes: Sequence[np.ndarray | None] | None = None, *,
                      keep_all: Sequence[bool] = ()) -> np.ndarray:
        if prefixes is not None and any(p is not None for p in prefixes):
            return self._prefill_some_over_prefixes(seqs, prompts, prefixes, keep_all)
        k = len(seqs)
        if not 1 <= k <= self.capacity - len(self._rows):
            raise RuntimeError(f"a group of {k} does not fit the pool's {self.capacity - len(self._rows)} free rows")
        # identical prompts (a request's n / best_of choices) run once: each one's window is copied from the
        # scratch row of its first copy. source[i]: the run's row of prompts[i]; u unique prompts in order
        first: dict[tuple[int, ...], int] = {}
        source = [first.setdefault(tuple(p), len(first)) for p in prompts]
        unique = list(first)
        u, longest = len(unique), max(len(p) for p in unique)
        ids = np.zeros((u, longest), np.int64)  # (u, S), each prompt at the right end of its row
        mask = np.zeros((u, longest), np.int64)
        pos = np.zeros((u, longest), np.int64)
        for r, prompt in enumerate(unique):
            pad = longest - len(prompt)
            ids[r, pad:], mask[r, pad:], pos[r, pad:] = prompt, 1, np.arange(len(prompt))
        # made per group: a run of u x S positions dwarfs binding 2 x layers arrays. When a row asks for its
        # prompt logits the LM head runs on every position of the group's run (u x S, padding included)
        keep = any(keep_all)
        binding = self._binding(u, longest if keep else 0)
        self._bind_kv(binding, slice(self.capacity, self.capacity + u))
        logits = self._run(binding, ids, mask, pos)  # (u, V)
        for i, (seq, prompt, r) in enumerate(zip(seqs, prompts, source, strict=True)):
            self._join(seq, len(prompt), src=self.capacity + r, src_end=longest)
            if keep and keep_all[i]:
                self.prompt_logits[seq] = binding.logits[r, longest - len(prompt):].astype(np.float32)  # (L, V)
        return logits[source]  # (k, V)

    def _prefill_some_over_prefixes(self, seqs, prompts, prefixes, keep_all: Sequence[bool] = ()) -> np.ndarray:
        """A group where some prompts start from a cached prefix: those run alone over their past (CPU
        GroupQueryAttention runs several positions over a past for batch 1 only), the others together."""
        if len(seqs) > self.capacity - len(self._rows):
            raise RuntimeError(f"a group of {len(seqs)} does not fit the pool's {self.capacity - len(self._rows)} "
                               "free rows")
        fresh = [i for i, p in enumerate(prefixes) if p is None]
        logits: list[np.ndarray | None] = [None] * len(seqs)
        if fresh:
            keep = list(keep_all) or [False] * len(seqs)
            rows = self.prefill_group([seqs[i] for i in fresh], [prompts[i] for i in fresh],
                                      keep_all=[keep[i] for i in fresh])
            for i, row in zip(fresh, rows, strict=True):
                logits[i] = row
        for i, prefix in enumerate(prefixes):
            if prefix is not None:
                logits[i] = drain(self.prefill(seqs[i], prompts[i], None, prefix))
        return np.stack(logits)

    def read_kv(self, seq: int, start: int, end: int) -> np.ndarray:
        """Keys and values of a joined sequence's positions [start, end): (2 x n_layer, nh, end - start, width),
        a copy (the row's window moves as rows join, leave and compact)."""
        r = self._rows.index(seq)
        first = self._timeline - self._lengths[r]  # the row's position 0 on the shared timeline
        return np.stack([buf[r, :, first + start:first + end] for buf in self.kv])

    def step(self, seqs: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        n = len(self._rows)
        if self._timeline + 1 > self.max_length or self._timeline - max(self._lengths) >= SLACK:
            self._compact()
        if n != self._decode_rows:
            self._bind_kv(self._decode, slice(0, n))
            self._decode_rows = n
        if sorted(seqs) != sorted(self._rows):  # every window must end at the shared timeline
            raise RuntimeError("a step feeds every joined sequence exactly once")
        T = self._timeline
        ids = np.zeros((n, 1), np.int64)
        mask = np.zeros((n, T + 1), np.int64)  # (n, T + 1): each row sees its own window and the new token
        pos = np.zeros((n, 1), np.int64)
        row_of = {seq: r for r, seq in enumerate(self._rows)}
        for seq, tok in zip(seqs, tokens, strict=True):
            r = row_of[seq]
            ids[r, 0], pos[r, 0] = tok, self._lengths[r]
            mask[r, T - self._lengths[r]:] = 1
        # a view of the decode binding's logits (no (n, V) copy per step, as generate's loop): read before the next
        logits = self._run(self._decode, ids, mask, pos)
        for seq in seqs:
            self._lengths[row_of[seq]] += 1
        self._timeline = T + 1
        order = [row_of[s] for s in seqs]
        # the engine feeds its rows in their order until one leaves: no copy then; after, one (n, V) copy
        return logits if order == list(range(n)) else logits[order]

    def remove(self, seq: int) -> None:
        self.prompt_logits.pop(seq, None)
        if seq not in self._rows:
            return  # removed mid-prefill: the scratch row is simply reused
        r, last = self._rows.index(seq), len(self._rows) - 1
        if r != last:  # keep rows dense: the last row's window moves into the hole
            self._copy_window(last, r, self._lengths[last], self._timeline)
            self._rows[r], self._lengths[r] = self._rows[last], self._lengths[last]
        self._rows.pop()
        self._lengths.pop()
        if not self._rows:
            self._timeline = 0

    # -- moving windows ------------------------------------------------------------------------------
    def _copy_window(self, src: int, dst: int, length: int, end: int, src_end: int | None = None) -> None:
        """Row src's positions [src_end - length, src_end) -> row dst's [end - length, end)."""
        src_end = end if src_end is None else src_end
        for buf in self.kv:
            buf[dst, :, end - length:end] = buf[src, :, src_end - length:src_end]  # overlap-safe in numpy

    def _join(self, seq: int, length: int, src: int | None = None, src_end: int | None = None) -> None:
        """A newcomer's window [src_end - length, src_end) of scratch row src becomes the next row's."""
        src = self.capacity if src is None else src
        src_end = length if src_end is None else src_end
        if length > self._timeline:  # the newcomer is longer than the timeline: every row moves right
            for r, held in enumerate(self._lengths):
                self._copy_window(r, r, held, length, src_end=self._timeline)
            self._timeline = length
        self._copy_window(src, len(self._rows), length, self._timeline, src_end=src_end)
        self._rows.append(seq)
        self._lengths.append(length)

    def _compact(self) -> None:
        """Move every window left so the longest one starts at 0 (the timeline is full, or SLACK unused)."""
        longest = max(self._lengths)
        for r, held in enumerate(self._lengths):
            self._copy_window(r, r, held, longest, src_end=self._timeline)
        self._timeline = longest
