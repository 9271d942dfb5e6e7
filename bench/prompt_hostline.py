"""Diagnostic: one prompt's host chain per layer on the quarter cache (share off), CUDA only. Per layer, the host's ms
from the layer's forward_block call to its moe() call (the dense part's issue), in the routing sync, from the sync
to the first launch group (the GPU idle), from there to moe()'s return (the groups, the combine, the next layer's
guess), and from that to the next layer's forward_block. Medians of ROUNDS prompts of TOKENS random tokens.

python bench/prompt_hostline.py MODEL.gguf TOKENS ROUNDS

(bench/results/h200/hline_q8_stop36.log, run as .scratch/hline.py: this file.)"""
import sys, time, dataclasses, numpy as np
from strata import models, policy
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding
import strata.accel.moe as M
path, L, R = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
m = models.load(path); c = m.cfg
dev = CudaDevice(); arena = Arena(m, dev)
cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
e = GpuEngine(m, dev, n_ctx=8200, vram_budget=budget_holding(m, 8200, c.n_layer * c.n_expert // 4), config=cfg, arena=arena)
T = []
fb = m.forward_block
def fb_w(ops, x, layer, pos):
    T.append(("fb", layer, time.perf_counter())); return fb(ops, x, layer, pos)
m.forward_block = fb_w
om = e.moe
def moe_w(h, layer, *a, **kw):
    T.append(("moe", layer, time.perf_counter())); out = om(h, layer, *a, **kw); T.append(("ret", layer, time.perf_counter())); return out
e.ops.moe = moe_w
sy = e.sync_ev.synchronize
def sy_w():
    r = sy(); T.append(("sync", -1, time.perf_counter())); return r
e.sync_ev.synchronize = sy_w
og = M.ExpertRunner.group
def g_w(self, layer, *a, **kw):
    T.append(("grp", layer, time.perf_counter())); return og(self, layer, *a, **kw)
M.ExpertRunner.group = g_w
rng = np.random.default_rng(0)
for _ in range(3):
    e.reset(); e.prefill(rng.integers(0, c.n_vocab, L).tolist())
rows = {l: [] for l in range(c.n_layer)}; walls = []
for r in range(R):
    T.clear(); e.reset(); dev.synchronize(); t0 = time.perf_counter()
    e.prefill(rng.integers(0, c.n_vocab, L).tolist()); t1 = time.perf_counter(); dev.synchronize()
    walls.append((t1 - t0) * 1e3)
    ev = T[:]
    for l in range(c.n_layer):
        i_fb = next(i for i, x in enumerate(ev) if x[0] == "fb" and x[1] == l)
        i_m = next(i for i in range(i_fb, len(ev)) if ev[i][0] == "moe")
        i_s = next(i for i in range(i_m, len(ev)) if ev[i][0] == "sync")
        i_g = next((i for i in range(i_s, len(ev)) if ev[i][0] in ("grp", "ret")), None)
        i_r = next(i for i in range(i_m, len(ev)) if ev[i][0] == "ret")
        nxt = next((ev[i][2] for i in range(i_r, len(ev)) if ev[i][0] == "fb"), t1)
        rows[l].append([(ev[i_m][2] - ev[i_fb][2]) * 1e3, (ev[i_s][2] - ev[i_m][2]) * 1e3, (ev[i_g][2] - ev[i_s][2]) * 1e3,
                        (ev[i_r][2] - ev[i_g][2]) * 1e3, (nxt - ev[i_r][2]) * 1e3, sum(1 for i in range(i_s, i_r) if ev[i][0] == "grp")])
print(f"{path} {L} tokens, quarter cache: wall {np.median(walls):.2f} ms (medians of {R}; host ms per layer)")
print(" layer  dense-issue  in-sync  sync->1st-group  groups..ret  ret->next  groups")
for l in range(c.n_layer):
    a = np.median(np.array(rows[l]), 0)
    print(f" {l:5d} {a[0]:11.3f} {a[1]:8.3f} {a[2]:16.3f} {a[3]:12.3f} {a[4]:10.3f} {a[5]:7.0f}")
