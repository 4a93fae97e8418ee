"""The continuous batch on a GPU: every sequence owns a slot of one preallocated device cache for its whole life.

Slot s is row s of each layer's keys and values (capacity, nh, context, width) on the device. A sequence's
positions sit at the start of its row, [0, held_s), so joining, decoding and leaving never move a byte
between rows: the CPU's SlotPool keeps one shared timeline and copies windows on the host, which on a GPU
would mean a round trip through the host for every join. This needs the graph to read each row's length from
its own mask row (manifest wide_mask: export/graph_attention.timeline_lengths).

- prefill: the prompt runs alone (batch 1) over its slot's row, bound by device address; a long prompt in
  chunks, one per call of the generator, so running rows wait at most one chunk. A group of newcomers
  (prefill_group) shares one run where it can: left-padded into neighbouring slots, each slot's mask zero over its
  padding (start_s) and its positions counted from its first token.
- step: one decode run over the slots up to the highest in use, through a GraphDecoder of that many rows rounded
  up to a power of two (runtime/graphs/cuda_graph.py), so on a GPU the step is one replayed graph (step_picked also
  picks the greedy rows' tokens on the device: only rows that sample or report logprobs copy logits to the host). Every
  row's mask is ones on [start_s, held_s]: a joined row writes its new token at held_s; a row still prefilling or free
  writes a throwaway position at held_s, exactly where its own next run writes, so nothing it holds is touched.
- remove: the slot is free again; nothing is copied or cleared.

Shapes: input_ids / position_ids (capacity, 1), attention_mask (capacity, context), logits (capacity, 1, V).
On the CPU the same pool runs through one session (tests check it there against the other pools).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

import numpy as np

from .. import contract as C
from .cuda_graph import GraphDecoder
from .sequence_pool import Prefill, drain, prefill_runs


class DeviceSlotPool:
    def __init__(self, variant, capacity: int, max_length: int, decoder: GraphDecoder,
                 narrower: Callable[[int, GraphDecoder], GraphDecoder] | None = None):
        """narrower(rows, decoder): a decoder over the first `rows` rows of decoder's cache (KVBufferGraph.
        pool_decoder). With it a step runs only the rows up to the highest slot in use, through the smallest
        power-of-two-rows decoder that holds them: one client no longer pays for a step of `capacity` rows
        (GPT-2 small fp16 on an H100: 2.3 ms a step at 64 rows, 1.0 ms at one)."""
        if max_length > decoder.context or decoder.batch != capacity:
            raise ValueError(f"a pool of {capacity} x {max_length} needs a decoder of that size")
        self.variant, self.capacity, self.max_length = variant, capacity, decoder.context
        self.decoder = decoder
        decoder.held = 1  # every step is a decode step (GraphDecoder runs prefills through the ordinary session)
        self._narrower = narrower
        self._decoders = {capacity: decoder}  # rows -> the decoder stepping the first `rows` slots
        self._slot: dict[int, int] = {}  # seq -> slot, for joined and prefilling sequences
        self._joined: set[int] = set()
        self._free = list(range(capacity))  # a heap: the lowest free slot first, so the rows in use stay low
        self._held = np.zeros(capacity, np.int64)  # positions each slot holds
        self._start = np.zeros(capacity, np.int64)  # left padding before a slot's first token (a group's prefill)
        self._mask = np.zeros((capacity, self.max_length), np.int64)  # the step's mask: ones on [start_s, held_s]
        self._mask[:, 0] = 1
        kv0 = decoder.kv[0]
        self._row_bytes = int(np.prod(kv0.shape()[1:])) * np.dtype(variant.kv_dtype).itemsize
        self._kv_row_shape = [1, *kv0.shape()[1:]]  # (1, nh, context, width)
        self._prefill_logits = np.empty((1, 1, variant.shape.vocab_size), variant.logits_dtype)
        self._inputs: tuple[np.ndarray, ...] = ()
        self.keeps_prompt_logits = True
        self.pads_groups = True  # prefill_group takes `room` (the engine's rows' prompt + new tokens)
        self.prompt_logits: dict[int, np.ndarray] = {}  # seq -> (L, V) float32, from a keep_all prefill

    # -- one slot -------------------------------------------------------------------------------------
    def _bind_slot(self, slot: int, keep: int = 1, rows: int = 1):
        """A binding of the ordinary session over `rows` neighbouring rows of every cache from `slot` on (device
        addresses), logits to the host."""
        binding = self.variant.session.io_binding()
        device, shape = self.variant.kv_device, [rows, *self._kv_row_shape[1:]]
        for past, present, buf in zip(self.variant.names.past_names, self.variant.names.present_names, self.decoder.kv,
                                      strict=True):
            address = buf.data_ptr() + slot * self._row_bytes
            for bind, name in ((binding.bind_input, past), (binding.bind_output, present)):
                bind(name, device, 0, self.variant.kv_dtype, shape, address)
        self.variant.bind_keep(binding, keep)  # 0 (every position) only on a fresh binding: 0 may be left unbound
        logits = self._prefill_logits if rows == 1 else np.empty((rows, 1, self.variant.shape.vocab_size),
                                                                 self.variant.logits_dtype)
        binding.bind_output(C.LOGITS, "cpu", 0, logits.dtype, list(logits.shape), logits.ctypes.data)
        return binding, logits

    def _keep_all(self, slot: int, positions: int):
        """A binding of the slot with the LM head on every position of a run -> (binding, its logits buffer
        (1, positions, V))."""
        binding, _ = self._bind_slot(slot, 0)
        logits = np.empty((1, positions, self.variant.shape.vocab_size), self.variant.logits_dtype)
        binding.bind_output(C.LOGITS, "cpu", 0, logits.dtype, list(logits.shape), logits.ctypes.data)
        return binding, logits

    def _run_slot(self, binding, ids: np.ndarray, start: int, end: int) -> np.ndarray:
        self._inputs = (np.ascontiguousarray(ids[:, start:end]), np.ones((1, end), np.int64),
                        np.arange(start, end, dtype=np.int64)[None])
        for name, array in zip((C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS), self._inputs, strict=True):
            binding.bind_cpu_input(name, array)
        self.variant.session.run_with_iobinding(binding)
        return self._prefill_logits[0, -1].astype(np.float32)  # (V,)

    def _hold(self, slot: int, held: int) -> None:
        self._held[slot] = held
        self._mask[slot, self._start[slot]:held + 1] = 1  # a step writes this row's next position, held

    # -- the pool's interface ---------------------------------------------------------------------------
    def prefill(self, seq: int, prompt_ids: Sequence[int], chunk: int | None, *, keep_all: bool = False) -> Prefill:
        if not self._free:
            raise RuntimeError("sequence pool is full")  # the engine admits at most `capacity`
        if len(prompt_ids) >= self.max_length:
            raise RuntimeError(f"a prompt of {len(prompt_ids)} tokens leaves no room in {self.max_length} positions")
        slot = self._slot[seq] = heapq.heappop(self._free)
        self._hold(slot, 0)
        binding, _ = self._bind_slot(slot)
        ids = np.asarray(prompt_ids, dtype=np.int64)[None]  # (1, L)
        logits, kept = None, []
        for start, end in prefill_runs(ids.shape[1], chunk):
            # keep_all: a binding of this run's own, its logits `every` (1, end - start, V)
            run, every = self._keep_all(slot, end - start) if keep_all else (binding, None)
            logits = self._run_slot(run, ids, start, end)
            if every is not None:
                kept.append(every[0].astype(np.float32))
                logits = kept[-1][-1]
            self._hold(slot, end)
            if end < ids.shape[1]:
                yield  # a chunk done: the engine decodes the running batch before the next one
        self._joined.add(seq)
        if keep_all:
            self.prompt_logits[seq] = np.concatenate(kept)  # (L, V)
        return logits

    def prefill_group(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]], *,
                      keep_all: Sequence[bool] = (), room: Sequence[int] = ()) -> np.ndarray:
        """The prompts in one run where they can share it, the others one run each -> (k, V) in seqs' order
        (_prefill_rows says how)."""
        return np.stack(self._prefill_rows(seqs, prompts, keep_all, room, None))  # (k, V)

    def prefill_group_picked(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]],
                             needs_logits: Sequence[bool], *, keep_all: Sequence[bool] = (),
                             room: Sequence[int] = ()) -> list[np.ndarray | int]:
        """prefill_group, with the first tokens picked where the logits are (as step_picked) when no row of a shared
        run is flagged in needs_logits -> per row in seqs' order its greedy token (int), or its logits (V,) float32
        (a run with a flagged row, or a row that ran alone). For 64 32-token prompts on a GPU, copying the shared
        run's (64, V) fp16 logits to the host, converting and stacking them took ~13 ms of the engine thread's time
        (8 + 5 on this repo's Zen 4 CPU), ~3x the run."""
        return self._prefill_rows(seqs, prompts, keep_all, room, needs_logits)

    def _prefill_rows(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]], keep_all: Sequence[bool],
                      room: Sequence[int], needs_logits: Sequence[bool] | None) -> list[np.ndarray | int]:
        """The prompts in one run where they can share it, the others one run each -> per row its logits (V,), or its
        greedy token where needs_logits says it may be picked (None: logits for every row).

        A prefill through the ordinary (uncaptured) session is launch-bound on a GPU: GPT-2 small fp16 took ~3 ms a
        run on an H100 whatever its size, so a burst of newcomers prefilled one by one held the running rows (and
        the last newcomer's first token) for k runs. Sharing rows go left-padded to the longest into neighbouring
        free slots, each slot's mask zero over its padding (start_s) and its positions counted from its first
        token, as generate's left-padded batches are. A row runs alone when it keeps its prompt logits, or when its
        padding would leave it too little room: room[i] is the positions row i may come to hold (its prompt and
        new tokens; by default the whole context, so only rows as long as the longest share); and all run alone
        when no neighbouring free slots hold the sharing ones."""
        k = len(seqs)
        if k > len(self._free):
            raise RuntimeError(f"a group of {k} does not fit the pool's {len(self._free)} free slots")
        keep = list(keep_all) or [False] * k
        need = list(room) or [self.max_length] * k
        candidates = [i for i in range(k) if not keep[i]]
        longest = max((len(prompts[i]) for i in candidates), default=0)
        together = [i for i in candidates if longest - len(prompts[i]) + need[i] <= self.max_length]
        first = self._neighbours(len(together)) if len(together) > 1 else None
        out: list[np.ndarray | int | None] = [None] * k
        if first is not None:
            logits = None if needs_logits is None else [needs_logits[i] for i in together]
            rows = self._prefill_together([seqs[i] for i in together], [prompts[i] for i in together], first, logits)
            for i, row in zip(together, rows, strict=True):
                out[i] = row
        for i in range(k):
            if out[i] is None:
                out[i] = drain(self.prefill(seqs[i], prompts[i], None, keep_all=keep[i]))
        return out

    def _neighbours(self, n: int) -> int | None:
        """The lowest of n neighbouring free slots, taken off the free heap; None when there are none."""
        free, run = set(self._free), 0
        for slot in range(self.capacity):
            run = run + 1 if slot in free else 0
            if run == n:
                first = slot - n + 1
                self._free = [s for s in self._free if not first <= s <= slot]
                heapq.heapify(self._free)
                return first
        return None

    def _prefill_together(self, seqs: Sequence[int], prompts: Sequence[Sequence[int]], first: int,
                          needs_logits: Sequence[bool] | None = None) -> list[np.ndarray | int]:
        """One run of m prompts into slots first .. first + m - 1 -> per row its logits (V,) float32, or its greedy
        token when needs_logits flags none and the pool picks on the device. ids, mask, positions (m, S), S the
        longest prompt, each prompt at the right end of its row."""
        m, longest = len(seqs), max(len(p) for p in prompts)
        for r, seq in enumerate(seqs):  # theirs before the run: a run that fails frees them through remove()
            self._slot[seq] = first + r
        if longest >= self.max_length:
            raise RuntimeError(f"a prompt of {longest} tokens leaves no room in {self.max_length} positions")
        ids, mask, pos = (np.zeros((m, longest), np.int64) for _ in range(3))
        for r, prompt in enumerate(prompts):
            pad = longest - len(prompt)
            ids[r, pad:], mask[r, pad:], pos[r, pad:] = prompt, 1, np.arange(len(prompt))
        binding, logits = self._bind_slot(first, 1, m)
        # only when no row needs its logits: the device buffer comes over whole (capacity rows), the host binding
        # brings exactly these m rows (a mixed group takes the host path, as before)
        picking = needs_logits is not None and self.variant.pick_on_device and not any(needs_logits)
        if picking:  # the logits stay where they are computed, in the first m rows of the decoder's (capacity, 1, V)
            # buffer (no step reads it before the next step writes it), picked there by the ArgMax session
            binding.bind_output(C.LOGITS, self.variant.kv_device, 0, self.variant.logits_dtype,
                                [m, 1, self.variant.shape.vocab_size], self.decoder.logits.data_ptr())
        self._inputs = (ids, mask, pos)  # read in place by the run
        for name, array in zip((C.INPUT_IDS, C.ATTENTION_MASK, C.POSITION_IDS), self._inputs, strict=True):
            binding.bind_cpu_input(name, array)
        self.variant.session.run_with_iobinding(binding)
        for r, (seq, prompt) in enumerate(zip(seqs, prompts, strict=True)):
            slot = first + r
            self._start[slot] = longest - len(prompt)
            self._mask[slot] = 0
            self._hold(slot, longest)
            self._joined.add(seq)
        if not picking:
            return list(logits[:, -1].astype(np.float32))  # m x (V,)
        return self.decoder.pick_logits()[:m].tolist()  # m greedy first tokens

    def _advance(self, seqs: Sequence[int], tokens: np.ndarray) -> tuple[list[int], GraphDecoder]:
        """One decode run over the slots up to the highest joined one, each joined row fed its token -> the rows'
        slots in seqs' order, and the decoder that ran (its logits and picks are the rows' up to its batch)."""
        if set(seqs) != self._joined or len(seqs) != len(self._joined):
            raise RuntimeError("a step feeds every joined sequence exactly once")
        ids = np.zeros((self.capacity, 1), np.int64)
        pos = (self._held - self._start)[:, None]  # (capacity, 1): each row's next position (throwaway rows too)
        slots = [self._slot[s] for s in seqs]
        at = np.array(slots, np.int64)  # (n,) the rows' slots, as an index: the host's work per step in numpy, not
        held = self._held[at] + 1  # a Python loop over rows (it delays the next step: ~80 us for 64 rows before)
        if (held > self.max_length).any():
            raise RuntimeError("a sequence is at the end of the cache")
        ids[at, 0] = np.asarray(tokens, dtype=np.int64)
        decoder = self._stepping(int(at.max()) + 1)
        rows = decoder.batch  # (rows, 1) ids and positions, (rows, context) mask: slots past `rows` are left alone
        decoder.step(ids[:rows], self._mask[:rows], pos[:rows])
        # _hold for every row at once: the mask is ones on [start, held] already, so only the new column is set
        self._held[at] = held
        room = held < self.max_length
        self._mask[at[room], held[room]] = 1
        return slots, decoder

    def _stepping(self, needed: int) -> GraphDecoder:
        """The decoder of the fewest rows (a power of two, or capacity) holding the first `needed` slots."""
        if self._narrower is None:
            return self.decoder
        rows = min(self.capacity, 1 << (needed - 1).bit_length())
        decoder = self._decoders.get(rows)
        if decoder is None:
            decoder = self._decoders[rows] = self._narrower(rows, self.decoder)
            decoder.held = 1
        return decoder

    def step(self, seqs: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        slots, decoder = self._advance(seqs, tokens)
        # (n, V) in seqs' order: only theirs converted
        return decoder.logits.numpy()[slots, -1, :].astype(np.float32)

    def step_picked(self, seqs: Sequence[int], tokens: np.ndarray,
                    needs_logits: Sequence[bool]) -> tuple[np.ndarray, np.ndarray | None]:
        """step(), with each row's greedy token picked where the logits are (the decoder's ArgMax: on a GPU only
        the ids cross to the host, (capacity,) int64 instead of (capacity, V) logits) -> (picked (n,) int64 in
        seqs' order, the logits (m, V) float32 of the m rows flagged in needs_logits, or None when m == 0).

        A server's greedy rows (no logprobs, no grammar, no penalty) need nothing else; copying and converting
        every row's logits cost more host time per step than the step itself on an H100 (64 x 50,257 fp16)."""
        slots, decoder = self._advance(seqs, tokens)
        picked = decoder.pick()[slots]  # (n,): a copy, the decoder's buffer is overwritten by the next pick
        wanted = [s for s, needs in zip(slots, needs_logits, strict=True) if needs]
        if not wanted:
            return picked, None
        return picked, decoder.logits.numpy()[wanted, -1, :].astype(np.float32)  # (m, V)

    def room_to_step(self) -> bool:
        """Every joined row has room for one more position (what a step writes), so a step may run before the
        engine has read the last one's tokens (serving/step_ahead.py). Free and prefilling slots hold fewer positions
        than the cache (a prompt leaves room), so all slots are checked at once, not one joined row at a time."""
        return bool((self._held < self.max_length).all())

    def remove(self, seq: int) -> None:
        self.prompt_logits.pop(seq, None)
        slot = self._slot.pop(seq, None)
        if slot is None:
            return
        self._joined.discard(seq)
        self._mask[slot] = 0
        self._start[slot] = 0
        self._hold(slot, 0)
        heapq.heappush(self._free, slot)
