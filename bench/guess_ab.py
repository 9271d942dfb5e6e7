"""In one process: guessed walks (policy.guess) against the routed-only walks without them, on two quarter-cache
engines that share one arena, the CPU share off. old = STRATA_PROMPT_GUESS=0's path (a layer's copies after its
routing sync); new = each layer's likely experts, from the engine's own earlier prompts, streamed before the sync.
Same random prompts on both, order alternating; logits compared bit for bit. CUDA only.

python bench/guess_ab.py MODEL.gguf 250,900,8192 ROUNDS [SHARE]

SHARE: the prefill CPU share of both engines (auto, or a fraction; 0, the default, turns it off), each with its own
CpuBlock over one pool of the host's cores less one. With the share on, an expert the CPU computes has the q8 path's
bits, and the two engines' CPUs may take different experts: the logits are compared by KL and top-1 then.

Per length: medians of each engine's prompt time and streamed MB, each one's ratio to its PCIe floor (MB ÷ pinned H2D
GB/s measured here), old/new with its per-round spread, and the new engine's guesses a prompt (of which unrouted)."""
import sys, time, dataclasses, numpy as np
from strata import models, policy
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding
from strata.reference.agree import kl

from prefill import h2d_gbps, warm      # warm-up copy, best of three bursts (bench/prefill.py)

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
share = sys.argv[4] if len(sys.argv) > 4 else "0"
share = "auto" if share == "auto" else float(share)
dev = CudaDevice()
m = models.load(path); c = m.cfg
n_ctx = 8200
budget = budget_holding(m, n_ctx, int(0.25 * c.n_layer * c.n_expert))
arena = Arena(m, dev)
cfg = dataclasses.replace(policy.from_process(), cpu_share=share)
pool = None
if share != 0.0:
    from strata.accel.cpu.pool import ExpertPool, default_workers
    pool = ExpertPool(workers=max(1, default_workers() - 1))
eo = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=dataclasses.replace(cfg, prompt_guess=False), arena=arena,
               pool=pool)
en = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, arena=arena, pool=pool)
assert not eo.guess and en.guess
bw, _ = h2d_gbps(dev, arena.blob(0, 0).nbytes)
rng = np.random.default_rng(0)
warm((eo, en), lengths, rng, c.n_vocab)
print(f"{path}: quarter cache, chunk {en.plan.chunk}, ring {en.plan.ring}; H2D {bw:.1f} GB/s; old = copies after each routing sync, new = guessed walks; {rounds} rounds, order alternating; medians; ratio = old/new", flush=True)
same, kls, top1 = True, [], []
def cpu_taken(e): return e.cpu_block.stats["cpu_experts"] if e.cpu_block is not None else 0
for L in lengths:
    t = {"old": [], "new": []}; mb = {"old": [], "new": []}; g = []; cpu = {"old": [], "new": []}
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, L).tolist()
        outs = {}
        for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
            e = eo if md == "old" else en
            b0, g0, u0, c0 = e.stats.streamed_bytes, e.stats.guessed, e.stats.guessed_unrouted, cpu_taken(e)
            e.reset(); dev.synchronize()
            t0 = time.perf_counter(); outs[md] = e.prefill(p); dev.synchronize()
            t[md].append((time.perf_counter() - t0) * 1e3); mb[md].append((e.stats.streamed_bytes - b0) / 1e6)
            if md == "new": g.append((e.stats.guessed - g0, e.stats.guessed_unrouted - u0))
            cpu[md].append(cpu_taken(e) - c0)
        same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
        kls.append(float(kl(outs["old"].astype(np.float64), outs["new"].astype(np.float64))))
        top1.append(int(np.argmax(outs["old"])) == int(np.argmax(outs["new"])))
    rr = np.array(t["old"]) / np.array(t["new"])
    fo, fn = np.median(mb["old"]) / bw, np.median(mb["new"]) / bw
    print(f"  {L:5d}: old {np.median(t['old']):6.1f} ms ({np.median(mb['old']):5.0f} MB, x{np.median(t['old']) / fo:.2f} floor {fo:.1f})"
          f"  new {np.median(t['new']):6.1f} ms ({np.median(mb['new']):5.0f} MB, x{np.median(t['new']) / fn:.2f} floor {fn:.1f})"
          f"  old/new x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}); guessed {np.median([a for a, _ in g]):.0f}, unrouted {np.median([b for _, b in g]):.0f}"
          + (f"; CPU experts old {np.median(cpu['old']):.0f}, new {np.median(cpu['new']):.0f}" if pool else ""),
          flush=True)
print(f"logits identical old vs new: {same} (last token's KL max {max(kls):.2e}, top-1 the same in {sum(top1)} of "
      f"{len(top1)}); walks of the new engine's last prompt: {[w for _, w, _ in en.stats.chunks[-8:]]}")
