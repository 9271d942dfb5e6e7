"""Where a layer-major prompt's time goes (policy.layer_major), per layer: the host's wall from the layer's first
chunk to its last, the GPU's (timing events on the compute stream at each layer's end), the experts admitted
before the layer's chunks (prefetched) and at their routing syncs, and the host's time blocked in routing syncs.
Quarter cache as bench/prefill.py's, CPU share off; the resident engine's time on the same prompt beside it.

python bench/layer_major_timeline.py MODEL.gguf TOKENS ROUNDS"""
import sys, time, dataclasses, statistics, numpy as np
from strata import models, policy
from strata.accel import layer_major as lm
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding

path, T, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dev = CudaDevice()
m = models.load(path); c = m.cfg
n_ctx = 8200
arena = Arena(m, dev)
cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
eq = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget_holding(m, n_ctx, c.n_layer * c.n_expert // 4), config=cfg,
               arena=arena)
er = GpuEngine(m, dev, n_ctx=n_ctx, config=cfg, arena=arena)
rec = {}
orig_done, orig_admit, orig_routed = lm.Admissions.layer_done, lm.Admissions.admit, lm.Admissions.routed


def layer_done(self, layer):
    ev = dev.event()
    ev.record(dev.compute)
    rec["marks"].append((layer, time.perf_counter(), ev))
    orig_done(self, layer)


def admit(self, layer, experts, protect):
    n = orig_admit(self, layer, experts, protect)
    rec["admit"].setdefault(layer, [0, 0])[0 if rec.get("in_sync") is None else 1] += n
    return n


def routed(self, layer, cnt):
    rec["in_sync"] = layer
    try:
        return orig_routed(self, layer, cnt)
    finally:
        rec["in_sync"] = None


lm.Admissions.layer_done, lm.Admissions.admit, lm.Admissions.routed = layer_done, admit, routed
rng = np.random.default_rng(0)
rows, walls, res = [], [], []
for r in range(rounds + 1):
    p = rng.integers(0, c.n_vocab, T).tolist()
    er.reset(); dev.synchronize(); t0 = time.perf_counter(); er.prefill(p); dev.synchronize()
    res.append((time.perf_counter() - t0) * 1e3)
    rec.update(marks=[], admit={}, in_sync=None)
    eq.reset(); dev.synchronize()
    e0 = dev.event(); e0.record(dev.compute)
    w0 = eq.stats.sync_wait_s
    t0 = time.perf_counter(); eq.prefill(p); t1 = time.perf_counter(); dev.synchronize()
    walls.append((t1 - t0) * 1e3)
    prev_t, prev_e, per = t0, e0, []
    for layer, th, ev in rec["marks"]:
        a = rec["admit"].get(layer, [0, 0])
        per.append(((th - prev_t) * 1e3, prev_e.elapsed_ms(ev), a[0], a[1]))
        prev_t, prev_e = th, ev
    if r:
        rows.append(per)
print(f"{path}: {T} tokens, quarter cache (chunk {eq.plan.chunk}, loan {eq.plan.loan_slots}); walks of the last "
      f"prompt {sorted(set((n, w) for n, w, _ in eq.stats.chunks[-12:]))}; medians of {rounds}: wall "
      f"{statistics.median(walls[1:]):.1f} ms, resident engine {statistics.median(res[1:]):.1f} ms")
print(" layer  host ms  GPU ms  prefetched  at-sync")
for l in range(len(rows[0])):
    col = lambda i: statistics.median(x[l][i] for x in rows)
    print(f"{l:6d} {col(0):8.2f} {col(1):7.2f} {col(2):11.0f} {col(3):8.0f}")
