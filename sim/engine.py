"""The simulated engine: SPEC §3-§6's prefill loop on modelled hardware, deciding with ``strata.policy``.

One host thread (a SimPy process) walks chunks and layers as the engine does; the GPU's compute stream, the
copy engine (``Link``) and the CPU pool run as processes. Per layer: attention, then the routing sync (the
host waits for the device), readings of the previous layer's windows, the share's choice, and one of the two
walks. The policy objects see only what the engine would: counts, residency, and device-event times read one
layer late. Times are µs; results in ms where the name says so.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import simpy

from strata.policy import (
    CHOOSERS,
    MARGIN,
    MAXT,
    PRIME_EXPERTS,
    PRIME_TOKENS,
    ROUTED_ONLY_RING,
    ChooserKind,
    Config,
    LayerEnd,
    Share,
    SharePolicy,
    StreamWaste,
    Walk,
    ring_slots,
    share_policy,
    stream_all_queue,
    unrouted_waste,
    walk_for,
)
from strata.policy.guess import RouteMemory

from .calibration import CALIB, Calib
from .costs import Costs, PoolProbe
from .hardware import Machine
from .models import SimModel
from .streams import CpuPool, Link, Stream, Timeline
from .vram import VramPlan, plan_vram
from .layer_major import LayerMajorWalk
from .walks import GROUP, EngineWalks, SimRing
from .workload import ZipfRouting, residency

RING_GROUP = 16  # mmq: stream-all entries per simulated group (the original gathers 16-expert MMQ groups)


@dataclass(frozen=True)
class Run:
    machine: Machine
    model: SimModel
    prompt: int  # tokens
    cfg: Config = Config()
    qualifies: bool = True  # CUDA, one GPU, no batch slots: an unset share means auto (SPEC §4)
    gated: bool = True  # False: auto as before the gate (#1282), for studies
    veto: bool = True  # False: auto as before the floor veto (67e7045): stored runs of older engines
    layer_meters: bool = True  # False: auto's one meter for every layer of a class (stored runs up to stop 22)
    class_seed: bool = True  # False: each size class's meter from 0.5 (stored runs up to stop 23's)
    margin: float = MARGIN  # 0: the meter's share at SPEC §5's balance (the original's; stored runs up to stop 23's)
    prime: bool = True  # False: auto's first meter from SPEC §5's 0.5, not a load probe's (stored runs to stop 24's)
    cache_slots: int | None = None  # --expert-cache N; None: sized from free VRAM
    ctx: int = 8192  # context the KV cache is planned for
    prior: int = 0  # tokens already in the KV cache (a follow-up message)
    routing: object = None  # ZipfRouting / TraceRouting; None: ZipfRouting(seed)
    seed: int = 0
    noise: float = 0.0  # relative noise on the device times the policy reads
    timeline: bool = False
    layers: int | None = None  # simulate the first N layers only, times scaled to the full depth (sweeps)
    calib: Calib = CALIB  # the model's constants (calibrate.py fits them)
    costs: Costs | None = None  # durations; None: Costs(machine, model, calib, probe) (tests pass fixed ones)
    probe: PoolProbe | None = None  # the run's pool as measured (bench/cpu_share.py), over the modelled pool
    layout: tuple | None = None  # ((tokens, µs), ...): the run's host layout a layer as measured, over calib.group_us
    resident: int | None = None  # experts resident during the prompt; None: the cache minus the loan
    residency: tuple | None = None  # per layer, per expert: resident during the prompt (an engine's own fill,
    #                                 e.g. its uniform order); None: the hottest `resident` pairs of the routing
    layer_spread: float = 0.0  # lognormal sigma of a per-layer factor on the GPU's expert work (seed 002:
    #                            window times per expert differ up to 8x between layers, repeatably)
    plan: tuple | None = None  # (chunk, ring[, group]) of an engine's own plan (bench/share_sim.py: the group is
    #                            its weight scratch in experts, memplan.GROUP if absent); None: the simulated plan's
    restore: int = 0  # blobs of the previous prompt's loan still being refilled when this one starts: prompts
    #                   back to back (a benchmark's) wait for them, as the engine's lend waits for both streams
    stream_waste: bool | None = None  # refuse stream-all after a wasteful one (policy.StreamWaste); None: where
    #                                   the machine runs this engine's path (the original's, mmq, had no such rule)
    # an earlier engine of ours (bench/share_sim.py --engine simulates stored runs with theirs): before d616513 the
    # host dequantised a chunk's embedding rows while the GPU waited (Machine.host_embed_us a token); before
    # b1162ae the routed-only walk recorded a CUDA event after every copy run, not only a group's last
    host_embed: bool = False
    event_per_copy: bool = False
    link_gap_us: float = 0.0  # before b1162ae: the copy stream idle ahead of each routed-only group's copies
    embed_behind_prefetch: bool = False  # before a7c891c (stop 21): a stream-all chunk's first copies went before
    #                                      the embedding's upload, which queued behind them on the copy engine
    loan: int = 0  # cache slots lent to the prompt (policy.prompt_loan): the engine thread issues their refill at
    #                its end, inside the prompt's time (Machine.host_refill_us a copy)
    refill_copies: int | None = None  # the refill's copy calls (strata/accel/cache.py refill_runs: the lent experts
    #                                   sorted, a run a copy; bench/share_sim.py counts the engine's); None: a copy
    #                                   a slot, as every engine before ac18e97 (stop 33)
    refill_factor: float = 1.0  # the refill's host time over today's: before d7467e0 (stop 21) a copy through a
    #                             CuPy view and an event a slot (rows_ab_stop21.log: 1.4-2.2x, 1.85 typical)
    layer_major: bool = True  # a prompt of several chunks that would walk routed-only without the share runs layer
    #                           by layer (policy.layer_major, stop 37; sim/layer_major.py); False: every engine before
    defer_blocks: bool = True  # there, each chunk's MoE block is issued behind the next chunk's dense part
    #                            (strata/accel/deferred.py, stop 39); False: stops 37-38's engines, each in place
    guess: bool = True  # routed-only chunks without the share stream each layer's likely experts before its routing
    #                     sync (policy.guess, stop 35; where the host is timed by what it issues); False: every
    #                     engine before, each walk from ring slot 0

    @property
    def share(self) -> Share:
        return self.cfg.share(self.qualifies)


@dataclass
class Session:
    """What outlives a prompt: the share policy's state and the pinned buffers' capacities."""

    policy: SharePolicy
    waste: StreamWaste = field(default_factory=StreamWaste)  # the engine keeps it across chunks and prompts
    cpu_x_bytes: int = 0
    cpu_rows_bytes: int = 0
    pending: tuple | None = None  # (ev0, ev1, start, end) of the last window, read at the next routing sync
    routes: RouteMemory | None = None  # GpuEngine.routes: the prompt chunks' routing, for guessed walks; None: a
    #                                    fresh one at the first prompt


@dataclass
class Result:
    prompt_ms: float
    vram: VramPlan
    share: Share
    chunks: list = field(default_factory=list)  # (start, tokens, walk)
    resident: int = 0  # experts resident during this prompt
    n_streamed: int = 0
    n_cpu: int = 0
    host_issue_us: float = 0.0
    guessed: int = 0  # experts streamed before their layer's routing sync on a guess (GpuEngine Stats.guessed)
    guessed_unrouted: int = 0  # of which the sync found unrouted
    layer_shares: list = field(default_factory=list)  # share used per eligible layer (0.0 = not shared)
    readings: list = field(default_factory=list)  # GateReading per gate reading
    meter_lines: list = field(default_factory=list)  # the meter's samples, as STRATA_DBG_CPU_GATE prints them
    windows: list = field(default_factory=list)  # (layer, shared, nstream, ms) per eligible layer's window
    busy_us: dict = field(default_factory=dict)
    events: list = field(default_factory=list)
    session: Session | None = None

    @property
    def tok_s(self) -> float:
        return sum(c[1] for c in self.chunks) / (self.prompt_ms / 1e3)

    @property
    def host_us_per_streamed(self) -> float:
        return self.host_issue_us / max(1, self.n_streamed)

    @property
    def final_share(self) -> float | None:
        meter = getattr(self.session.policy, "meter", None) if self.session else None
        return meter.share if meter else None

    def gate_lines(self) -> list[str]:
        return [r.line() for r in self.readings]


def prefill(run: Run, session: Session | None = None) -> Result:
    env = simpy.Environment()
    tl = Timeline(run.timeline)
    costs = run.costs or Costs(run.machine, run.model, run.calib, run.probe, run.layout)
    share = run.share
    session = session or Session(share_policy(share, run.gated, veto=run.veto, layer_meters=run.layer_meters,
                                                     class_seed=run.class_seed, margin=run.margin))
    vp = plan_vram(run.machine, run.model, run.cfg, run.ctx, run.cache_slots)
    m = run.model
    routing = run.routing or ZipfRouting(m.n_layer, m.n_expert, m.k, seed=run.seed)
    res = _Runner(env, run, costs, session, vp, routing, tl)
    host = env.process(res.host())
    env.run()
    assert host.processed, f"the simulation stalled at {env.now:.0f} us: an event nothing fires (a walk's slots)"
    res.result.prompt_ms = env.now / 1e3 * m.n_layer / res.n_layer
    res.result.windows = [(l, arm, n, (e.value - s.value) / 1e3) for l, arm, n, s, e in res.windows]
    res.result.busy_us = dict(tl.busy_us)
    res.result.events = tl.events
    return res.result


class _Runner(EngineWalks, LayerMajorWalk):
    def __init__(self, env, run: Run, costs: Costs, session: Session, vp: VramPlan, routing, tl: Timeline):
        self.env, self.run, self.costs, self.session, self.routing = env, run, costs, session, routing
        self.vp = vp
        # whose launch groups: the machine's (its catalogue calib), as its Costs, even where a test fixes the costs
        self.mmq = run.calib.over(run.machine.calib).gpu_experts == "mmq"
        self.group = run.plan[2] if run.plan is not None and len(run.plan) > 2 else GROUP
        use_waste = not self.mmq if run.stream_waste is None else run.stream_waste
        self.waste = session.waste if use_waste else None
        self.pol = session.policy
        self.chooser = CHOOSERS.create(ChooserKind.FEWEST_FIRST)
        m, plan = run.model, vp.plan
        if run.plan is not None:
            plan = dataclasses.replace(plan, chunk=run.plan[0], ring=run.plan[1])
        self.plan = plan
        layout = min(plan.chunk, run.prompt)
        self.ring = ring_slots(run.cfg, run.share, layout, m.max_blob, planned=plan.ring)
        if run.residency is not None:
            self.resident = [list(map(bool, r)) for r in run.residency]
            n_res = sum(map(sum, self.resident))
        else:
            n_res = run.resident if run.resident is not None else vp.layout(layout, self.ring)
            self.resident = residency(routing.profile(), n_res)
        self.in_ram = [True] * run.model.n_expert  # the arena pins every expert (ours)
        self.gpu = Stream(env, "gpu", tl)
        self.pool = CpuPool(env, tl)
        self.link = Link(env, costs.copy_us, self.pool, tl, costs.copy_run_us if costs.by_issue else None)
        self.rng = np.random.default_rng([run.seed, 3])
        self.n_layer = min(run.layers or run.model.n_layer, run.model.n_layer)
        self.windows: list = []
        spread = np.random.default_rng([run.seed, 4]).lognormal(0.0, run.layer_spread, run.model.n_layer)
        self.layer_factor = spread.tolist() if run.layer_spread else [1.0] * run.model.n_layer
        self.result = Result(0.0, vp, run.share, resident=n_res, session=session)
        if session.routes is None:   # the engine's memory outlives its prompts (GpuEngine.__init__)
            session.routes = RouteMemory(m.n_layer, m.n_expert)
        if run.share.on and not session.cpu_x_bytes and not session.cpu_rows_bytes:
            # ours: the engine pins the share's staging once, at load, for its largest step (accel/cpu_block.py),
            # so no window pays the allocation the original grows lazily (seed 002's 6.49 ms first window)
            cap = max(plan.chunk, MAXT)
            session.cpu_x_bytes = cap * m.shape.n_embd * 4
            session.cpu_rows_bytes = min(cap * m.k, m.n_expert * MAXT) * m.shape.n_embd * 4
            if run.prime:   # and, ours, starts auto's meter from a load probe (accel/cpu_block.py probe_prior)
                c_us = costs.cpu_pool_us(0, [PRIME_TOKENS] * PRIME_EXPERTS) / PRIME_EXPERTS
                session.policy.prime(c_us / 1e3, costs.copy_us(costs.blob(0), False) / 1e3)

    def host(self):
        run, plan, ring = self.run, self.plan, self.ring
        if run.restore:   # the lent slots go back and refill after a prompt (SPEC §9); the next prompt's loan waits
            yield self.link.h2d("loan refill", run.model.max_blob, count=run.restore)
        start = 0
        major = self.layer_major_plan(self.vp)
        if major is not None:
            yield from self.layer_major_prompt(*major, self.vp)
            start = run.prompt
        while start < run.prompt:
            t = min(plan.chunk, run.prompt - start)
            walk = walk_for(run.cfg, run.share, t, ring)
            # as GpuEngine._prompt_chunk: the share keeps to the chunks SPEC §3 sends down the routed-only walk,
            # and a stream-all chunk after a wasteful one takes the routed-only walk (policy.StreamWaste)
            shareable = walk is Walk.ROUTED_ONLY
            counted = None
            if walk is Walk.STREAM_ALL and self.waste is not None and not self.waste.admit():
                walk = Walk.ROUTED_ONLY
                counted = [0, 0] if self.waste.counted else None   # it counts stream-all's waste from its routing
            self.result.chunks.append((start, t, walk))
            if walk is Walk.STREAM_ALL:
                yield from (self._stream_all_chunk if self.mmq else self._engine_stream_all_chunk)(start, t, ring)
            else:
                yield from self._routed_only_chunk(start, t, shareable, counted)
                if counted is not None:
                    self.waste.note(*counted)
            start += t
        self.gpu.op("head", self.costs.head_us())
        yield self.gpu.tail
        if run.loan:   # GpuEngine._give_back after the logits' readback, which waits for both streams: the host
            #            issues the refill's copies
            if self.link.stream.tail is not None and not self.link.stream.tail.processed:
                yield self.link.stream.tail
            copies = run.loan if run.refill_copies is None else run.refill_copies
            yield self.env.timeout(copies * run.machine.host_refill_us * run.refill_factor)

    # --- the parts of a layer both walks share -----------------------------------------------------------
    def _embed(self, t: int):
        """A chunk's embedding rows: on the device (today: a few µs, left out), or on the host before d616513,
        the compute stream idle until they are uploaded (the stream-all walk's first copies already going)."""
        if self.run.host_embed:
            yield self.env.timeout(self.costs.embed_host_us(t))

    def _attention(self, l: int, start: int, t: int) -> None:
        self.gpu.op(f"L{l} attn", self.costs.dense_us(t, self.run.prior + start), category="dense")

    def _routing_sync(self, l: int, start: int, t: int, layout: bool = True, routed=None):
        """The host waits for layer l's routing (`routed`: the GPU's mark after it, where more is queued behind;
        else the GPU's tail), reads the last window's events, then (`layout`) lays out the rows and the layer's
        tables (group_us); the routed-only walk of this engine issues its first copies first."""
        yield routed or self.gpu.tail
        yield self.env.timeout(self.costs.sync_us())
        want = self.pol.wants()
        if want.gpu or want.wall:  # the previous window's events are complete now
            ev0, ev1, s, e = self.session.pending
            gpu_ms = (ev1.value - ev0.value) / 1e3 * self._noise()
            wall_ms = (e.value - s.value) / 1e3 * self._noise()
            r = self.pol.readings(gpu_ms if want.gpu else None, wall_ms if want.wall else None)
            if self.pol.folded:
                self.result.meter_lines.append(self.pol.folded)
            if r is not None:
                self.result.readings.append(r)
        if layout:
            yield self.env.timeout(self.costs.group_us(t))
        cnt = self.routing.counts(l, start, t)
        if not self.mmq:   # MoeBlock.moe notes every prompt chunk's routing, whichever walk (policy.guess); a
            #                trace's counts stop at its highest id
            self.session.routes.note(l, np.pad(cnt, (0, self.run.model.n_expert - len(cnt))), t)
        return cnt

    def _noise(self) -> float:
        return max(0.1, 1.0 + self.run.noise * self.rng.standard_normal()) if self.run.noise else 1.0

    def _pin(self, attr: str, nbytes: int, headroom: float):
        """Grow a pinned buffer if needed (cudaHostAlloc blocks the host); True when it grew."""
        if nbytes <= getattr(self.session, attr):
            return False
        setattr(self.session, attr, int(nbytes * headroom))
        yield self.env.timeout(self.costs.pin_us(nbytes * headroom))
        return True

    # --- routed-only walk (chunks below stream_all_min) --------------------------------------------------
    def _routed_only_chunk(self, start: int, t: int, shareable: bool = True, counted: list | None = None):
        """counted: [entries, unrouted] of the stream-all queue this chunk was refused, added to layer by layer from
        its routing (GpuEngine.moe, policy.stream.unrouted_waste)."""
        m, c, res = self.run.model, self.costs, self.result
        eligible = self.run.share.on and shareable
        early = not self.mmq and c.by_issue   # GpuEngine.moe: the walk's first copies, then the row layout
        # MoeBlock._guess: each layer's likely experts go out before its routing sync where the share allows (its
        # policy's guesses: an unshared layer on a settled verdict), the chunk's walks following each other in its
        # ring (Ring.cursor; `after`: the last chunk's end)
        chunk_ring = SimRing(self.ring, self.gpu.tail) if early and self.run.guess else None
        if eligible:
            self.pol.begin_chunk(t)
        guesses = lambda l: chunk_ring is not None and (not eligible or self.pol.guesses(l))
        yield from self._embed(t)
        pre = (yield from self.guess_walk(0, t, chunk_ring)) if guesses(0) else None   # GpuEngine._step
        for l in range(self.n_layer):
            self._attention(l, start, t)
            arm = self.pol.begin_layer(l) if eligible else False
            s_ev = self.gpu.mark()
            grew = False
            if arm:
                grew = yield from self._pin("cpu_x_bytes", t * m.shape.n_embd * 4, 1.0)
                self.gpu.op(f"L{l} input d2h", c.input_d2h_us(t), category="share d2h")
            cnt = yield from self._routing_sync(l, start, t, layout=not early)
            if counted is not None:
                n, u = unrouted_waste(cnt, self.resident[l])
                counted[0] += n
                counted[1] += u
            share = self.pol.share(arm) if eligible else 0.0
            choice = self.chooser.choose(cnt, self.resident[l], self.in_ram, share)
            if eligible:
                res.layer_shares.append(share)
            cpu = list(choice.cpu)
            rows = int(sum(cnt[e] for e in cpu))
            cpu_done, cpu_us, iss = None, 0.0, None
            if cpu:
                grew = (yield from self._pin("cpu_rows_bytes", rows * m.shape.n_embd * 4, 2.0)) or grew
            if early and pre is not None:   # MoeBlock.moe: the routed experts the guess missed go after it
                iss, pre = pre, None
                guessed = {e for _, e in iss.queue}
                iss.extend([(l, e) for e in self._streamed(l, cnt, set(cpu)) if e not in guessed])
            elif early:
                iss = self.routed_issue(l, cnt, set(cpu), chunk_ring)
            if early:
                yield from iss.prefetch()
                yield self.env.timeout(c.group_us(t))   # the row layout and tables; the pool starts after the layout
            ev0 = self.gpu.mark()                       # the meter's window opens at the pool's launch (CpuBlock.launch)
            if cpu:
                cpu_us = c.cpu_pool_us(l, [int(cnt[e]) for e in cpu])
                cpu_done = self.pool.run(f"L{l} {len(cpu)} experts", cpu_us)
            done = yield from (self._routed_walk(l, cnt, set(cpu)) if self.mmq else
                               self._engine_routed_walk(l, cnt, set(cpu), iss))
            if l + 1 < self.n_layer and guesses(l + 1):    # MoeBlock.moe: after the layer's last group
                pre = yield from self.guess_walk(l + 1, t, chunk_ring)
            res.n_streamed += len(done)
            res.n_cpu += len(cpu)
            ev1 = self.gpu.mark()
            if cpu_done is not None:
                yield cpu_done
                self.gpu.op(f"L{l} cpu rows h2d", c.rows_h2d_us(rows), category="share rows h2d")
            e_ev = self.gpu.mark()
            if eligible:
                self.pol.end_layer(LayerEnd(l, choice.nstream, len(cpu), cpu_us / 1e3, grew))
                self.session.pending = (ev0, ev1, s_ev, e_ev)
                self.windows.append((l, bool(cpu), choice.nstream, s_ev, e_ev))
            self.gpu.op(f"L{l} combine", c.combine_us(t), category="combine")

    def _routed_walk(self, l: int, cnt, cpu: set):
        """The original's (mmq): the GPU's experts in id order, resident and streamed mixed, in MMQ groups of up
        to 16 experts, at most 8 of them streamed (half the routed-only walk's 16 slots); a streamed expert's copy
        is issued when the walk reaches it and reuses the slot of the expert R copies back once that one's group
        was computed."""
        c, res = self.costs, self.result
        resident = self.resident[l]
        done: list = []  # per streamed expert: its group's completion
        group: list[int] = []
        copies: list = []
        names: list[int] = []

        def flush():
            d = self.gpu.op(
                f"L{l} " + ",".join(f"e{e}" for e in names),
                self.layer_factor[l] * c.grouped_us(l, group),
                waits=copies,
                category="experts",
            )
            done.extend([d] * len(copies))
            group.clear(), copies.clear(), names.clear()

        for e in range(len(cnt)):
            if cnt[e] <= 0 or e in cpu:
                continue
            if not resident[e]:
                h = c.host_issue_us(self.pool.busy)
                yield self.env.timeout(h)
                res.host_issue_us += h
                j = len(done) + len(copies)
                R = self.ring
                copies.append(self.link.h2d(f"L{l} e{e}", c.blob(l), waits=[done[j - R] if j >= R else None]))
            group.append(int(cnt[e]))
            names.append(e)
            if len(group) == 16 or len(copies) == min(ROUTED_ONLY_RING, self.ring // 2):
                flush()
        if group:
            flush()
        return done

    # --- stream-all walk (chunks from stream_all_min, a big ring) ---------------------------------------
    def _stream_all_chunk(self, start: int, t: int, ring: int):
        """The original's (mmq): queue entries in groups of 16 (a quarter of the ring at most)."""
        m, c = self.run.model, self.costs
        g_size = max(1, min(RING_GROUP, ring // 4))
        groups: list[tuple[int, list[int]]] = []
        for l, e in stream_all_queue(self.resident[: self.n_layer]):
            if groups and groups[-1][0] == l and len(groups[-1][1]) < g_size:
                groups[-1][1].append(e)
            else:
                groups.append((l, [e]))
        copied = [self.env.event() for _ in groups]
        consumed = [self.env.event() for _ in groups]
        self.env.process(self._issuer(groups, copied, consumed, max(1, ring // g_size)))
        by_layer: dict[int, list[int]] = {}
        for g, (l, _) in enumerate(groups):
            by_layer.setdefault(l, []).append(g)
        unrouted = 0
        for l in range(self.n_layer):
            self._attention(l, start, t)
            cnt = yield from self._routing_sync(l, start, t)
            unrouted += sum(1 for g in by_layer.get(l, []) for e in groups[g][1] if cnt[e] == 0)
            res_ids = [e for e in range(m.n_expert) if cnt[e] > 0 and self.resident[l][e]]
            k = 0
            for g in by_layer.get(l, []) + [None]:  # resident experts run in id order between the groups
                first = groups[g][1][0] if g is not None else m.n_expert
                before = []
                while k < len(res_ids) and res_ids[k] < first:
                    before.append(int(cnt[res_ids[k]]))
                    k += 1
                if before:
                    self.gpu.op(
                        f"L{l} resident", self.layer_factor[l] * c.grouped_us(l, before), category="experts"
                    )
                if g is None:
                    break
                routed = [int(cnt[e]) for e in groups[g][1] if cnt[e] > 0]
                if routed:
                    d = self.gpu.op(
                        f"L{l} group {g}",
                        self.layer_factor[l] * c.grouped_us(l, routed),
                        waits=[copied[g]],
                        category="experts",
                    )
                else:
                    d = self.gpu.mark()  # an unrouted entry only releases its slot
                d.callbacks.append(lambda _, ev=consumed[g]: ev.succeed())
            self.gpu.op(f"L{l} combine", c.combine_us(t), category="combine")
        if self.waste is not None:
            self.waste.note(sum(len(es) for _, es in groups), unrouted)

    def _issuer(self, groups, copied, consumed, in_flight: int):
        """The stream-all copies: entry k is issued once entry k - ring was consumed (the engine thread issues them
        between its launches since stop 19, an issuer thread before; modelled as its own process either way)."""
        c, res = self.costs, self.result
        for g, (l, es) in enumerate(groups):
            if g >= in_flight:
                yield consumed[g - in_flight]
            h = c.host_issue_us(self.pool.busy) * len(es)
            yield self.env.timeout(h)
            res.host_issue_us += h
            res.n_streamed += len(es)
            d = self.link.h2d(f"L{l} group {g}", c.blob(l), count=len(es))
            d.callbacks.append(lambda _, ev=copied[g]: ev.succeed())
