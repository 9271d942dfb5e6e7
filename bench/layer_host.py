"""Diagnostic, CUDA only: where a prompt layer's host time goes, phase by phase (bench/host_lines.py has the
statements). Per MoE block: from its entry to its routing sync ("pre": the counts' download, the pre-sync groups),
the sync's wait, from the sync to the layout's end ("layout": placement, row order, tables, the gather), from there
to the block's exit ("post": the streamed groups, the copies, the next layer's guess, the combine), and from the exit
to the next block's entry ("dense-issue": the next dense segment). Medians over layers 0-2 (broad on the
synthesised qwen3) and over the others; where "sync wait" is near 0 the host is the prompt's bound.

python bench/layer_host.py MODEL.gguf 250,900 0.25,1.0     (prompt lengths; the share of experts cached)"""
import sys, time, dataclasses
import numpy as np
from strata import models, policy
from strata.accel import moe_block as MB
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding

path, lengths, fracs = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], [float(x) for x in sys.argv[3].split(",")]
m = models.load(path); c = m.cfg
dev = CudaDevice()
arena = Arena(m, dev)
cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
REC = None                      # the readings of the prompt being timed: ("t", time) by the block's own clock calls,


class Clock:                    # ("in" | "out", layer, time) at a block's entry and exit
    """moe_block's `time`: its three perf_counter calls a block (before and after the routing sync, after the
    layout's gather) are recorded."""

    @staticmethod
    def perf_counter():
        t = time.perf_counter()
        if REC is not None:
            REC.append(("t", t))
        return t


MB.time = Clock
ob = MB.MoeBlock._block


def blk(self, h, layer, *a, **kw):
    if REC is None:
        return ob(self, h, layer, *a, **kw)
    REC.append(("in", layer, time.perf_counter()))
    r = ob(self, h, layer, *a, **kw)
    REC.append(("out", layer, time.perf_counter()))
    return r


MB.MoeBlock._block = blk
n_ctx = 8200
rng = np.random.default_rng(0)
for frac in fracs:
    eng = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget_holding(m, n_ctx, int(frac * c.n_layer * c.n_expert)),
                    config=cfg, arena=arena, log=lambda s: None)
    for L in lengths:
        ids = rng.integers(0, c.n_vocab, L).tolist()
        for _ in range(3):
            eng.reset(); eng.prefill(ids)
        rows = []
        walls = []
        for r in range(5):
            REC = []
            eng.reset(); dev.synchronize(); t0 = time.perf_counter(); eng.prefill(ids); dev.synchronize()
            walls.append((time.perf_counter() - t0) * 1e3)
            rec, REC = REC, None
            blocks = []
            i = 0
            while i < len(rec):
                if rec[i][0] == "in":
                    lay, t_in = rec[i][1], rec[i][2]
                    ts = []
                    i += 1
                    while rec[i][0] == "t":
                        ts.append(rec[i][1]); i += 1
                    assert rec[i][0] == "out"
                    blocks.append((lay, t_in, ts, rec[i][2]))
                i += 1
            for b, (lay, t_in, ts, t_out) in enumerate(blocks):
                nxt = blocks[b + 1][1] if b + 1 < len(blocks) else None
                pre = ts[0] - t_in; wait = ts[1] - ts[0]
                lo = (ts[2] - ts[1]) if len(ts) > 2 else float("nan")
                post = t_out - (ts[2] if len(ts) > 2 else ts[1])
                dense = (nxt - t_out) if nxt is not None else float("nan")
                rows.append((lay, pre, wait, lo, post, dense))
        a = np.array(rows) * np.array([1] + [1e6] * 5)
        print(f"{path.split('/')[-1]} frac {frac} {L} tokens: wall median {np.median(walls):.2f} ms {[round(w, 1) for w in walls]}")
        for name, sel in (("layers 0-2", a[:, 0] < 3), ("layers 3+", a[:, 0] >= 3)):
            med = np.nanmedian(a[sel, 1:], axis=0)
            print(f"  {name}: us per layer, medians: pre {med[0]:.0f}  sync wait {med[1]:.0f}  layout {med[2]:.0f}  post {med[3]:.0f}  dense-issue {med[4]:.0f}  (sum {np.nansum(med):.0f})")
        print(f"  whole prompt sums (ms, per prompt): pre {np.nansum(a[:,1])/5e3:.2f} wait {np.nansum(a[:,2])/5e3:.2f} layout {np.nansum(a[:,3])/5e3:.2f} post {np.nansum(a[:,4])/5e3:.2f} dense {np.nansum(a[:,5])/5e3:.2f}")
    del eng
