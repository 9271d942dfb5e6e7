"""The CPU's block of a layer's experts: the prefill CPU share (SPEC §4-§6) and the decode misses (SPEC §8).

The CPU experts' rows are the tail of Dm. The layer's input rows reach pinned host memory by a device->host copy
enqueued before the routing sync; after the sync the pool computes its experts on the q8 path (on a thread during
prefill, so the GPU's experts and streaming run meanwhile; inline during decode), and their rows go back into
Dm's tail just before the combine; in a shared prefill layer the compute stream, not the engine thread, waits
for the pool (Device.wait_words on its count of finished tiles), so the thread goes on issuing. Timings for the
share policy come from device events (the meter's window: the CPU thread's launch to the end of the GPU's
experts; the gate's window: before the routing sync to just before the combine), read one layer late, at the
next routing sync, when they are complete.
"""

from __future__ import annotations

import sys
import threading
import time

import numpy as np

from strata.policy import (CHOOSERS, MAXT, PRIME_EXPERTS, PRIME_TOKENS, ChooserKind, LayerEnd, llround,
                           share_policy)
from strata.policy.share import ShareKind


def run_share(pool, plan) -> None:
    """Run a planned batch as the prefill share does: submitted to the workers and waited for, the engine thread
    taking no tiles (launch, settle); a pool of the host thread alone runs it inline (on a share's own thread)."""
    if pool.workers > 0:
        pool.submit(*plan)
        pool.wait()
    else:
        pool.run_plan(*plan)


