"""The harness of the kernel A/B scripts (norm_rope_ab.py, rms_norm_ab.py): a kernel's old form (compiled from its
text in the script) against the tree's, CUDA only.

- `alone`: GPU us a launch by events around REPS launches queued behind a busy GPU (the host's launch cost is not
  timed: a decode graph replays them back to back), the arms interleaved, medians; the outputs compared bit for bit.
- `prompts` and `decode`: two quarter-cache engines on one arena (bench/prefill.py's), one on each form (its eager
  launches and the prompt and decode graphs it captures: the engines share the device's kernels, so `use` sets the
  method before each arm runs); arms alternating; medians, per-round ratios, logits compared bit for bit."""
import time, numpy as np
import cupy as cp
from strata.accel.gpu import dequant as dq

from prefill import quarter_engines, warm      # bench/prefill.py

REPS = 20


def compile_old(text: str, name: str):
    """The old kernel `name` from its text, compiled beside engine_kernels.cu's helpers."""
    return cp.RawModule(code=dq.source("engine_kernels.cu") + text, options=("--std=c++17",)).get_function(name)


class AB:
    def __init__(self, path: str, kernel: str, old, rounds: int):
        self.dev, self.m, self.arena, (eo, en) = quarter_engines(path, 2)
        self.kern, self.name, self.rounds = self.dev.k, kernel, rounds
        self.arms = {"old": (eo, old), "new": (en, getattr(self.kern, kernel))}
        self.busy = cp.empty(1 << 28, np.uint8)     # a 256 MiB memset ahead of each timing: the launches queue behind

    def use(self, md: str) -> None:
        setattr(self.kern, self.name, self.arms[md][1])

    def alone(self, label: str, launch) -> None:
        """launch(f) -> outputs (device arrays) of one launch of form f."""
        dev, outs, us = self.dev, {}, {"old": [], "new": []}
        for i in range(self.rounds * 4 + 2):
            for md in ("old", "new"):
                f = self.arms[md][1]
                e0, e1 = dev.event(), dev.event()
                with dev.compute.s:
                    self.busy.fill(i & 255)
                e0.record(dev.compute)
                for _ in range(REPS):
                    got = launch(f)
                e1.record(dev.compute)
                e1.synchronize()
                if i >= 2:
                    us[md].append(e0.elapsed_ms(e1) * 1e3 / REPS)
                outs[md] = [cp.asnumpy(a) for a in got]
        same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(outs["old"], outs["new"]))
        print(f"  {label}: old {np.median(us['old']):7.1f} us  new {np.median(us['new']):7.1f} us  old/new "
              f"x{np.median(us['old']) / np.median(us['new']):.2f}; bits identical: {same}", flush=True)

    def prompts(self, lengths, rng) -> None:
        dev, n_vocab = self.dev, self.m.cfg.n_vocab
        for md in self.arms:
            self.use(md)
            warm((self.arms[md][0],), lengths, rng, n_vocab)
        en = self.arms["new"][0]
        print(f"prompts: quarter cache {en.plan.cache_slots} slots, chunk {en.plan.chunk}; {self.rounds} rounds, arms "
              f"alternating; medians; ratio = old/new", flush=True)
        for L in lengths:
            t = {"old": [], "new": []}
            same = True
            for r in range(self.rounds):
                p = rng.integers(0, n_vocab, L).tolist()
                outs = {}
                for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    self.use(md)
                    e = self.arms[md][0]
                    e.reset()
                    dev.synchronize()
                    t0 = time.perf_counter()
                    outs[md] = e.prefill(p)
                    t[md].append((time.perf_counter() - t0) * 1e3)
                    dev.synchronize()
                same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
            rr = np.array(t["old"]) / np.array(t["new"])
            print(f"  {L:5d}: old {np.median(t['old']):7.2f} ms  new {np.median(t['new']):7.2f} ms  old/new "
                  f"x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}, median "
                  f"{np.median(rr):.3f}); logits identical: {same}", flush=True)

    def decode(self, rng, n: int = 32) -> None:
        """Each engine after a 64-token prompt, n teacher-forced random tokens (its captured decode graph)."""
        dev, n_vocab = self.dev, self.m.cfg.n_vocab
        tps, same = {"old": [], "new": []}, True
        for r in range(self.rounds):
            p = rng.integers(0, n_vocab, 64).tolist()
            d = rng.integers(0, n_vocab, n).tolist()
            outs = {}
            for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
                self.use(md)
                e = self.arms[md][0]
                e.reset()
                e.prefill(p)
                dev.synchronize()
                t0 = time.perf_counter()
                for tok in d:
                    last = e.decode([tok])
                dev.synchronize()
                tps[md].append(len(d) / (time.perf_counter() - t0))
                outs[md] = np.asarray(last)
            same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
        rr = np.array(tps["new"]) / np.array(tps["old"])
        print(f"  decode: old {np.median(tps['old']):.1f} tok/s  new {np.median(tps['new']):.1f} tok/s  new/old "
              f"x{np.median(tps['new']) / np.median(tps['old']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}); last "
              f"logits identical: {same}", flush=True)


class EngineAB(AB):
    """Two engines already built on one device and model as the arms (prompts() only): engines that differ in their
    setup, not in a kernel (bench/auto_guess_ab.py, bench/plain_rows_ab.py)."""
    def __init__(self, dev, m, old, new, rounds: int):
        self.dev, self.m, self.rounds = dev, m, rounds
        self.arms = {"old": (old, None), "new": (new, None)}

    def use(self, md: str) -> None:
        pass


def share_engines(path: str, shares):
    """Quarter-cache engines on one CUDA device, arena and CPU pool (one worker a core but one), one a CPU share
    (None: auto, 0.0: off): (dev, model, pool, engines). The engines' configs are the process's but for the share."""
    import dataclasses
    from strata import models, policy
    from strata.accel.arena import Arena
    from strata.accel.cpu.pool import ExpertPool, default_workers
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding
    dev = CudaDevice(); m = models.load(path); c = m.cfg
    budget = budget_holding(m, 8200, int(0.25 * c.n_layer * c.n_expert))
    arena = Arena(m, dev)
    pool = ExpertPool(workers=max(1, default_workers() - 1))
    base = policy.from_process()
    return dev, m, pool, [GpuEngine(m, dev, n_ctx=8200, vram_budget=budget, arena=arena, pool=pool,
                                    config=dataclasses.replace(base, cpu_share=sh)) for sh in shares]


def settle_gates(engines, lengths) -> None:
    """Preset each engine's auto gate, in the size classes of `lengths`, to a settled "do not share" (five ratios of
    2.0: no exploration, a probe 1 layer in 29), as on a machine where the CPU loses."""
    from strata.policy import size_class
    for e in engines:
        for L in lengths:
            g = e.cpu_block.policy._class(size_class(L)).gate
            g.ratios.extend([2.0] * 5)
            g.gate = False


def share_line(e) -> str:
    """An auto engine's CPU share so far: experts and layers the CPU took, each size class's gate."""
    cb = e.cpu_block
    return (f"CPU experts {cb.stats.get('cpu_experts', 0)}, shared layers {cb.stats.get('shared_layers', 0)}; "
            + ", ".join(f"class {k}: gate {'share' if v.gate.gate else 'do not share'}, exploring "
                        f"{v.gate.exploring()}, layers {v.gate.layers}, vetoed {v.vetoed}"
                        for k, v in sorted(cb.policy.by_class.items())))
