"""The GPU engine's MoE block (SPEC §3, §4, §8): a layer's routing sync, the placement of its routed experts
(resident, streamed, CPU), the row layout, the launch groups in compute order and the combine in k order.

`MoeBlock` is a part of `GpuEngine` (engine.py), split out for size: it reads the engine's state (cache, arena,
the chunk's runner, ring and walk, the CPU block, the stats) and the engine's loop calls `moe` through the ops.
Legend: T tokens, K top-k, R = T·K rows, D hidden, E experts.
"""

from __future__ import annotations

import time

import numpy as np

from strata.accel.deferred import DeferredBlock
from strata.accel.gpu.kernels import ROUTE_TILE
from strata.accel.moe import placement, row_layout, row_order
from strata.accel.presync import PRE_BIG_ROWS, PRE_GROUPS, PRE_MARGIN, PRE_MIN_TOKENS, PRE_WIDE_TOKENS, fills, takes_pre
from strata.accel.rows_host import tile_sums
from strata.accel.stream import Walk
from strata.policy.stream import routed_group, routed_groups, unrouted_waste, walk_runs


class MoeBlock:
    # a prompt layer's pairs get their rows on the device from its copy of the routing (kernels.route_rows); off: on
    # the host from the downloaded ids, the same tables (bench/knobs_ab.py)
    rows_on_device = True
    # launch groups of a prompt layer's cache hits issued before its routing sync, their tables made on the device
    # (presync.py); 0: none, every group after the sync from the host's tables (bench/knobs_ab.py)
    pre_groups = PRE_GROUPS
    pre_guessed = PRE_GROUPS        # of those, after the residents', groups of a guessed walk's experts
    pre_min_tokens = PRE_MIN_TOKENS  # unless the cache holds all of a layer's experts: chunks this long or longer
                                     # (the engine sets presync.PRE_MIN_TOKENS_EAGER where they are not graphs)
    pre_wide_tokens = PRE_WIDE_TOKENS  # and below this, narrow layers only (presync.takes_pre)
    # their plan, rows, gather and residents' groups as one graph (ExpertRunner.pre_head); off: each launched
    # alone, the groups' graphs one a group (bench/knobs_ab.py)
    pre_head = True

    def moe(self, h, layer: int, ids_dev, w_dev, out=None):
        """Routing sync -> row layout -> resident groups, streamed groups -> combine. h [T, D] -> [T, D] (into
        `out` where given). A chunk's block deferred before (deferred.py) runs first, behind this chunk's dense
        part; with `_defer` set this one waits in turn, and its output is a deferred.Lazy."""
        waiting, self._deferred = self._deferred, None
        if waiting is not None:
            if self.side_blocks:
                self._beside(waiting)
            else:
                waiting.resolve()
        if self._defer:
            return self._defer_block(h, layer, ids_dev, w_dev, out)
        self.join_side()                    # a block in place reuses the buffers the side stream's blocks use
        return self._block(h, layer, ids_dev, w_dev, out)

    def _beside(self, waiting) -> None:
        """Issue a deferred block on the side stream, behind its chunk's routing (the sync event): the GPU runs it
        beside the compute stream's dense parts of the chunks after it, which do not read it. Every launch, table
        and event of the block (and of the ops recorded on it) goes where `dev.compute` points while it issues;
        CuPy's own allocations come from the side stream's pool arena. The compute stream waits for the block
        (join_side) before it reads the chunk's rows again; until then the block keeps what it reads alive, so no
        allocation of the compute stream takes that memory."""
        dev = self.dev
        main, side = dev.compute, dev.side
        side.wait(self.sync_ev)
        dev.compute = side
        try:
            with dev.on(side):
                waiting.resolve()
        finally:
            dev.compute = main
        end = dev.event(timing=False)
        end.record(side)
        ends = self._side_ends
        ends.append((waiting.key, end, waiting))
        if len(ends) > self.side_pending:
            # what the blocks keep is bounded: the compute stream waits for the oldest, and lets go of its inputs
            self.dev.compute.wait(ends[-self.side_pending - 1][1])
            del ends[:-self.side_pending]

    def join_side(self, key: int | None = None) -> None:
        """The compute stream waits for the side stream's block of the chunk at position `key` (and every block
        issued before it: the side stream runs them in order); key None: for all of them."""
        ends = self._side_ends
        upto = len(ends) if key is None else next((i + 1 for i, (k, _, _) in enumerate(ends) if k == key), 0)
        if upto:
            self.dev.compute.wait(ends[upto - 1][1])
            del ends[:upto]

    def _defer_block(self, h, layer: int, ids_dev, w_dev, out):
        """The routing's download and the sync event now; the rest when the next chunk's block starts. The next
        chunk's top-k rewrites the weights' buffer before then: the block keeps a copy."""
        assert not self._decode and not (self.cpu_block is not None and self._shareable and self.share.on)
        s, T = self.dev.compute, h.shape[0]
        self.dev.d2h(self.ids_host[:T * self.cfg.n_expert_used], ids_dev, s)
        w = self.dev.empty(w_dev.shape, w_dev.dtype)
        self.k.copy(w, w_dev, s)
        self.sync_ev.record(s)                 # after the weights' copy: a block on the side stream waits for it
        # what the block reads of its chunk's state: a routing trace's chunk and position, the admissions' last
        adm = self._admissions
        state = self.pos, self.n_chunks, adm.last if adm is not None else None

        def issue():
            now = self.pos, self.n_chunks, adm.last if adm is not None else None
            self.pos, self.n_chunks, last = state
            if adm is not None:
                adm.last = last
            try:
                return self._block(h, layer, None, w, out)
            finally:
                self.pos, self.n_chunks, last = now
                if adm is not None:
                    adm.last = last
        self._deferred = DeferredBlock(issue, self.pos)
        return self._deferred.out

    def _block(self, h, layer: int, ids_dev, w_dev, out=None):
        """moe's body; ids_dev None: the routing's download and sync event are on the stream already."""
        c, dev, k, s = self.cfg, self.dev, self.k, self.dev.compute
        T, K, E = h.shape[0], c.n_expert_used, c.n_expert
        P = T * K
        bufs = self._runner.bufs
        cb = self.cpu_block
        # the CPU share: routed-only walk of a prompt chunk, pool present (SPEC §4); decode misses (SPEC §8)
        share_layer = cb is not None and not self._decode and self._shareable and self.share.on
        arm = plain = False
        if share_layer:
            # a layer the share's policy keeps unshared on a settled verdict (SharePolicy.guesses, asked before its
            # begin_layer) runs as with the share off: its rows on the device, pre-sync groups where they are taken
            plain = cb.policy.guesses(layer)
            arm = cb.begin_layer(layer, h, s)
            cb.rouse_ahead(layer + 1)        # the pool wakes in this layer's sync if the next one shares
            assert not (plain and arm), f"layer {layer}: armed where the policy said it would not share"
        elif self._decode and cb is not None:
            dev.d2h(cb.x_host[:T], h, s)
        # a prompt layer's pairs get their rows on the device, from its copy of the routing (kernels.route_rows):
        # the sync brings back the counts only. Not where the host needs the pairs' rows (the CPU's experts, decode),
        # the ids may be gone (a deferred block's: the next chunk's router rewrote them) or the kernels cannot take
        # the layer's experts
        on_dev = self.rows_on_device and ids_dev is not None and not self._decode and (not share_layer or plain) \
            and E <= k.route_max_experts
        nt = -(-P // ROUTE_TILE)
        if ids_dev is not None:
            if on_dev:
                k.route_hist(bufs.hist, ids_dev, P, s)
                dev.d2h(self.hist_host[:nt * E], bufs.hist[:nt], s)
            if not on_dev or self.on_routing:
                dev.d2h(self.ids_host[:P], ids_dev, s)
            self.sync_ev.record(s)
        n_pre, n_gpre, pre_read = 0, 0, []   # groups issued before the sync: of residents, of guessed experts
        if on_dev and self.pre_groups and self._walk is None and self._admissions is None:
            n_pre, n_gpre, pre_read = self._issue_pre(layer, h, ids_dev, P, nt)
        t_sync = time.perf_counter()
        self.sync_ev.synchronize()                                              # the routing sync
        t_synced = time.perf_counter()
        self.stats.sync_wait_s += t_synced - t_sync
        ids = self.ids_host[:P].reshape(T, K).copy() if not on_dev or self.on_routing else None
        if self.on_routing:
            self.on_routing(layer, ids)
        # tokens per expert
        cnt = tile_sums(self.hist_host, nt, E) if on_dev else np.bincount(ids.ravel(), minlength=E)
        adm, inflight = self._admissions, ()
        if adm is not None:                          # a layer-major prompt: every routed expert into the cache
            inflight = adm.routed(layer, cnt)
        resident = self.cache.resident(layer)
        pre, self._pre = self._pre, None                   # the walk this layer's guess started (_guess)
        assert pre is None or (pre[0] == layer and not arm and not self._decode), (pre, layer)
        if self._counted is not None and not self._decode:     # a refused chunk counts stream-all's waste
            n, u = unrouted_waste(cnt, resident)
            self._counted[0] += n
            self._counted[1] += u
        cpu, nstream = (), None
        if share_layer:
            cb.after_sync()
            if arm:
                cpu, nstream = cb.choose(cnt, resident)
        elif self._decode and cb is not None:
            cpu = cb.decode_split(np.flatnonzero((cnt > 0) & ~resident).tolist())
        parts = placement(cnt, resident, cpu)                                  # resident, streamed, CPU
        if nstream is None:
            # an unarmed layer's share is 0 under every policy (SharePolicy.share): nstream is its streamed count,
            # without the chooser (44 us of the ~120 us a settled "do not share" layer spent in the CPU block's
            # calls on the H200's host, where the share off spent ~8: bench/results/h200/gap_calls_q8_stop53.log)
            nstream = int(parts[1].size)
        if inflight:                 # the experts whose copies are landing go last: the others compute meanwhile
            late = np.isin(parts[0], inflight)
            parts = (np.concatenate([parts[0][~late], parts[0][late]]), parts[1], parts[2])
        walk, covered = None, ()
        if pre is not None:                          # a guessed walk: the routed experts it missed go after it
            walk = pre[1]
            guessed = {e for _, e in walk.entries}
            if n_gpre:                   # the pre-sync groups' entries: free their slots once each group read them
                G = self._runner.bufs.group
                covered = [kq for kq, (_, e) in enumerate(walk.entries) if cnt[e] > 0][:n_gpre * G]
                for j in range(0, len(covered), G):
                    walk.consume(covered[j:j + G], pre_read[j // G])
            missed = [(layer, e) for e in parts[1].tolist() if e not in guessed]
            self.stats.guessed_missed += len(missed)
            walk.extend(missed)
            walk.prefetch()
            routed = set(parts[1].tolist())          # the row layout takes the walk's order (groups are row runs)
            parts = (parts[0], np.asarray([e for _, e in walk.entries if e in routed], parts[1].dtype), parts[2])
        elif self._walk is None and parts[1].size:   # routed-only: the first copies go before the layout and
            walk = Walk(self._ring, self.arena, [(layer, e) for e in parts[1].tolist()],
                        group=routed_group(self._ring.n, self._runner.bufs.group))
            walk.prefetch()                          # tables are built (the link idles from the sync until then)
        lay = row_order(cnt, parts) if on_dev else row_layout(ids, cnt, parts)
        if self._decode:
            self.stats.lookups += int((lay.cnt > 0).sum())
            self.stats.hits += len(lay.resident)
            self.tier.note(layer, ids.ravel().tolist())
        R = T * K
        if share_layer:
            cb.launch(layer, lay, s, threaded=True)                             # the CPU runs beside the GPU
        # compute order (not row order): one resident group while the first copies land, then a resident group
        # after each streamed group, so the compute stream reaches each streamed group's dequantisation, which
        # frees its ring slots, early (bench/prefill.py on the H200: 5-15% faster than streamed-first).
        # Every group's slots are known before any copy lands (walk entry k -> ring slot k mod R), so one
        # upload carries the whole layer's tables, the row tables (slot, src) with them.
        res_groups = self._runner.resident_groups(lay.resident[n_pre * self._runner.bufs.group:], lay)
        sgroups, unrouted = [], {}
        if self._walk is not None:   # stream-all: this layer's queue entries; unrouted ones just free their slot
            walk = self._walk
            sgroups, unrouted = self._stream_all_groups(layer, lay)
        elif pre is not None:        # a guessed walk: its unrouted guesses free their slots as the groups pass
            ks = range(len(walk.entries)) if not covered else sorted(set(range(len(walk.entries))) - set(covered))
            sgroups, unrouted = routed_groups(walk.entries, ks, set(lay.streamed),
                                              routed_group(self._ring.n, self._runner.bufs.group), self._ring.n)
            self.stats.guessed_unrouted += sum(len(v) for v in unrouted.values())
        elif walk is not None:       # routed-only: this layer's streamed experts in id order, a group ahead
            # (policy.routed_group: 16 a group, 4 in decode's 8-slot ring): one group's copies land while the group
            # before computes
            sgroups = walk_runs(list(range(len(lay.streamed))), walk.group, self._ring.n)
        cache = self.cache
        plan = [(m, cache.buf, cache.slot_of[layer, m]) for m in res_groups]
        plan += [([walk.entries[kq][1] for kq in g], self._ring.buf, walk.slots(g)) for g in sgroups]
        pre_on = n_pre + n_gpre > 0          # the rows and the gather were issued before the sync
        riders = () if pre_on else (lay.off.astype(np.int32),) if on_dev else (lay.slot, lay.src)  # in the tables'
        if plan:                                                                                  # one upload
            tabs, dev_riders = self._runner.tables(layer, plan, lay, riders=riders)
        elif riders:                                     # every routed expert on the CPU
            tabs, dev_riders = [], k.upload_many(list(riders), s)
        else:                                            # every routed expert in the pre-sync groups
            tabs, dev_riders = [], []
        if pre_on:
            slot_dev = bufs.slot
        elif on_dev:
            k.route_rows(bufs.slot, bufs.src, ids_dev, dev_riders[0], bufs.hist, P, K, s)
            slot_dev, src_dev = bufs.slot, bufs.src         # whole: the kernels read their first P (no views made)
        else:
            slot_dev, src_dev = dev_riders
        if not pre_on:
            k.gather_f16(bufs.xg[:R], h, src_dev, s)                            # Xg [R, D] fp16, row order
        res_tabs, str_tabs = tabs[:len(res_groups)], tabs[len(res_groups):]
        if not self._decode:
            self.stats.layout_s += time.perf_counter() - t_synced
            self.stats.layouts += 1
        ri = 0
        if res_groups and sgroups:          # the compute stream is idle while the first copies land
            self._runner.group(layer, res_groups[0], res_tabs[0], lay)
            ri = 1
        for gi, grp in enumerate(sgroups):
            if grp[0] in unrouted:                     # release the unrouted entries the walk has passed
                walk.consume(unrouted[grp[0]])
            walk.ensure_issued(grp[-1])
            walk.acquire(grp)
            self._runner.group(layer, plan[len(res_groups) + gi][0], str_tabs[gi], lay,
                               on_released=lambda g=grp: walk.consume(g))
            walk.prefetch()
            if ri < len(res_groups):
                self._runner.group(layer, res_groups[ri], res_tabs[ri], lay)
                ri += 1
        if None in unrouted:
            walk.consume(unrouted[None])
        if self._walk is not None:
            self._walk.prefetch()            # stream-all: the next layer's experts go out before its routing sync
        for ri in range(ri, len(res_groups)):
            if inflight:
                adm.before_group(res_groups[ri])
            # a layer-major prompt's last chunk of a layer frees each group's slots for the next layer as it passes
            freed = (lambda g=res_groups[ri]: adm.released(layer, g)) if adm is not None and adm.last else None
            self._runner.group(layer, res_groups[ri], res_tabs[ri], lay, on_released=freed)
        if not self._decode:
            self.routes.note(layer, cnt, T)  # after the launches: the sync-to-first-group window is the GPU's idle
            if layer + 1 < c.n_layer:
                # this layer's walk is consumed: the next layer's guess may take the whole ring. Issued as soon as
                # the layer's last copy was out, into the slots its last groups did not hold, it was 0.98-0.99x
                # (bench/results/h200/ab_early_q8_stop35.log): fewer guesses, and host time before the last groups.
                # Picked before the routing sync and issued after the combine, 0.988-0.997x (knobs_ab_q8_stop45.log)
                self._guess(layer + 1, T)
        if share_layer:
            cb.gpu_done(s, lay)
        elif self._decode and cb is not None and lay.cpu:
            cb.launch(layer, lay, s, threaded=False)                            # after the GPU work is queued
            cb.decode_sample(len(lay.cpu), self.plan.slot_bytes / (self.h2d_gbps * 1e6))
        if cb is not None:
            cb.finish(layer, lay, nstream, bufs.dm, s, eligible=share_layer)
        if out is None:
            out = dev.empty((T, c.n_embd), np.float32)
        k.combine(out, bufs.dm, slot_dev, w_dev, s)                             # Σ_k w·Dm[row(t,k)]
        return out

    def _issue_pre(self, layer: int, h, ids_dev, P: int, nt: int) -> tuple[int, int, list]:
        """Before the routing sync, where presync.takes_pre says (a layer whose experts are all resident, a chunk of
        pre_min_tokens or more, below pre_wide_tokens in a narrow layer): the layer's rows (route_rows from the
        device's offsets) and gather, launch groups of its routed residents, then (the compute stream waiting for the
        guessed walk's copies) of its routed guessed experts (presync.py), behind the counts' download. The row order
        is the host's: the residents, then a guessed walk's experts in its order, then the others by id. As many
        residents' groups as the route memory expects routed residents (with a margin; those past them take the
        host's groups after the sync), at most pre_groups, and the larger GEMM row tile where it expects the routed
        experts to fill it. Returns the groups issued of each (residents, guessed) and, per guessed group, the event
        after which its members' ring slots are free."""
        k, s, runner = self.k, self.dev.compute, self._runner
        bufs, G, K, T = runner.bufs, runner.bufs.group, self.cfg.n_expert_used, h.shape[0]
        res_mask = self.cache.resident(layer)
        resident = np.flatnonzero(res_mask)
        streamed = lambda: self.routes.expected(layer, T, ~res_mask)     # asked only where the rule needs it
        if not takes_pre(T, resident.size == res_mask.size, streamed, self._ring.n, self.pre_min_tokens,
                         self.pre_wide_tokens):
            return 0, 0, []          # a short chunk, a broad layer: the host's groups were as fast or faster
        walk = self._pre[1] if self._pre is not None else None
        n_g = len(walk.entries) if walk is not None else 0
        want = self.routes.expected(layer, T, res_mask)
        want = resident.size if want is None else min(resident.size, int(PRE_MARGIN * want + 1.0))
        J1 = min(self.pre_groups, -(-want // G))
        J = J1 + min(self.pre_guessed, -(-n_g // G))
        rows = self.routes.mean_rows(layer, T)
        tiling = runner.pre_tiling(rows is not None and rows >= PRE_BIG_ROWS)
        fill = fills(T, K, G, *tiling)
        pt = runner.pre
        if not J or J > pt.shape.J or fill[0] > pt.shape.sf or fill[1] > pt.shape.sg:
            return 0, 0, []                         # none, or the carved tables cannot hold them (few_rows too large)
        order = resident
        blobs = [(self.cache.buf, self.cache.slot_of[layer, resident])]
        if walk is not None:                        # a guessed walk (_guess): its entries follow the residents
            order = np.concatenate([resident, np.asarray([e for _, e in walk.entries], np.int64)])
            blobs.append((self._ring.buf, walk.slots(list(range(n_g)))))
        # the plan's input in the block of this layer's parity: the device read the other's two layers ago, before
        # the counts of the layer between, which the host has waited for (the routing sync)
        if self.pre_head:
            pin = self.plan_in[layer % 2]
            k.plan_write(pin[0], pt.shape, nt, order, resident.size, blobs, runner.offsets[layer], J1, J, tiling, fill)
            runner.pre_head(layer, pin, ids_dev, h, P, J1, J, fill, tiling, rows)   # the residents' groups with it
            if J == J1:
                return J1, 0, []
            walk.ensure_issued(n_g - 1)             # the guessed copies have landed (all were issued at the guess)
            walk.acquire(list(range(n_g)))
            runner.pre_tail(layer, J1, J, fill, tiling, rows)
            read = self.dev.event(timing=False)     # their ring slots are free from then (after the sync)
            read.record(self.dev.compute)
            return J1, J - J1, [read] * (J - J1)
        # pre_head off (bench/knobs_ab.py): each launched alone, a group's launches one graph (stop 54's)
        k.plan_groups(pt, bufs.hist, nt, order, resident.size, blobs, runner.offsets[layer], J1, J, tiling, fill, s)
        k.route_rows(bufs.slot, bufs.src, ids_dev, k.pre_route_off(pt), bufs.hist, P, K, s)
        k.gather_f16(bufs.xg[:P], h, bufs.src, s)                              # Xg [R, D] fp16, row order
        for j in range(J1):
            runner.group_pre(layer, k.pre_group(pt, j, fill, tiling[2]), None, rows)
        reads = []
        for j in range(J1, J):
            if j == J1:                             # the guessed copies have landed (all were issued at the guess)
                walk.ensure_issued(n_g - 1)
                walk.acquire(list(range(n_g)))
            read = self.dev.event(timing=False)     # its members' ring slots are free from then (after the sync)
            reads.append(read)
            runner.group_pre(layer, k.pre_group(pt, j, fill, tiling[2]), read, rows)
        return J1, J - J1, reads

    def _guess(self, layer: int, T: int) -> None:
        """In a routed-only prompt chunk of T tokens, issue the copies of the experts `layer` likely routes
        (policy.guess, a ring's worth) before its routing sync, so the link carries them while the GPU finishes the
        layer before and the host waits in the sync. Beside the CPU share only where its policy says (guesses: a
        layer it keeps unshared on a settled verdict): the share picks its experts after the sync, and beside auto's
        share guesses (left to the GPU) were 0.94-1.01x on qwen3's quarter cache and 0.83-0.89x on flash-shape's
        (ab_guess_share_*_stop35.log); with none beside it, auto's default ran qwen3's 250-token prompt ~10% slower
        than the share off while sharing nothing (bench/results/h200/share_q8_stop50.log)."""
        if not self.guess or self._walk is not None or self._admissions is not None or (
                self.cpu_block is not None and self._shareable and self.share.on
                and not self.cpu_block.policy.guesses(layer)):
            return
        experts = self.routes.guess(layer, T, self.cache.resident(layer), self._ring.n)
        if experts:
            walk = Walk(self._ring, self.arena, [(layer, e) for e in experts])
            walk.prefetch()
            self._pre = (layer, walk)
            self.stats.guessed += len(experts)

    def _stream_all_groups(self, layer, lay):
        """The stream-all walk's groups of this layer's routed entries, and the unrouted entries to release:
        unrouted[first entry of a group] = those passed before it, unrouted[None] = those after the last."""
        walk = self._walk
        rng = self._layer_entries.get(layer, range(0))
        groups, unrouted = routed_groups(walk.entries, rng, set(lay.streamed),
                                         min(self._runner.bufs.group, self._ring.n // 2), self._ring.n)
        self._unrouted += sum(len(v) for v in unrouted.values())
        return groups, unrouted
