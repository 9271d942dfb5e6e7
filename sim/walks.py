"""This engine's expert launch groups and walks (calib ``gpu_experts`` "rows_gemm"), beside the original's in
engine.py: which experts each GPU launch group holds and the order the compute stream runs them, after
strata/accel/engine.py (``GpuEngine.moe``, ``_stream_all_groups``); the grouping rules themselves are the engine's
own (policy.resident_runs, policy.walk_runs). The group functions are pure; ``EngineWalks`` runs them as SimPy processes. Times in µs.
"""

from __future__ import annotations

from strata.policy import IssueOrder, resident_runs, routed_group, stream_all_queue, walk_runs
from strata.policy.stream import routed_groups

from .costs import FEW_ROWS

GROUP = 16  # strata/accel/memplan.py GROUP: a prompt's weight scratch in experts, where the run names none


def resident_groups(rows: list[int], scratch: int) -> list[list[int]]:
    """Indices into ``rows`` (the routed resident experts' rows, id order) in the engine's launch groups
    (policy.resident_runs: those of more than FEW_ROWS rows need the weight scratch)."""
    return resident_runs([n > FEW_ROWS for n in rows], scratch)


def compute_order(n_res: int, n_str: int) -> list[tuple[str, int]]:
    """("res", i) / ("str", j) in compute order: one resident group while the first copies land, then one after
    each streamed group (the compute stream reaches each streamed group, which frees its slots, early; 5-15% on
    the H200, GpuEngine.moe), the rest at the end; ("free", -1) where the walk has passed the layer's last group."""
    order, ri = [], 0
    if n_res and n_str:
        order, ri = [("res", 0)], 1
    for j in range(n_str):
        order.append(("str", j))
        if ri < n_res:
            order.append(("res", ri))
            ri += 1
    return order + [("free", -1)] + [("res", i) for i in range(ri, n_res)]


