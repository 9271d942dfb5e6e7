"""A prompt of several chunks run layer by layer (policy.layer_major, ours): every chunk through a layer before any
goes on to the next, each layer's routed experts copied into the expert cache once for all its chunks.

`Admissions` owns the cache's slots while such a prompt runs: the slots the prompt does not borrow hold the current
layer's experts, and the next layer's likely ones where room is left; at the end every slot gets its decode
resident back (ExpertCache.rehome). A copy into a slot waits for the compute that last read it (the launch group of
its layer's last chunk, or that layer's end); compute reads an admitted slot only after its copy's event. `run` is
the engine's loop.
Legend: T prompt tokens, Tc a chunk's tokens, D hidden, E experts, L layers.
"""

from __future__ import annotations

import time

import numpy as np

from strata.accel.buffers import ALIGN, Carver, attn_scratch_bytes, carve, layout_bytes
from strata.accel.deferred import Lazy
from strata.accel.moe import ExpertRunner
from strata.models.common import head
from strata.policy.layer_major import layer_major_chunk, victims
from strata.policy.stream import Walk, unrouted_waste, walk_for

LAYER_MAJOR = Walk.LAYER_MAJOR.value      # the walk's name in Stats.chunks


COPY_BATCH = 8      # copies an event covers: a group waits for the batch of its newest expert, not the whole admission


