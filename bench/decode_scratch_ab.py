"""In one process: a routed-only prompt borrowing decode's weight scratch and giving its room to the ring
(memplan.for_prompt since stop 38: group DECODE_SCRATCH, a ring of up to ROUTED_ONLY_SLOTS within the loan it would
have taken) against carving a scratch of its own beside a ring of at most the plan's (the same plan with
rows=None: the code before). Two quarter-cache engines on one arena, the CPU share off, arms alternating; logits
compared bit for bit (the launch groups differ, the sums do not); MB streamed, the ratio to each arm's PCIe floor,
the ring, the loan and the refill after the prompt reported. CUDA only.

python bench/decode_scratch_ab.py MODEL.gguf 250,600,900 ROUNDS"""
import sys, time, dataclasses, numpy as np
from strata import models, policy
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding

from prefill import h2d_gbps, warm      # bench/prefill.py

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev = CudaDevice()
m = models.load(path); c = m.cfg
budget = budget_holding(m, 8200, int(0.25 * c.n_layer * c.n_expert))
arena = Arena(m, dev)
cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
eo = GpuEngine(m, dev, n_ctx=8200, vram_budget=budget, config=cfg, arena=arena)
eo.plan = dataclasses.replace(eo.plan, rows=None)
en = GpuEngine(m, dev, n_ctx=8200, vram_budget=budget, config=cfg, arena=arena)
bw, _ = h2d_gbps(dev, arena.blob(0, 0).nbytes)
rng = np.random.default_rng(0)
warm((eo, en), lengths, rng, c.n_vocab)
print(f"{path}: quarter cache {en.plan.cache_slots} slots (chunk {en.plan.chunk}); H2D {bw:.1f} GB/s; old = own scratch, new = decode's scratch and a wider ring; {rounds} rounds, arms alternating; medians", flush=True)
for L in lengths:
    t = {"old": [], "new": []}; mb = {"old": [], "new": []}; same = True; rf = {"old": [], "new": []}
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, L).tolist()
        outs = {}
        for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
            e = eo if md == "old" else en
            b0 = e.stats.streamed_bytes
            e.reset(); dev.synchronize()
            t0 = time.perf_counter(); outs[md] = e.prefill(p); t1 = time.perf_counter(); dev.synchronize()
            t[md].append((t1 - t0) * 1e3); rf[md].append((time.perf_counter() - t1) * 1e3)
            mb[md].append((e.stats.streamed_bytes - b0) / 1e6)
        same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
    rr = np.array(t["old"]) / np.array(t["new"])
    sh = {md: e.plan.for_prompt(e.config, e.share, L) for md, e in (("old", eo), ("new", en))}
    fo, fn = np.median(mb["old"]) / bw, np.median(mb["new"]) / bw
    print(f"  {L:5d}: old {np.median(t['old']):6.2f} ms ({np.median(mb['old']):4.0f} MB, x{np.median(t['old']) / fo:.2f} floor, ring {sh['old'][1]}, loan {sh['old'][2]}, group {sh['old'][3]}, refill {np.median(rf['old']):.1f})  "
          f"new {np.median(t['new']):6.2f} ms ({np.median(mb['new']):4.0f} MB, x{np.median(t['new']) / fn:.2f} floor, ring {sh['new'][1]}, loan {sh['new'][2]}, decode's scratch, refill {np.median(rf['new']):.1f})  "
          f"old/new x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}, median {np.median(rr):.3f}); logits identical: {same}", flush=True)
