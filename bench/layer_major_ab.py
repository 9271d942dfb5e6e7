"""In one process: prompts of several chunks run layer by layer (policy.layer_major) against chunk by chunk, on two
quarter-cache engines that share one arena, the CPU share off. old = STRATA_PROMPT_LAYER_MAJOR=0's path (each chunk
through every layer, its routed-only walk streaming what it routes); new = every chunk through a layer before the
next, each layer's experts admitted into the cache once. Same random prompts on both, order alternating; logits
compared bit for bit (where both run the same chunks; where the layer-major plan cuts other chunks, the GPU's
arithmetic differs with the chunking, so they are compared by the last token's KL and top-1). CUDA only.

python bench/layer_major_ab.py MODEL.gguf 2048,8192 ROUNDS

Per length: medians of each engine's prompt time and streamed MB, each one's ratio to its PCIe floor (MB ÷ pinned
H2D GB/s measured here), old/new with its per-round spread, and the time after each prompt until its refill has
landed (the lent slots', and the new engine's decode residents given back)."""
import sys, time, dataclasses, numpy as np
from strata import models, policy
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding
from strata.reference.agree import kl

from prefill import h2d_gbps, warm      # warm-up copy, best of three bursts (bench/prefill.py)

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev = CudaDevice()
m = models.load(path); c = m.cfg
n_ctx = 8200
budget = budget_holding(m, n_ctx, int(0.25 * c.n_layer * c.n_expert), graphs=False)   # the quarter cache of
# bench/prefill.py (whose engines take graphs): the same slots, with the memory pool's step temporaries
arena = Arena(m, dev)
# prompt graphs off on both: they pad a chunk of up to 640 rows to 64 (another GEMM shape, other bits), which the
# layer-major loop does not; at these chunks (768-1,280 rows, and 8K's last 512) they gave 1.00-1.01x (stop 34)
cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0, prompt_graph=False)
eo = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=dataclasses.replace(cfg, prompt_layer_major=False),
               arena=arena)
en = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, arena=arena)
bw, _ = h2d_gbps(dev, arena.blob(0, 0).nbytes)
rng = np.random.default_rng(0)
warm((eo, en), lengths, rng, c.n_vocab)
print(f"{path}: quarter cache {en.plan.cache_slots} slots, chunk {en.plan.chunk}, loan {en.plan.loan_slots}; H2D "
      f"{bw:.1f} GB/s; old = chunk by chunk, new = layer by layer; {rounds} rounds, order alternating; medians; "
      f"ratio = old/new", flush=True)
for L in lengths:
    same, kls, top1 = True, [], 0
    t = {"old": [], "new": []}; mb = {"old": [], "new": []}; rf = {"old": [], "new": []}; walks = {}
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, L).tolist()
        outs = {}
        for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
            e = eo if md == "old" else en
            b0, n0 = e.stats.streamed_bytes, len(e.stats.chunks)
            e.reset(); dev.synchronize()
            t0 = time.perf_counter(); outs[md] = e.prefill(p); t1 = time.perf_counter(); dev.synchronize()
            t[md].append((t1 - t0) * 1e3); rf[md].append((time.perf_counter() - t1) * 1e3)
            mb[md].append((e.stats.streamed_bytes - b0) / 1e6)
            walks[md] = e.stats.chunks[n0:]
        same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
        kls.append(float(kl(outs["old"].astype(np.float64), outs["new"].astype(np.float64))))
        top1 += int(np.argmax(outs["old"])) == int(np.argmax(outs["new"]))
    rr = np.array(t["old"]) / np.array(t["new"])
    fo, fn = np.median(mb["old"]) / bw, np.median(mb["new"]) / bw
    print(f"  {L:5d}: old {np.median(t['old']):6.1f} ms ({np.median(mb['old']):5.0f} MB, x{np.median(t['old']) / fo:.2f} "
          f"floor {fo:.1f}, refill {np.median(rf['old']):.1f})  new {np.median(t['new']):6.1f} ms "
          f"({np.median(mb['new']):5.0f} MB, x{np.median(t['new']) / fn:.2f} floor {fn:.1f}, refill "
          f"{np.median(rf['new']):.1f})  old/new x{np.median(t['old']) / np.median(t['new']):.3f} (per-round "
          f"{rr.min():.3f}-{rr.max():.3f}); chunks old {[(n, w) for n, w, _ in walks['old']]}, new "
          f"{[(n, w) for n, w, _ in walks['new']]}; logits identical: {same} (KL max {max(kls):.2e}, top-1 the "
          f"same in {top1} of {rounds})", flush=True)