class Admissions:
    def __init__(self, dev, cache, arena, routes, chunk: int, count_waste: bool = False):
        self.dev, self.cache, self.arena, self.routes, self.chunk = dev, cache, arena, routes, chunk
        self.home = list(cache.owner[:cache.usable])      # the decode residency to give back
        # what stream-all's queue would have held and left unrouted (policy.StreamWaste, as a refused chunk counts
        # it), against the residency the prompt started from: routing that turns dense goes back to stream-all
        self.waste = [0, 0] if count_waste else None
        self.home_res = cache.slot_of >= 0                # [L, E]
        # when a slot's last reader in this prompt ends: (number, compute event), numbered in recording order.
        # A layer's last chunk records them: an event at its routing sync for the slots it does not route, one
        # after each launch group's last read of its blobs for the rest (ExpertRunner.group's on_released), so
        # the next layer's copies start as the groups pass, not once the whole layer has ended
        self.free_no = np.zeros(cache.usable, np.int64)   # [slots] that event's number (0: none recorded)
        self.free_ev: list = [None] * cache.usable        # [slots] the event
        self.done: dict[int, tuple[int, object]] = {}     # layer -> (number, event) after its last chunk's compute
        # [slots] the layer whose expert each slot holds (-1: none), kept beside cache.owner as admit changes it:
        # the victims' choice reads it a few times a chunk, where a pass over cache.owner cost ~10 us a call
        self.own = np.fromiter((-1 if o is None else o[0] for o in self.home), np.int64, cache.usable)
        self.events = 0
        self.last = False                                 # the chunk running is its layer's last
        self.landed: dict[int, tuple[int, object]] = {}   # slot -> (copy number, the event after its batch)
        self.waited = 0                                   # compute waits for every copy up to this number
        self.pending: dict[int, tuple[int, object]] = {}  # this chunk's routed experts still in flight
        self.queue: list[int] = []                        # the next layer's guessed experts not admitted yet
        self.copies = 0
        self.bytes_in = 0

    def _owners(self) -> np.ndarray:
        return self.own.copy()

    def admit(self, layer: int, experts, protect: tuple[int, ...]) -> int:
        """Copy experts (non-resident ones of `layer`) into the best victim slots (policy.layer_major.victims),
        each copy after the compute that last read its slot. Returns how many were admitted (fewer when the
        victims run out: the rest stay non-resident)."""
        if not len(experts):
            return 0
        owners = self._owners()
        slots = victims(owners, layer, protect, self._ready(owners))[:len(experts)].tolist()
        cache, dev = self.cache, self.dev
        waited, batch = 0, []
        for i, (e, s) in enumerate(zip(experts, slots)):
            got = self._freed(s, owners[s])
            if got is not None and got[0] > waited:           # victims come in the order they free: waits in order
                dev.copy.wait(got[1])
                waited = got[0]
            self.free_no[s], self.free_ev[s] = 0, None
            cache.put(s, layer, int(e), self.arena)
            self.own[s] = layer
            self.copies += 1
            batch.append(s)
            if len(batch) == COPY_BATCH or i == len(slots) - 1:
                done = dev.event(timing=False)
                done.record(dev.copy)
                for b in batch:
                    self.landed[b] = (self.copies, done)
                batch = []
        self.bytes_in += len(slots) * cache.slot_bytes
        return len(slots)

    def _freed(self, slot: int, owner_layer: int):
        """(number, event) after the last read of `slot` in this prompt, None where nothing waits (an empty slot,
        or one of a layer not run yet)."""
        if self.free_no[slot]:
            return int(self.free_no[slot]), self.free_ev[slot]
        return self.done.get(owner_layer)

    def _ready(self, owners: np.ndarray) -> np.ndarray:
        """[slots] when each slot of a run layer comes free (its event's number; 0: now), victims' order: as
        _freed, for every slot at once."""
        done = np.zeros(max(int(owners.max(initial=-1)), max(self.done, default=-1)) + 2, np.int64)
        for l, (no, _) in self.done.items():
            done[l] = no
        return np.where(self.free_no > 0, self.free_no, np.where(owners >= 0, done[owners], 0))

    def _record(self) -> tuple[int, object]:
        ev = self.dev.event(timing=False)
        ev.record(self.dev.compute)
        self.events += 1
        return self.events, ev

    def released(self, layer: int, members) -> None:
        """A launch group of a layer's last chunk has read its blobs (enqueued): their slots free after it."""
        got = self._record()
        for e in members:
            s = int(self.cache.slot_of[layer, e])
            self.free_no[s], self.free_ev[s] = got

    def guess(self, layer: int, protect: tuple[int, ...]) -> None:
        """Queue the experts `layer` likely routes in a chunk (policy.guess at the chunk's tokens), as many as
        victim slots allow; `prefetch` admits them."""
        room = len(victims(self._owners(), layer, protect))
        self.queue = self.routes.guess(layer, self.chunk, self.cache.resident(layer), room)

    def prefetch(self, layer: int, protect: tuple[int, ...], share: float = 1.0) -> int:
        """Admit a share of the queued guesses for `layer` (the ones still non-resident): spread over the chunks of
        the layer before, so that an admission of that layer's own waits behind few of them on the copy stream."""
        res = self.cache.resident(layer)
        q = [e for e in self.queue if not res[e]]
        take = q[:max(1, round(share * len(q)))] if q else []
        self.queue = q[len(take):]
        return self.admit(layer, take, protect)

    def routed(self, layer: int, cnt: np.ndarray) -> list[int]:
        """At a chunk's routing sync: admit the routed experts not resident yet. Returns the routed experts whose
        copies compute has not waited for yet (`before_group` waits for them group by group)."""
        if self.waste is not None:
            n, u = unrouted_waste(cnt, self.home_res[layer])
            self.waste[0] += n
            self.waste[1] += u
        need = np.flatnonzero((cnt > 0) & ~self.cache.resident(layer))
        got = self.admit(layer, need, (layer,))
        if self.last:                  # the slots this chunk does not read are free after the chunks before it
            mark = self._record()
            for s in self.cache.slot_of[layer][self.cache.slot_of[layer] >= 0].tolist():
                self.free_no[s], self.free_ev[s] = mark
        assert got == len(need), f"layer {layer}: {len(need)} experts to admit, room for {got} (kept slots < E)"
        self.pending = {}
        for e in np.flatnonzero(cnt > 0).tolist():
            got = self.landed.get(int(self.cache.slot_of[layer, e]))
            if got is not None and got[0] > self.waited:
                self.pending[e] = got
        return list(self.pending)

    def before_group(self, members) -> None:
        """Compute waits for the newest copy among a group's members still in flight (copies land in order)."""
        newest = None
        for e in members:
            got = self.pending.pop(e, None)
            if got is not None and (newest is None or got[0] > newest[0]):
                newest = got
        if newest is not None and newest[0] > self.waited:
            self.dev.compute.wait(newest[1])
            self.waited = newest[0]

    def layer_done(self, layer: int) -> None:
        self.done[layer] = self._record()

    def end(self, after_event) -> int:
        """Every slot's decode resident back once `after_event` (the prompt's last compute) has completed."""
        return self.cache.rehome(self.home, self.arena, after_event)