class EngineWalks:
    """_Runner's walks for this engine: expects env, run, costs, result, gpu, link, pool, resident, ring, group,
    n_layer, layer_factor, waste (a policy.StreamWaste or None) and the shared parts (_attention, _routing_sync)."""

    def _group_op(self, l: int, experts: list[int], cnt, waits=()):
        return self.gpu.op(f"L{l} " + ",".join(f"e{e}" for e in experts),
                           self.layer_factor[l] * self.costs.grouped_us(l, [int(cnt[e]) for e in experts]),
                           waits=waits, category="experts")

    def _resident_groups(self, l: int, cnt) -> list[list[int]]:
        rid = [e for e in range(len(cnt)) if cnt[e] > 0 and self.resident[l][e]]
        return [[rid[i] for i in g] for g in resident_groups([int(cnt[e]) for e in rid], self.group)]

    def _engine_routed_walk(self, l: int, cnt, cpu: set, iss: "HostIssue | None" = None):
        """Routed-only: the streamed experts in id order, in groups of policy.routed_group (at most half the walk's
        slots and the weight scratch). With the host timed by what it issues, `iss` (routed_issue, or a guessed
        walk: guess_walk) has issued the first copies at the routing sync; each group then issues up to its last
        entry and, once its reads are enqueued, all that may go (GpuEngine.moe); a guessed walk's unrouted entries
        are released as the groups pass them. Without, a group's copies are issued when the host reaches it,
        entry j reusing the slot of entry j - R once that one's group was computed. Returns each copied entry's
        group completion (an unrouted guess's: its release)."""
        c, R = self.costs, self.ring
        rg = self._resident_groups(l, cnt)
        sid = self._streamed(l, cnt, cpu)
        unrouted: dict = {}
        if iss is not None:   # the walk's own entries (a guess's first), as GpuEngine.moe groups a guessed walk
            sg, unrouted = routed_groups(iss.queue, range(len(iss.queue)), set(sid), routed_group(R, self.group), R)
            self.result.guessed_unrouted += sum(len(v) for v in unrouted.values())   # only a guess holds any
        else:
            sg = walk_runs(list(range(len(sid))), routed_group(R, self.group), R)
        done: list = []
        by_issue = c.by_issue        # the host timed by what it issues (Costs.by_issue), else per streamed expert
        for kind, i in compute_order(len(rg), len(sg)):
            if kind == "res":
                if by_issue:
                    yield from self._host(c.host_group_us(self.pool.busy))
                self._group_op(l, rg[i], cnt)
            elif kind == "str" and iss is not None:
                g = sg[i]
                done.extend(iss.release(unrouted.get(g[0], [])))
                if self.run.link_gap_us:   # before b1162ae: the copy stream idle ahead of each group's copies
                    self.link.stream.op("", self.run.link_gap_us)
                yield from iss.ensure(g[-1])
                yield from self._host(c.host_group_us(self.pool.busy))
                d = self._group_op(l, [iss.queue[k][1] for k in g], cnt, waits=[iss.copied[g[-1]]])
                d.callbacks.append(lambda _, ks=g: [iss.consumed[k].succeed() for k in ks])
                iss.order.consume(g)                   # on_released: the group's reads are enqueued
                yield from iss.prefetch()
                done.extend([d] * len(g))
            elif kind == "str":
                copies = []
                for e in (sid[j] for j in sg[i]):
                    yield from self._host(c.host_issue_us(self.pool.busy))
                    j = len(done) + len(copies)
                    copies.append(self.link.h2d(f"L{l} e{e}", c.blob(l), waits=[done[j - R] if j >= R else None]))
                d = self._group_op(l, [sid[j] for j in sg[i]], cnt, waits=copies)
                done.extend([d] * len(sg[i]))
            elif iss is not None:          # the guesses after the layer's last routed entry
                done.extend(iss.release(unrouted.get(None, [])))
        return done

    def _streamed(self, l: int, cnt, cpu: set) -> list[int]:
        return [e for e in range(len(cnt)) if cnt[e] > 0 and not self.resident[l][e] and e not in cpu]

    def routed_issue(self, l: int, cnt, cpu: set, ring: "SimRing | None" = None) -> "HostIssue":
        """The routed-only walk's queue of layer l (its streamed experts in id order) and its issuer, whose
        prefetch the engine thread calls right after the routing sync, before the row layout and the tables
        (GpuEngine.moe: the link would idle through them). `ring`: the chunk's ring where walks follow each other
        in it (guessed walks on), else each walk from slot 0."""
        queue = [(l, e) for e in self._streamed(l, cnt, cpu)]
        return HostIssue(self, queue, [self.env.event() for _ in queue], [self.env.event() for _ in queue],
                         self.ring, group=routed_group(self.ring, self.group), shared=ring)

    def guess_walk(self, l: int, t: int, ring: "SimRing"):
        """MoeBlock._guess: the copies of the experts layer l likely routes (policy.guess, up to the ring's slots),
        issued before its routing sync. The walk (None where nothing is guessed) takes the layer's missed routed
        experts after the sync (HostIssue.extend)."""
        experts = self.session.routes.guess(l, t, self.resident[l], self.ring)
        if not experts:
            return None
        queue = [(l, e) for e in experts]
        iss = HostIssue(self, queue, [self.env.event() for _ in queue], [self.env.event() for _ in queue],
                        self.ring, shared=ring)   # no group: a guessed Walk records every run's event
        yield from iss.prefetch()
        self.result.guessed += len(experts)
        return iss

    def _host(self, us: float):
        yield self.env.timeout(us)
        self.result.host_issue_us += us

    def _engine_stream_all_chunk(self, start: int, t: int, ring: int):
        """Stream-all: every non-resident expert of every layer queued at chunk start, entry k in slot k mod R;
        per layer the routed entries in groups of at most the scratch and half the ring, the unrouted ones
        released as the walk passes them. With the host timed by what it issues (Costs.by_issue), the engine
        thread issues the copies at its own points (HostIssue), else an issuer process does."""
        queue = stream_all_queue(self.resident[: self.n_layer])
        self.result.n_streamed += len(queue)   # every entry is copied by the chunk's end, routed or not
        copied = [self.env.event() for _ in queue]
        consumed = [self.env.event() for _ in queue]
        iss = HostIssue(self, queue, copied, consumed, ring) if self.costs.by_issue else None
        if iss is None:
            self.env.process(self._entry_issuer(queue, copied, consumed, ring))
            yield from self._embed(t)
        else:
            # GpuEngine._prompt_chunk lays out the queue and its per-layer index in Python first
            yield from self._host(len(queue) * self.run.machine.host_queue_us)
            if self.run.embed_behind_prefetch:   # the rows' upload (a few MB) waited behind the ring's first copies
                yield from iss.prefetch()
                rows = self.link.h2d("embedding rows", t * self.run.model.shape.n_embd)   # ~a byte a weight
                self.gpu.op("embedding rows", 0.0, waits=[rows])
                yield from self._embed(t)
            else:                                # GpuEngine._step: the embedding's upload, then layer 0's experts
                yield from self._embed(t)
                yield from iss.prefetch()
        by_layer: dict[int, list[int]] = {}
        for k, (l, _) in enumerate(queue):
            by_layer.setdefault(l, []).append(k)

        def release(ks):   # slots freed once the compute stream gets here; the host's watermark moves now
            if ks:
                self.gpu.mark().callbacks.append(lambda _, ks=ks: [consumed[k].succeed() for k in ks])
                if iss is not None:
                    iss.order.consume(ks)

        unrouted = 0
        for l in range(self.n_layer):
            self._attention(l, start, t)
            cnt = yield from self._routing_sync(l, start, t)
            rg = self._resident_groups(l, cnt)
            entries = by_layer.get(l, [])
            unrouted += sum(1 for k in entries if cnt[queue[k][1]] == 0)
            pos = {k: i for i, k in enumerate(entries)}
            sg = walk_runs([k for k in entries if cnt[queue[k][1]] > 0], min(self.group, ring // 2), ring)
            passed = 0   # the layer's entries before this point are issued to compute or released
            for kind, i in compute_order(len(rg), len(sg)):
                if kind != "free" and self.costs.by_issue:
                    yield from self._host(self.costs.host_group_us(self.pool.busy))
                if kind == "res":
                    self._group_op(l, rg[i], cnt)
                elif kind == "str":
                    g = sg[i]   # the unrouted entries the walk passed up to its last (_stream_all_groups)
                    release([k for k in entries[passed:pos[g[-1]]] if cnt[queue[k][1]] == 0])
                    passed = pos[g[-1]] + 1
                    if iss is not None:
                        yield from iss.ensure(g[-1])
                    d = self._group_op(l, [queue[k][1] for k in g], cnt, waits=[copied[g[-1]]])
                    d.callbacks.append(lambda _, ks=g: [consumed[k].succeed() for k in ks])
                    if iss is not None:
                        iss.order.consume(g)             # on_released: the group's reads are enqueued
                        yield from iss.prefetch()
                else:
                    release(entries[passed:])
                    if iss is not None:            # the next layer's experts go out before its routing sync
                        yield from iss.prefetch()
            self.gpu.op(f"L{l} combine", self.costs.combine_us(t), category="combine")
        if self.waste is not None:   # GpuEngine._note_waste: the chunk's unrouted share of its queue
            self.waste.note(len(queue), unrouted)

    def _entry_issuer(self, queue, copied, consumed, ring: int):
        """The stream-all copies: entry k is issued once entry k - ring was consumed, one copy a blob (the engine
        thread issues them between its launches since stop 19, an issuer thread before)."""
        c, res = self.costs, self.result
        for k, (l, e) in enumerate(queue):
            if k >= ring:
                yield consumed[k - ring]
            h = c.host_issue_us(self.pool.busy)
            yield self.env.timeout(h)
            res.host_issue_us += h
            self.link.h2d(f"L{l} e{e}", c.blob(l)).callbacks.append(lambda _, ev=copied[k]: ev.succeed())


class SimRing:
    """A routed-only chunk's ring as its walks share it (strata/accel/stream.py Ring): each walk starts at the slot
    after the last one's (cursor), and a copy into a slot waits for the release of the entry that held it last, in
    whichever walk (`after`, the previous chunk's end, for none yet): a guessed walk goes out while the layer before
    still reads its slots."""

    def __init__(self, n: int, after=None):
        self.n, self.cursor, self.used = n, 0, [after] * n


class HostIssue:
    """A walk's copies as the engine thread issues them (strata/accel/stream.py Walk) at its own points (stream-all:
    the chunk's start, after each streamed group, a layer's end; routed-only: the routing sync, each group's
    launch and after it); each in the runs of policy.IssueOrder
    (the host consuming a group when its reads are enqueued). A run's copy waits on the copy stream until the GPU
    has read its slots' previous entries. The link idles where the host is held in a routing sync with the ring's
    slots free (prefill_timeline_stop19.log: 4.5 ms host-late and 5.3 ms slot-wait in flash-shape's 2,048-token
    stream-all prompt). `shared`: the SimRing the walk takes its slots in (entry k in slot base + k); None: slot k,
    the walk alone in the ring (every walk before guessed walks, stop 35)."""

    def __init__(self, walks: EngineWalks, queue, copied, consumed, ring: int, group: int | None = None,
                 shared: SimRing | None = None):
        self.w, self.queue, self.copied, self.consumed, self.R = walks, queue, copied, consumed, ring
        self.ring = shared
        self.base = shared.cursor if shared is not None else 0
        self.order = IssueOrder(queue, ring, self.base)
        self.group = group   # routed-only: only a copy that carries a group's last entry records an event (Walk)
        self.prev: list = []   # per entry: the release its copy waits for (its slot's last holder's)
        self._take(0)

    def _take(self, k0: int) -> None:
        """Entries k0.. take their slots (Walk.__init__, Walk.extend: the ring's cursor moves past them)."""
        for k in range(k0, len(self.queue)):
            if self.ring is None:
                self.prev.append(self.consumed[k - self.R] if k >= self.R else None)
            else:
                s = (self.base + k) % self.R
                self.prev.append(self.ring.used[s])
                self.ring.used[s] = self.consumed[k]
        if self.ring is not None:
            self.ring.cursor = (self.base + len(self.queue)) % self.R

    def extend(self, entries) -> None:
        """Walk.extend: a guessed walk takes, after the routing sync, the routed experts it did not guess."""
        assert self.ring is not None and self.ring.cursor == (self.base + len(self.queue)) % self.R
        k0 = len(self.queue)
        self.queue += entries                     # in place: the IssueOrder reads the same list
        self.copied += [self.w.env.event() for _ in entries]
        self.consumed += [self.w.env.event() for _ in entries]
        self.order.grew()
        self._take(k0)

    def release(self, ks: list[int]) -> list:
        """Walk.consume of entries no group reads (a guess the routing left out): their slots free once the compute
        stream gets here. Returns their release, one a copied entry."""
        if not ks:
            return []
        d = self.w.gpu.mark()
        d.callbacks.append(lambda _, ks=ks: [self.consumed[k].succeed() for k in ks])
        self.order.consume(ks)
        return [d] * len(ks)

    def _run(self, k0: int, k1: int):
        w, (l, e), g = self.w, self.queue[k0], self.group
        event = g is None or k1 // g > k0 // g or k1 == len(self.queue) or w.run.event_per_copy   # b1162ae
        yield from w._host(w.costs.host_copy_us(w.pool.busy, event))
        waits = self.prev[k0:k1]
        d = w.link.h2d_run(f"L{l} e{e}" + (f"-e{e + k1 - k0 - 1}" if k1 - k0 > 1 else ""), w.costs.blob(l), k1 - k0,
                           waits=waits)
        d.callbacks.append(lambda _, ks=range(k0, k1): [self.copied[k].succeed() for k in ks])

    def prefetch(self):
        """Issue every entry whose slot the host may reuse now."""
        for k0, k1 in self.order.prefetch():
            yield from self._run(k0, k1)

    def ensure(self, k: int):
        """Issue up to entry k (a group's last, before its launch)."""
        for k0, k1 in self.order.up_to(k):
            yield from self._run(k0, k1)