class CpuBlock:
    def __init__(self, dev, cfg, arena, pool, share, config, cap: int, log=None):
        self.dev, self.cfg, self.arena, self.pool = dev, cfg, arena, pool
        self.config = config
        self.policy = share_policy(share)
        self.auto = self.policy.kind in (ShareKind.AUTO, ShareKind.AUTO_ONE, ShareKind.AUTO_UNGATED)
        self.chooser = CHOOSERS.create(ChooserKind.FEWEST_FIRST)
        self.in_ram = np.ones(cfg.n_expert, bool)     # every blob sits in the pinned arena
        D, K = cfg.n_embd, cfg.n_expert_used
        # pinned staging, sized once for the largest step so no window pays an allocation
        self.x_host = dev.pinned(cap * D * 4).view(np.float32).reshape(cap, D)
        # the CPU's rows: its experts take at most MAXT tokens each (the share's candidates, SPEC §4; a decode
        # round), so at most n_expert·MAXT rows, however long the chunk
        rows = min(cap * K, cfg.n_expert * MAXT)
        self.rows_host = dev.pinned(rows * D * 4).view(np.float32).reshape(rows, D)
        self.xs_host = np.empty((rows, D), np.float32)            # the CPU experts' input rows, in row order
        self._templates: dict = {}
        self.ev = [[dev.event() for _ in range(4)] for _ in range(2)]   # per parity: wall0, wall1, cpu0, cpu1
        self.parity = 0
        self.pending_parity = None
        self.thread = None
        self.submitted = False            # a batch submitted to the pool's workers (the share, threaded)
        self.cpu_ms = 0.0
        self.stats = {"layers": 0, "cpu_experts": 0, "shared_layers": 0}
        self.taken: dict[int, tuple[int, ...]] = {}     # layer -> the CPU's experts in its latest eligible layer
        self.last_cpu: dict[int, tuple[int, ...]] = {}  # layer -> the CPU's experts in the latest step
        self.decode_frac = 0.5           # decode: the share of misses the CPU takes (cost model, below)
        self._c_ms = self._g_ms = None
        self._words = None               # the pool's control words as the device maps them (first share)
        self._open: tuple | None = None  # a shared layer whose pool batch the device waits on: settle() ends it
        self.prior: tuple[float, float] | None = None   # (CPU, streamed) ms an expert measured at load: prime()
        self.log = log or (lambda s: print(s, file=sys.stderr))

    def prime(self, c_ms: float, g_ms: float) -> bool:
        """Keep the load-time costs an expert; the current policy's unsampled meter, and every one swapped in
        later, starts from them (policy.ShareMeter.prime). True if the current policy took them."""
        self.prior = (c_ms, g_ms)
        return self.policy.prime(c_ms, g_ms)

    def probe_prior(self, h2d_gbps: float, n: int = PRIME_EXPERTS, tokens: int = PRIME_TOKENS, reps: int = 3,
                    clock=time.perf_counter):
        """Costs an expert for prime(), at load: the pool's wall ms an expert over a batch of `n` layer-0 experts
        of `tokens` tokens (policy.PRIME_EXPERTS, PRIME_TOKENS), run as a share runs it (run_share: the plan built
        before the clock starts), median of `reps` after one that warms up; a blob's copy at the H2D rate
        `h2d_gbps`. -> (c_ms, g_ms, n, tokens). On the H200 (stop 25, share_f_full_stop25c.log) the 14-worker
        pool read 0.114 ms an expert, what bench/cpu_pool.py's probe gives a 32-expert batch of 2 tokens
        (0.107 + 0.218 / 32); through pool.run, the engine thread taking tiles and the plan's Python on the clock,
        it had read 0.348 (share_f_full_stop24b.log)."""
        from strata.accel.cpu.pool import ExpertJob

        c, l = self.cfg, 0
        n = min(n, c.n_expert)
        # rows of their own per expert, as in a prompt (experts that share input rows share their quantisation)
        x = np.random.default_rng(0).standard_normal((n, tokens, c.n_embd)).astype(np.float32)
        out = np.zeros((n, tokens, c.n_embd), np.float32)
        blobs, t = self.arena.layers[l], self.arena.types[l]
        plan = self.pool.plan([ExpertJob(blobs[e], t, c.n_embd, c.n_ff_exp, x[e], out[e]) for e in range(n)])
        walls = []
        for _ in range(reps + 1):
            t0 = clock()
            run_share(self.pool, plan)
            walls.append((clock() - t0) * 1e3 / n)
        return sorted(walls[1:])[reps // 2], blobs[0].nbytes / (h2d_gbps * 1e6), n, tokens

    def swap(self, policy) -> None:
        """Make `policy` current, each policy keeping its own event sets and pending window (a reading is
        read at that policy's next routing sync, as across requests)."""
        saved = getattr(self, "_saved", {})
        saved[id(self.policy)] = (self.policy, self.ev, self.parity, self.pending_parity)
        self._saved = saved
        _, self.ev, self.parity, self.pending_parity = saved.get(
            id(policy), (policy, [[self.dev.event() for _ in range(4)] for _ in range(2)], 0, None))
        self.policy = policy
        self.auto = policy.kind in (ShareKind.AUTO, ShareKind.AUTO_ONE, ShareKind.AUTO_UNGATED)
        if self.prior is not None:
            policy.prime(*self.prior)

    # --- prefill: the share ------------------------------------------------------------------------------------
    def rouse_ahead(self, layer: int) -> None:
        """Wake the pool's parked workers a layer ahead of `layer` if the share will arm it (peek_arm): a parked
        worker needs the GIL, which the engine thread holds while it issues after publishing a batch, and takes it
        in the routing sync before (bench/pool_wake.py). Not for a layer left unshared: awake workers spin, then doze
        in 50 us sleeps for 200 ms, and the engine thread issued 5-8% slower beside them on the H200
        (bench/results/h200/doze_q8_stop52.log; bench/rouse_ab.py's "off, roused" arm), which cost a settled "do not
        share" every prompt."""
        if layer < self.cfg.n_layer and self.policy.peek_arm(layer):
            self.pool.rouse()

    def begin_layer(self, layer: int, h, stream) -> bool:
        """Top of an eligible layer (routed-only walk, pool free): the arm; copies the input when it shares."""
        self.settle()
        arm = self.policy.begin_layer(layer)
        self.parity ^= 1
        ev = self.ev[self.parity]
        if self.auto:
            ev[0].record(stream)                                   # the gate's window opens before the sync
        if arm:
            self.dev.d2h(self.x_host[:h.shape[0]], h, stream)
        return arm

    def after_sync(self) -> None:
        """At the routing sync: read the previous eligible layer's windows (complete now) into the policy."""
        want = self.policy.wants()
        if not (want.gpu or want.wall) or self.pending_parity is None:
            return
        ev = self.ev[self.pending_parity]
        gpu_ms = ev[2].elapsed_ms(ev[3]) if want.gpu else None
        wall_ms = ev[0].elapsed_ms(ev[1]) if want.wall else None
        reading = self.policy.readings(gpu_ms, wall_ms)
        if self.config.dbg_cpu_gate:
            if self.policy.folded:
                self.log(self.policy.folded)
            if reading is not None:
                self.log(reading.line())

    def choose(self, cnt, resident) -> tuple[tuple[int, ...], int]:
        """An armed layer's CPU experts and nstream (an unarmed one's share is 0: the engine counts it alone)."""
        choice = self.chooser.choose(cnt, resident, self.in_ram, self.policy.share(True))
        return choice.cpu, choice.nstream

    def launch(self, layer: int, lay, stream, threaded: bool) -> None:
        """Start the pool on the layout's CPU experts (their rows are Dm's tail); the meter's window opens."""
        self.settle()
        self.cpu_ms = 0.0
        if not lay.cpu:
            return
        ev = self.ev[self.parity]
        if self.auto and threaded:
            ev[2].record(stream)
        jobs = self._jobs(layer, lay)
        if threaded and self.pool.workers > 0:   # the workers run it; the engine thread goes on issuing GPU work
            self.pool.submit(*jobs)
            self.submitted = True
        elif threaded:                           # a pool of the host thread alone: it needs a thread of its own
            self.thread = threading.Thread(target=self._run, args=(jobs,), name="cpu share", daemon=True)
            self.thread.start()
        else:
            self._run(jobs)

    def _run(self, jobs) -> None:
        t0 = time.perf_counter()
        self.pool.run_plan(*jobs)
        self.cpu_ms = (time.perf_counter() - t0) * 1e3

    def _jobs(self, layer: int, lay):
        """The pool's plan rows for the layout's CPU experts, built in numpy: one gather of their input rows in
        row order, then per expert its blob's addresses and its slices of the inputs and of the output rows."""
        from strata.accel.cpu import _sched as S
        from strata.accel.cpu._llvm import address

        D = self.cfg.n_embd
        cpu = np.asarray(lay.cpu, np.int64)
        r0 = lay.starts[lay.rank[cpu]]                            # each CPU expert's first row
        n = lay.cnt[cpu].astype(np.int64)
        base, rows = int(r0[0]), int(n.sum())                     # the CPU block is the tail, in id order
        xs = self.xs_host[:rows]
        np.take(self.x_host, lay.src[base:base + rows], axis=0, out=xs)
        tmpl, blob0, stride = self._template(layer)
        plan = np.repeat(tmpl[None, :], len(cpu), axis=0)
        for j, col in enumerate((S.J_GW, S.J_UW, S.J_DW)):
            plan[:, col] = blob0[j] + cpu * stride
        plan[:, S.J_N] = n
        plan[:, S.J_X] = address(xs) + (r0 - base) * D * 4
        plan[:, S.J_OUT] = address(self.rows_host) + (r0 - base) * D * 4
        return plan, np.arange(len(cpu), dtype=np.int64), (xs, self.rows_host, self.arena.layers[layer])

    def _template(self, layer: int):
        """A plan row for this layer's experts (the pool's own, from a one-row job), the addresses of expert 0's
        gate, up and down, and the blob stride: per layer format, once."""
        from strata.accel.cpu import _sched as S
        from strata.accel.cpu.pool import ExpertJob

        got = self._templates.get(layer)
        if got is None:
            D, F = self.cfg.n_embd, self.cfg.n_ff_exp
            blobs = self.arena.layers[layer]
            job = ExpertJob(blobs[0], self.arena.types[layer], D, F, self.x_host[:1], self.rows_host[:1])
            plan, _, _ = self.pool.plan([job])
            got = self._templates[layer] = (plan[0].copy(), plan[0, [S.J_GW, S.J_UW, S.J_DW]].copy(),
                                            blobs.strides[0])
        return got

    def gpu_done(self, stream, lay) -> None:
        """After the GPU's expert work is enqueued: the meter's window closes there. Only a layer whose CPU took
        experts leaves the meter a sample (ShareMeter.wants_sample), so only there is the window read."""
        if self.auto and lay.cpu:
            self.ev[self.parity][3].record(stream)

    def finish(self, layer: int, lay, nstream: int, dm, stream, eligible: bool) -> None:
        """Copy the CPU's rows into Dm's tail once it is done; the gate's window closes here; the layer ends for
        the policy in settle(). A batch the pool's workers run is waited for by the stream, not the engine thread:
        the thread goes on issuing the combine and the next layer's dense work (a shared layer then costs no
        host-issue gap after its window, where the gate cannot see it), and settle() runs before the next layer
        begins. A CPU thread, or the inline decode batch, is waited for here and the layer ends at once."""
        on_stream = self.submitted and eligible
        first = False
        if on_stream:
            first = self._words is None          # mapping the words (page-locking them) is a one-time cost
            if first:
                self._words = self.dev.map_words(self.pool.control_words)
            self.dev.wait_words(self._words, *self.pool.done_word(), stream)
        else:
            self.settle()
            if self.submitted:
                self.cpu_ms = self.pool.wait()
                self.submitted = False
            if self.thread is not None:
                self.thread.join()
                self.thread = None
        cpu = self.last_cpu[layer] = tuple(lay.cpu)
        if eligible:
            self.taken[layer] = cpu
        if lay.cpu:
            base = int(lay.off[lay.cpu[0]])
            n = sum(int(lay.cnt[e]) for e in lay.cpu)
            self.dev.h2d(dm[base:base + n], self.rows_host[:n], stream)
            self.stats["cpu_experts"] += len(lay.cpu)
            self.stats["shared_layers"] += 1
        if eligible:
            if self.auto:
                self.ev[self.parity][1].record(stream)
            self._open = (layer, nstream, len(lay.cpu), self.parity, first)
            if not on_stream:
                self.settle()

    def settle(self) -> None:
        """End the open eligible layer for the policy: its CPU wall time (waiting for the pool if the stream
        did), then the policy's layer end, in the order the policy sees layers (before the next one begins).
        The window's closing event was recorded on the stream after the rows' copy, so it still spans what
        SPEC §6 says."""
        if self._open is None:
            return
        layer, nstream, n_cpu, parity, one_time = self._open
        self._open = None
        if self.submitted:
            self.cpu_ms = self.pool.wait()
            self.submitted = False
        self.stats["layers"] += 1
        want = self.policy.end_layer(LayerEnd(layer, nstream, n_cpu, self.cpu_ms, one_time))
        self.pending_parity = parity if (want.gpu or want.wall) else None

    # --- decode: misses on the CPU ---------------------------------------------------------------------------
    def decode_split(self, misses: list[int]) -> list[int]:
        """The misses the CPU computes; the rest stream over PCIe. A running cost model (ms per expert on each
        side, α 0.25) sets the CPU's fraction where both would finish together."""
        n_cpu = llround(self.decode_frac * len(misses))
        return misses[:n_cpu]

    def decode_sample(self, n_cpu: int, pcie_ms_per_expert: float) -> None:
        """After a decode layer: the CPU's ms per expert (measured) against PCIe's (blob ÷ measured H2D)."""
        if n_cpu:
            c = self.cpu_ms / n_cpu
            self._c_ms = c if self._c_ms is None else self._c_ms + 0.25 * (c - self._c_ms)
            g = pcie_ms_per_expert
            self.decode_frac = min(0.95, max(0.05, g / (self._c_ms + g)))