def choose(eng, n: int) -> tuple[int, int, bool] | None:
    """(chunk, loan, stream-all refused) where a prompt of n tokens runs layer by layer (policy.layer_major), else
    None. Only in place of routed-only chunks: where the stream-all walk would take them (broad routing: its queue
    mostly routed), its copies already overlap the compute of every layer, and layer by layer a layer's copies wait
    for the layer before (flash-shape's 8K prompt 0.80x on the H200, bench/results/h200/ab_lm_f8_stop37a.log). Not
    for routed-only chunks the CPU share takes part in (not measured against it), nor where every expert is
    resident (nothing streams either way)."""
    c, p = eng.cfg, eng.plan
    if n <= p.chunk or not eng.config.prompt_layer_major or (
            p.owned_prompt and eng.cache.n_resident() == c.n_layer * c.n_expert):
        return None                  # one chunk: nothing to share between chunks (policy.layer_major_chunk)
    _, ring, _, _ = p.for_prompt(eng.config, eng.share, n)
    walk = walk_for(eng.config, eng.share, min(n, p.chunk), ring)
    refused = walk is Walk.STREAM_ALL
    if refused and eng.stream_waste.dense:
        return None
    if not refused and eng.cpu_block is not None and eng.share.on:
        return None                  # routed-only chunks the CPU shares (SPEC §4) stay chunk by chunk
    got = chunking(eng, n, p.chunk)
    return None if got is None else (*got, refused)


def chunking(eng, n: int, chunk: int) -> tuple[int, int] | None:
    """policy.layer_major_chunk on eng's plan: (chunk, loan) of n tokens in chunks of at most `chunk`, or None."""
    c, p = eng.cfg, eng.plan
    return layer_major_chunk(n, chunk, eng.cache.n_slots, p.slot_bytes, p.loan_slots, c.n_expert,
                             lambda t: layout_bytes(c, t, eng.dbufs.group, attn_scratch_bytes(c, t, eng.n_ctx), False,
                                                    False),
                             n * c.n_embd * 4 + ALIGN, p.prompt_bytes if p.owned_prompt else None)


def _layer_end(eng, adm: Admissions, layer: int, chunks: int, chunk: int, t0: float) -> None:
    """After a layer's last MoE block is issued: its slots free after it, the rest of the next layer's guesses
    into them."""
    n_layer = eng.cfg.n_layer
    adm.layer_done(layer)
    if layer + 1 < n_layer:
        adm.guess(layer + 1, (layer + 1,))
        adm.prefetch(layer + 1, (layer + 1,))
    if eng.progress:
        eng.progress(f"prefill: layer {layer + 1} of {n_layer} over {chunks} chunks of up to {chunk} tokens, "
                     f"{adm.copies} experts streamed, {(time.perf_counter() - t0) * 1e3:.1f} ms")


