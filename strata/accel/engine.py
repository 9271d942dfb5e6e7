"""The GPU engine: a MoE model whose experts do not fit in VRAM (SPEC §3, §7, §8, §9).

Owners: `ExpertCache` (residency), `Arena` (pinned blobs), `Ring`/`Walk` (streaming), `ExpertRunner` (expert
groups), `DeviceOps` (dense ops for the model files), `PromptGraphs` (a prompt's dense parts as captured graphs).
This file is the loop: per chunk, pick the walk; per layer, the model file's block runs on DeviceOps (or a chunk's
SegmentOps) and calls back into `moe()` (moe_block.py) for the routed experts.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np

from strata import policy
from strata.accel import layer_major, prompt_graph
from strata.accel.arena import PROGRESS_BYTES, Arena
from strata.accel.buffers import SIDE_PENDING, Carver, attn_scratch_bytes, carve, carve_prompt
from strata.accel.cache import ExpertCache, uniform_order
from strata.accel.dense import DenseWeights, DeviceOps, dense_bytes
from strata.accel.gpu.kernels import ROUTE_TILE
from strata.accel.memplan import (DECODE_SCRATCH, GROUP, MAXT, MIB, PROMPT_GROUPS, RESERVE_MIB, MemoryPlan,
                                  VramShortfall, plan_memory)
from strata.accel.moe import FEW_ROWS, ExpertRunner
from strata.accel.moe_block import MoeBlock
from strata.accel.presync import BLOB_PARTS, PRE_MIN_TOKENS_EAGER, PlanLayout, PreGraphs
from strata.accel.stream import Ring, Walk
from strata.models import Model
from strata.models.common import head
from strata.policy.guess import RouteMemory
from strata.policy.stream import (ROUTED_ONLY_RING, STREAM_ALL_PROBE, STREAM_ALL_PROBE_MAX, StreamWaste,
                                  Walk as WalkKind, stream_all_queue, walk_for)


@dataclass
class Stats:
    prompt_tokens: int = 0
    prompt_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    streamed_bytes: int = 0
    streamed_experts: int = 0
    sync_wait_s: float = 0.0   # host time blocked in routing syncs (the rest of a step is host work)
    layout_s: float = 0.0      # prompt layers' host time from the routing sync to the first launch group (the
    layouts: int = 0           # choice, first copies, row layout, tables): the simulator's group_us, measured
    lookups: int = 0           # routed (layer, expert) pairs during decode
    hits: int = 0              # of which resident
    tier_moves: int = 0        # adaptive-tier admissions (SPEC §7)
    loan_slots: int = 0        # cache slots the last prompt borrowed (policy.prompt_loan)
    guessed: int = 0           # experts streamed before their layer's routing sync on a guess (policy.guess)
    guessed_unrouted: int = 0  # of which the sync found unrouted
    guessed_missed: int = 0    # routed non-resident experts of a guessed layer that its guess left out
    chunks: list = field(default_factory=list)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0


class GpuEngine(MoeBlock):
    def __init__(self, model: Model, dev, *, n_ctx: int = 4096, vram_budget: int | None = None,
                 expert_cache: int | None = None, reserve_mib: int = RESERVE_MIB, chunk: int | None = None,
                 profile_order: list[tuple[int, int]] | None = None, config: policy.Config | None = None,
                 log=None, arena: Arena | None = None, pool=None, few_rows: int = FEW_ROWS,
                 prompt_groups: tuple[int, ...] = PROMPT_GROUPS, progress=None):
        self.model, self.cfg, self.dev, self.k = model, model.cfg, dev, dev.k
        self.config = config or policy.Config()
        self.log = log or (lambda s: None)
        # long work's lines (pinning the arena, uploading the dense weights, a prompt of several chunks) go here
        # even where the other lines (log) do not: `generate` shows them without --stats
        self.progress = progress
        self.n_ctx = n_ctx
        loans = self.config.loan_switches()   # SPEC §9's loans of decode-only VRAM: not built here (sim/ models them)
        if loans:
            (progress or self.log)(f"{', '.join(loans)}: this engine does not lend decode-only VRAM to a prompt yet "
                                   f"(the simulator models it); the switch changes nothing")
        self.few_rows = few_rows          # experts of at most this many rows run from their blobs (moe.py)
        if self.config.dbg_link_gbps:
            dev.emulate_link(self.config.dbg_link_gbps)
            ticks = dev.link_ticks_per_ns
            self.log(f"link: every host->device copy held to {self.config.dbg_link_gbps:g} GB/s "
                     f"(STRATA_DBG_LINK_GBPS, an emulated slower PCIe)"
                     + (f"; timer {ticks:.4f} ticks/ns" if ticks else ""))
        graphs = self.config.prompt_graph and prompt_graph.usable(dev, model.cfg)
        self.plan: MemoryPlan = plan_memory(model, dev.free_bytes(), n_ctx=n_ctx, vram_budget=vram_budget,
                                            reserve_mib=reserve_mib, expert_cache=expert_cache, chunk=chunk,
                                            lend_pct=self.config.lend_pct, groups=prompt_groups, graphs=graphs)
        for line in self.plan.lines():
            self.log(line)
        c = self.cfg
        self.arena = arena or Arena(model, dev, log=log or self._long(Arena.bytes_of(model)))   # may be shared
        self.weights = DenseWeights(model, dev, log=log or self._long(dense_bytes(model)))
        self.kv = [(dev.zeros((n_ctx, c.n_head_kv, c.head_dim), np.float16),
                    dev.zeros((n_ctx, c.n_head_kv, c.head_dim), np.float16)) for _ in range(c.n_layer)]
        p = self.plan
        self.cache = ExpertCache(dev, p.cache_slots, p.slot_bytes, c.n_layer, c.n_expert)
        n = self.cache.fill(profile_order or uniform_order(c.n_layer, c.n_expert), self.arena)
        self.log(f"cache: {n} of {c.n_layer * c.n_expert} experts resident "
                 f"({'profile' if profile_order else 'uniform'} order), {p.cache_slots} slots")
        # decode-only resources: their own step buffers and an 8-slot ring
        self.dbufs = carve(c, MAXT, GROUP, attn_scratch_bytes(c, MAXT, n_ctx), Carver(dev))
        # the weight types whose many-row experts' GEMM reads their blobs (Kernels.gemm_q; STRATA_GEMM_Q=0: none)
        self.gemm_q_types = dev.k.gemm_q_types if self.config.gemm_q else frozenset()
        self.drunner = ExpertRunner(dev, c, self.arena.types, self.dbufs, few_rows, fused=self.gemm_q_types)
        self.dring = Ring(dev, dev.empty((ROUTED_ONLY_RING, p.slot_bytes), np.uint8))
        self.prompt_region = None
        if p.owned_prompt:
            self.prompt_region = dev.empty((p.prompt_bytes,), np.uint8)
        self.ops = DeviceOps(model, dev, self.weights, self.kv, n_ctx, cap=max(p.chunk, MAXT))
        self.ops.moe = self.moe
        # a prompt chunk's dense parts as captured graphs (prompt_graph.py); None: issued op by op
        self.pgraphs = prompt_graph.PromptGraphs(dev, c, p.chunk, n_ctx) if graphs else None
        # and a prompt layer's pre-sync launch groups (presync.PreGraphs); None: launched one by one
        self.pre_graphs = PreGraphs(dev) if graphs else None
        # plan_groups' input, written by the host before each layer's pre-sync groups: one block a layer parity
        # (MoeBlock._issue_pre), at fixed addresses so that a captured plan re-reads it
        lay = PlanLayout(c.n_expert, BLOB_PARTS)
        self.plan_in = [(dev.pinned(lay.nbytes), dev.empty((lay.nbytes,), np.uint8)) for _ in range(2)]
        if self.pre_graphs is None:             # launched one by one, short chunks' groups cost more than they give
            self.pre_min_tokens = PRE_MIN_TOKENS_EAGER
        # the CPU expert pool: decode misses, and the prefill share where it qualifies (CUDA, one GPU; SPEC §4)
        self.pool = pool
        self.share = self.config.share(qualifies=dev.kind == "cuda" and pool is not None)
        self.cpu_block = None
        if pool is not None:
            from strata.accel.cpu_block import CpuBlock

            self._warm_pool(pool)
            self.cpu_block = CpuBlock(dev, c, self.arena, pool, self.share, self.config, max(p.chunk, MAXT))
            if self.share.by_default:
                self.log("prefill CPU share: auto, on by default on one CUDA GPU (STRATA_PREFILL_CPU_SHARE=0 "
                         "turns it off); the pool also takes decode misses on the per-layer decode path")
        # the adaptive tier (SPEC §7): usage counted in decode, moves between rounds
        self.tier = policy.TIERS.create(policy.TierKind.ADAPTIVE, c.n_layer, c.n_expert)
        self.ids_host = dev.pinned(max(p.chunk, MAXT) * c.n_expert_used * 4).view(np.int32)
        # the routing's counts by tile of pairs, what a layer whose rows the device lays out downloads (moe_block)
        self.hist_host = dev.pinned(-(-max(p.chunk, MAXT) * c.n_expert_used // ROUTE_TILE) * c.n_expert * 4
                                    ).view(np.int32)
        self.sync_ev = dev.event(timing=False)
        self.pos = 0
        self.n_chunks = 0                 # steps run (a routing trace's chunk index)
        self.stream_waste = StreamWaste()   # may a chunk take the stream-all walk (policy.stream, ours)
        self._unrouted = 0                  # this stream-all chunk's unrouted queue entries
        self._counted = None                # a refused chunk's [entries, unrouted] of stream-all's queue
        self._shareable = False             # this prompt chunk may share experts with the CPU pool (SPEC §4)
        self.on_routing = None            # (layer, ids [T, K]) after each routing sync: --dump-routing
        self.stats = Stats()
        self._walk: Walk | None = None
        self._ring: Ring | None = None
        self._runner: ExpertRunner | None = None
        self._layer_entries: dict[int, range] = {}
        # routed-only prompt chunks stream each layer's likely experts before its routing sync (policy.guess): the
        # memory is of recent prompts' routing, kept across prompts and resets; _pre: (layer, the guessed walk)
        self.guess = self.config.prompt_guess
        self.routes = RouteMemory(c.n_layer, c.n_expert)
        self._pre: tuple[int, Walk] | None = None
        self._admissions = None     # a layer-major prompt's cache admissions (layer_major.py), None otherwise
        # a layer-major chunk's MoE block waits for the next chunk's dense part (deferred.py): _defer while the
        # model code runs such a chunk, _deferred the block waiting; defer_blocks=False issues each in place
        self.defer_blocks, self._defer, self._deferred = True, False, None
        # ... and is issued on the device's side stream, beside the next chunks' dense parts (moe_block._beside;
        # qwen3's quarter cache 1.19x at 8K, bench/results/h200/ab_side_q8_stop40.log): _side_ends, the blocks the
        # compute stream has not waited for yet, (chunk position, end event, block); side_blocks=False: on compute.
        # At most side_pending of them: each keeps its inputs (2 [T, D] f32), priced by buffers.temp_bytes
        self.side_blocks, self._side_ends, self.side_pending = True, [], SIDE_PENDING
        self.h2d_gbps = self._probe_h2d()      # the decode cost model's PCIe side
        if self.cpu_block is not None and self.share.on and self.cpu_block.auto:
            self._prime_share()
        self.dgraph = None                     # single-token decode as one captured graph (decode_graph.py)
        longest = max(self.cfg.n_embd, self.cfg.n_ff_exp)
        if self.config.decode_graph and self.config.dbg_link_gbps:
            self.log("decode: per layer (an emulated link cannot hold the decode graph's direct PCIe reads)")
        elif self.config.decode_graph and longest > dev.k.moe_gemv_max_k:
            self.log(f"decode: per layer (expert rows of {longest} weights exceed the decode graph's "
                     f"{dev.k.moe_gemv_max_k})")
        elif self.config.decode_graph and not dev.k.attn_decode_takes(self.cfg.head_dim):
            self.log(f"decode: per layer (heads of {self.cfg.head_dim} are not a size the decode graph's attention "
                     f"takes)")
        elif self.config.decode_graph:
            from strata.accel.decode_graph import DecodeGraph

            self.dgraph = DecodeGraph(model, dev, self.ops, self.dbufs, self.cache, self.arena, n_ctx)
            self.log("decode: one captured graph per token; misses read by the GPU over PCIe from the arena "
                     "(STRATA_DECODE_GRAPH=0: per layer, misses shared with the CPU pool)")

    def _warm_pool(self, pool) -> None:
        """One tiny job per distinct layer format, so Numba compiles at load time, not in the first prompt."""
        from strata.accel.cpu.pool import ExpertJob

        c, seen = self.cfg, set()
        for l in range(c.n_layer):
            if self.arena.types[l] in seen:
                continue
            seen.add(self.arena.types[l])
            x = np.zeros((1, c.n_embd), np.float32)
            pool.run([ExpertJob(self.arena.blob(l, 0), self.arena.types[l], c.n_embd, c.n_ff_exp, x,
                                np.zeros((1, c.n_embd), np.float32))])

    def _long(self, nbytes: int):
        """The progress callback for loading `nbytes`, where that is long enough to show; None where not."""
        return self.progress if self.progress and nbytes > PROGRESS_BYTES else None

    def _prime_share(self) -> None:
        """auto's meter starts from costs measured here, not SPEC §5's 0.5 (ours; CpuBlock.probe_prior)."""
        cb = self.cpu_block
        c_ms, g_ms, n, tokens = cb.probe_prior(self.h2d_gbps)
        if cb.prime(c_ms, g_ms):
            self.log(f"prefill CPU share: auto's meter starts from a probe: CPU {c_ms:.3f} ms an expert ({n} of "
                     f"{tokens} tokens on {self.pool.workers} workers), streamed {g_ms:.3f} ms (a blob at "
                     f"{self.h2d_gbps:.1f} GB/s): share {cb.policy.meter.share:.2f}")

    def use_share(self, share, policy=None):
        """Switch the prefill CPU share (a `policy.Share`), keeping `policy` (a SharePolicy with its meter and
        gate state) when given: benchmarks interleave settings on one engine this way."""
        from strata.policy import share_policy

        assert self.cpu_block is not None, "the CPU share needs the pool"
        self.share = share
        self.cpu_block.swap(policy or share_policy(share))
        return self.cpu_block.policy

    def _probe_h2d(self, reps: int = 8) -> float:
        """Pinned H2D GB/s at blob-sized copies (the decode ring's slot 0; a few ms at start), after one untimed
        copy: at load on the H200 it once read 18.6 GB/s where the link carries ~50 (share_f_full_stop24b.log);
        with the warm-up it read 47.0-50.8 GB/s in stop 25's six loads (share_f_full_stop25*.log)."""
        blob = self.arena.blob(0, 0)
        slot = self.dring.buf[0, :blob.nbytes]                       # (nothing reads the ring yet)
        self.dev.h2d(slot, blob, self.dev.copy)
        return blob.nbytes / max(self.dev.h2d_ms(slot, blob, reps), 1e-9) / 1e6

    # --- the loop ---------------------------------------------------------------------------------------------
    def reset(self):
        self.pos = 0

    def prefill(self, tokens, all_logits: bool = False) -> np.ndarray:
        """Process a prompt in planned chunks; logits of the last token [V] (or of every token [T, V])."""
        with self._vram("prompt"):
            return self._prefill(list(tokens), all_logits)

    @contextlib.contextmanager
    def _vram(self, what: str):
        """Out of device memory inside a step: a VramShortfall that says what the plan left and what is free now
        (the step's own cleanup has run: the loan given back, the cache's residents restored)."""
        try:
            yield
        except self.dev.OutOfMemory as e:
            p = self.plan
            raise VramShortfall(
                f"out of VRAM in a {what} ({e}): the plan left {p.decode / MIB:,.0f} MiB for decode buffers and a "
                f"step's temporaries within a budget of {p.budget / MIB:,.0f} MiB, and {self.dev.free_bytes() / MIB:,.0f}"
                f" MiB are free now. Something else on the device took memory after the engine planned (lower "
                f"--vram-budget, or free the device), or the plan under-prices this step (please report it)") from e

    def _prefill(self, tokens: list[int], all_logits: bool) -> np.ndarray:
        self._fits(len(tokens))
        t0 = time.perf_counter()
        major = self._layer_major(len(tokens))
        if major is not None:
            chunk, loan, refused = major
            self.log(f"prefill: {len(tokens):,} tokens layer by layer, {-(-len(tokens) // chunk)} chunks of up to "
                     f"{chunk:,}, {loan} cache slots borrowed (policy.layer_major)")
            region = self._lend(loan)
            self.stats.loan_slots = loan
            try:
                out = layer_major.run(self, tokens, region, chunk, all_logits, count_waste=refused)
            finally:
                self._give_back()
            self.stats.prompt_tokens += len(tokens)
            self.stats.prompt_s += time.perf_counter() - t0
            return out if all_logits else out[-1]
        layout, ring, loan, group = self.plan.for_prompt(self.config, self.share, len(tokens))
        region = self._lend(loan)
        self.stats.loan_slots = loan
        try:
            out, after = [], None
            n = -(-len(tokens) // self.plan.chunk)
            for j, i in enumerate(range(0, len(tokens), self.plan.chunk)):
                part = tokens[i:i + self.plan.chunk]
                last = i + len(part) == len(tokens)
                # a chunk before the last computes no head unless every token's logits are asked for, and the host
                # goes on to the next chunk without waiting for the GPU: that chunk's ring copies wait for `after`
                logits = self._prompt_chunk(part, region, layout, ring, group, all_logits, all_logits or last, after)
                if logits is not None:
                    out.append(logits)
                if not last:
                    after = self.dev.event(timing=False)
                    after.record(self.dev.compute)          # this chunk's compute is all enqueued
                if self.progress and n > 1:     # the host is at most a layer ahead of the GPU (routing syncs)
                    done, s = i + len(part), time.perf_counter() - t0
                    self.progress(f"prefill: chunk {j + 1} of {n}, {done:,} of {len(tokens):,} tokens in "
                                  f"{s * 1e3:.1f} ms -> {done / s:.1f} tok/s")
        finally:
            self._give_back()
        self.stats.prompt_tokens += len(tokens)
        self.stats.prompt_s += time.perf_counter() - t0
        return np.concatenate(out) if all_logits else out[-1][-1]

    def _layer_major(self, n: int) -> tuple[int, int, bool] | None:
        return layer_major.choose(self, n)

    def _fits(self, n: int) -> None:
        if self.pos + n > self.n_ctx:
            from strata.reference.engine import ContextOverflow

            raise ContextOverflow(f"{self.pos + n} tokens do not fit the context of {self.n_ctx}")

    def decode(self, tokens) -> np.ndarray:
        """One decode round of up to MAXT tokens: logits of each [T, V]."""
        with self._vram("decode step"):
            return self._decode_round(list(tokens))

    def _decode_round(self, tokens: list[int]) -> np.ndarray:
        assert 1 <= len(tokens) <= MAXT, f"a decode round carries 1..{MAXT} tokens"
        self._fits(len(tokens))
        t0 = time.perf_counter()
        self.cache.poll()                            # experts whose copies have landed are resident now
        if self.dgraph is not None and len(tokens) == 1:
            logits = self._graph_step(tokens[0])       # runs the tier's round while the GPU works
        else:
            self._runner, self._ring, self._walk, self._pre = self.drunner, self.dring, None, None
            self.dring.forget_holds()                # a step that raised may have left a walk unconsumed
            logits = self._step(tokens, self.dbufs, all_logits=True, decode=True)
            self._tier_round()
        self.stats.decode_tokens += len(tokens)
        self.stats.decode_s += time.perf_counter() - t0
        return logits

    def _tier_round(self) -> None:
        """The adaptive tier's end of round (SPEC §7): evict now; newcomers are resident once their copies land,
        which wait for the compute work enqueued so far (a step in flight may still read an evicted slot)."""
        moves = self.tier.end_round([self.cache.resident(l) for l in range(self.cfg.n_layer)], self.cache.free())
        if moves:
            ev = self.dev.event(timing=False)
            ev.record(self.dev.compute)
            self.stats.tier_moves += self.cache.apply_moves(moves, self.arena, ev)

    def _graph_step(self, token: int) -> np.ndarray:
        """One token through the decode graph. The tier's round (counts up to the last token) runs while the GPU
        works; the routing comes back once for the stats, the tier and --dump-routing."""
        self.dgraph.launch(int(token), self.pos)
        res = self.dgraph.resident                                            # [L, E] as this step runs
        self._tier_round()
        logits, ids = self.dgraph.wait()                                      # [1, V], [L, 1, K]
        ids2 = ids[:, 0, :]                                                   # [L, K]: distinct per layer (top-k)
        self.stats.lookups += ids2.size
        self.stats.hits += int(np.take_along_axis(res, ids2.astype(np.int64), 1).sum())
        for layer in range(self.cfg.n_layer):
            self.tier.note(layer, ids2[layer].tolist())
            if self.on_routing:
                self.on_routing(layer, ids[layer])
        self.pos += 1
        self.n_chunks += 1
        return logits

    def _lend(self, loan: int):
        self.cache.poll()
        if self.plan.owned_prompt:
            return self.prompt_region
        self.dev.synchronize()                       # nothing may still read the slots about to be lent
        self.cache.poll()                            # so every refill of the last prompt has landed
        return self.cache.lend(loan)

    def _give_back(self):
        if self.plan.owned_prompt:
            return
        ev = self.dev.event(timing=False)
        ev.record(self.dev.compute)
        self.cache.restore(self.arena, ev)

    def _prompt_chunk(self, tokens, region, layout: int, ring_slots: int, group: int, all_logits: bool,
                      head_out: bool, after):
        """One chunk through the borrowed region: buffers laid out for `layout` tokens and `group`-expert launch
        groups, then `ring_slots`. `after`: the event ending the previous chunk's compute (None: the first chunk),
        which the ring's first copies wait for (the same slots, read by that chunk's last groups). Returns the
        logits (_step), or None without `head_out`."""
        c, p = self.cfg, self.plan
        carver = Carver(self.dev, region)                         # the lent tail slots (or owned buffers)
        weights = None
        if group == DECODE_SCRATCH:       # decode's weight scratch, idle while a prompt runs (memplan.for_prompt)
            group, weights = self.dbufs.group, (self.dbufs.w_gu, self.dbufs.w_d)
        bufs, ring_buf = carve_prompt(c, layout, self.n_ctx, group, ring_slots, p.slot_bytes, carver, weights)
        ring = Ring(self.dev, ring_buf, after)
        walk = walk_for(self.config, self.share, len(tokens), ring_slots)
        # the CPU share stays with the chunks SPEC §4 gives it: those SPEC §3 sends down the routed-only walk
        self._shareable = walk is WalkKind.ROUTED_ONLY
        self._counted = None
        if walk is WalkKind.STREAM_ALL and not self.stream_waste.admit():
            walk = WalkKind.ROUTED_ONLY        # the last such chunk's stream-all queue was mostly unrouted
            if self.stream_waste.counted:
                self._counted = [0, 0]         # this chunk counts its own (moe: entries, unrouted)
        if self.cpu_block is not None and self._shareable:
            self.cpu_block.policy.begin_chunk(len(tokens))     # auto learns per size class (policy.SizedShare)
            self.cpu_block.rouse_ahead(0)                       # the pool wakes for a first layer that shares
        self._runner = ExpertRunner(self.dev, c, self.arena.types, bufs, self.few_rows, self.pre_graphs,
                                    self.gemm_q_types)
        self._ring, self._walk, self._pre = ring, None, None
        if walk is WalkKind.STREAM_ALL:
            queue = stream_all_queue([self.cache.resident(l) for l in range(c.n_layer)])
            self._walk = Walk(ring, self.arena, queue)     # its first copies go after the embedding's (_step)
            self._unrouted = 0
            self._layer_entries = {}
            for kq, (l, _) in enumerate(queue):
                r = self._layer_entries.get(l)
                self._layer_entries[l] = range(kq if r is None else r.start, kq + 1)
        try:
            logits = self._step(tokens, bufs, all_logits, decode=False, head_out=head_out)
        finally:
            if self._walk is not None:
                self._note_waste(len(self._walk.entries), self._unrouted)
                self._walk = None
            elif self._counted is not None:
                self._note_waste(*self._counted, streamed=False)
                self._counted = None
        self.stats.streamed_bytes += ring.bytes_in
        self.stats.streamed_experts += ring.copies
        self.stats.chunks.append((len(tokens), walk.value, ring.copies))
        return logits

    def _note_waste(self, entries: int, unrouted: int, streamed: bool = True) -> None:
        """A chunk SPEC §3 sends down stream-all ended (`streamed`: on that walk; else refused, its count from its
        routing): record the queue's unrouted share; say so when that turns the walk choice."""
        sw = self.stream_waste
        before = sw.dense
        sw.note(entries, unrouted)
        after = sw.dense
        if before != after:
            how = "streamed" if streamed else "would have streamed (counted from a routed-only chunk's routing)"
            again = ("each chunk refused counts it again" if sw.counted else
                     f"one in {STREAM_ALL_PROBE} re-measures, each still wasteful doubling that, up to "
                     f"{STREAM_ALL_PROBE_MAX}")
            self.log(f"walk: the stream-all walk {how} {unrouted} of {entries} experts unrouted "
                     f"({100 * sw.waste:.0f}%): " + ("chunks take the stream-all walk again" if after else
                                                     f"chunks take the routed-only walk ({again})"))

    def _step(self, tokens, bufs, all_logits: bool, decode: bool, head_out: bool = True) -> np.ndarray | None:
        """Tokens through every layer; the head's logits on the host ([T or 1, V]), or None without `head_out`
        (nothing waits for the GPU then)."""
        T = len(tokens)
        self._decode = decode
        with self.dev.on(self.dev.compute):
            # layer 0's experts go first, so the link works while the host gathers the embedding rows (~1 ms at
            # 1,280 tokens, bench/results/h200/chunkstart_q8_stop31.log): the stream-all walk's queue, or the
            # routed-only walk's guesses. The rows, the positions and the tables reach the GPU by pulls, not the
            # copy engine, which takes H2D copies in issue order (prefill_timeline_stop19.log: rows behind a ring of
            # experts held layer 0's MoE block back by the ring's transfer time)
            if self._walk is not None:
                self._walk.prefetch()
            elif not decode:
                self._guess(0, T)
            ops = None
            if self.pgraphs is not None and not decode:    # x [Tb, D]: T rows and zeros (prompt_graph.py)
                ops = self.pgraphs.chunk(self.ops, bufs, tokens, self.pos, self.cfg.n_layer)
            if ops is not None:
                x = ops.x
            else:
                ops = self.ops
                self.ops.begin(bufs, self.pos, T)
                x = self.ops.embed("token_embd.weight", tokens)                   # [T, D]
            if ops is not self.ops:
                ops.start()                                   # the first segment opens after those copies
            pos = np.arange(self.pos, self.pos + x.shape[0])
            try:
                for layer in range(self.cfg.n_layer):
                    x = self.model.forward_block(ops, x, layer, pos)              # [T or Tb, D]
            except BaseException:
                if ops is not self.ops:
                    ops.abort()                               # no segment left open (allocator, capture)
                raise
            x = x[:T]
            logits = None
            if head_out:
                rows = x if all_logits else x[T - 1:T]
                logits = head(self.ops, self.cfg, rows)                           # [T or 1, V]
            if self.cpu_block is not None:
                self.cpu_block.settle()          # the last shared layer ends for the policy with the chunk
        self.pos += T
        self.n_chunks += 1
        return None if logits is None else self.dev.tohost(logits)