def run(eng, tokens: list[int], region, chunk: int, all_logits: bool, count_waste: bool = False):
    """The prompt through every layer, chunk by chunk within a layer; logits of the last token [1, V] (or every
    token's [T, V]) on the host. `region`: the borrowed (or owned) bytes: one chunk's step buffers, then every
    chunk's residual stream xs [T, D] f32."""
    c, dev, k = eng.cfg, eng.dev, eng.dev.k
    T = len(tokens)
    carver = Carver(dev, region)
    # the weight scratch is decode's (its groups of GROUP experts; idle while a prompt runs): the loan holds
    # rows, not a second scratch, so the chunks are larger and dequantise each layer's experts fewer times
    d = eng.dbufs
    bufs = carve(c, chunk, d.group, attn_scratch_bytes(c, chunk, eng.n_ctx), carver, (d.w_gu, d.w_d), x=False)
    xs = carver.take((T, c.n_embd), np.float32)                                   # [T, D]
    spans = [(a, min(a + chunk, T)) for a in range(0, T, chunk)]
    if eng.cache.poll():             # the last prompt's refill in flight: its slots hold no one resident yet
        dev.copy.synchronize()
        eng.cache.poll()
    eng._runner = ExpertRunner(dev, c, eng.arena.types, bufs, eng.few_rows, fused=eng.gemm_q_types)
    eng._ring, eng._walk, eng._pre, eng._counted, eng._shareable = None, None, None, None, False
    adm = eng._admissions = Admissions(dev, eng.cache, eng.arena, eng.routes, chunk, count_waste)
    pos0, chunk0 = eng.pos, eng.n_chunks
    t0 = time.perf_counter()
    eng._decode = False
    ok = False
    try:
        with dev.on(dev.compute):
            adm.guess(0, (0,))
            adm.prefetch(0, (0,))                  # layer 0's copies go out while the rows are gathered
            pos_dev = k.upload(np.arange(pos0, pos0 + T, dtype=np.int32), dev.compute)        # [T]
            for a, b in spans:
                eng.ops.begin(bufs, pos0 + a, b - a, pos_dev=pos_dev[a:b])
                eng.ops.embed("token_embd.weight", tokens[a:b], out=xs[a:b])
            for layer in range(c.n_layer):
                for j, (a, b) in enumerate(spans):
                    eng.pos, eng.n_chunks = pos0 + a, chunk0 + j        # a routing trace's chunk and position
                    eng.ops.begin(bufs, pos0 + a, b - a, pos_dev=pos_dev[a:b])
                    adm.last = j + 1 == len(spans)
                    # a chunk's MoE block waits for the next chunk's dense part (deferred.py): the next layer's
                    # first chunk's for a layer's last; the prompt's last block runs in place
                    eng._defer = eng.defer_blocks and not (adm.last and layer + 1 == c.n_layer)
                    eng.join_side(pos0 + a)      # the chunk's rows from its block of the layer before
                    y = eng.model.forward_block(eng.ops, xs[a:b], layer, np.arange(pos0 + a, pos0 + b))
                    if isinstance(y, Lazy):          # on the stream the block runs on (dev.compute as it issues)
                        y.block.then(lambda dst, src: k.copy(dst, src, dev.compute), xs[a:b], y)
                    else:
                        k.copy(xs[a:b], y, dev.compute)
                    if layer + 1 < c.n_layer and j + 1 < len(spans):
                        # the room this layer leaves takes the next one's likely experts, a share after each chunk
                        if j == 0:
                            adm.guess(layer + 1, (layer, layer + 1))
                        adm.prefetch(layer + 1, (layer, layer + 1), 1 / (len(spans) - 1 - j))
                # the layer's end once its last block is issued (its slots free after that block's groups)
                ended = (lambda l=layer: _layer_end(eng, adm, l, len(spans), chunk, t0))
                if eng._deferred is not None:
                    eng._deferred.then(ended)
                else:
                    ended()
            eng.join_side()
            # every chunk's logits as the chunk-by-chunk engine takes them (a head over a chunk's rows: the head's
            # product over other row counts is another GEMM shape, with other bits), or the last token's
            logits = [head(eng.ops, c, xs[a:b]) for a, b in spans] if all_logits else [head(eng.ops, c, xs[T - 1:T])]
            if eng.cpu_block is not None:
                eng.cpu_block.settle()
        out = np.concatenate([dev.tohost(x) for x in logits])                       # [T or 1, V]
        ok = True
    finally:
        eng._defer, eng._deferred = False, None
        eng.join_side()
        eng.pos, eng.n_chunks = pos0 + (T if ok else 0), chunk0 + (len(spans) if ok else 0)
        ev = dev.event(timing=False)
        ev.record(dev.compute)
        adm.end(ev)
        eng._admissions = None
    if adm.waste is not None:
        eng._note_waste(*adm.waste, streamed=False)
    eng.stats.streamed_bytes += adm.bytes_in
    eng.stats.streamed_experts += adm.copies
    for a, b in spans:
        eng.stats.chunks.append((b - a, LAYER_MAJOR, adm.copies if a == 0 else 0))
    return out
