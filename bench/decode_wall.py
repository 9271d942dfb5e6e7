"""Diagnostic: a graph decode token's wall against its graph replayed alone on the GPU, and the host's pieces of
GpuEngine._graph_step (launch = DecodeGraph.launch, tier = the tier's round, wait = DecodeGraph.wait, after = the
stats and the tier's notes, as _graph_step does them), quarter cache and all resident, share off. CUDA only.

python bench/decode_wall.py MODEL.gguf

(bench/results/h200/dwall_q8_stop36.log, run as .scratch/dwall.py: this file.)"""
import sys, time, dataclasses, numpy as np
from strata import models, policy
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding
path = sys.argv[1]
m = models.load(path); c = m.cfg
dev = CudaDevice(); cp = dev.cp
arena = Arena(m, dev)
cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
rng = np.random.default_rng(0)
n_ctx = 512
for label, budget in (("quarter", budget_holding(m, n_ctx, c.n_layer * c.n_expert // 4)), ("resident", None)):
    e = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, arena=arena)
    e.prefill(rng.integers(0, c.n_vocab, 64).tolist())
    toks = rng.integers(0, c.n_vocab, 200).tolist()
    for t in toks[:8]: e.decode([t])
    dev.synchronize()
    N = 64
    t0 = time.perf_counter()
    for t in toks[8:8 + N]: e.decode([t])
    dev.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / N
    g = e.dgraph
    # GPU time of the graph alone: N replays back to back
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(dev.compute.s)
    for _ in range(N): g.graph.launch()
    e1.record(dev.compute.s); e1.synchronize()
    gpu = cp.cuda.get_elapsed_time(e0, e1) / N
    # host pieces
    pieces = {"launch": [], "tier": [], "wait": [], "after": []}
    for t in toks[80:80 + N]:
        a = time.perf_counter(); g.launch(int(t), e.pos); b = time.perf_counter()
        e._tier_round(); c1 = time.perf_counter()
        logits, ids = g.wait(); d = time.perf_counter()
        ids2 = ids[:, 0, :]
        res = g.resident
        e.stats.hits += int(np.take_along_axis(res, ids2.astype(np.int64), 1).sum())
        for layer in range(c.n_layer): e.tier.note(layer, ids2[layer].tolist())
        e.pos += 1
        f = time.perf_counter()
        for k, v in (("launch", b - a), ("tier", c1 - b), ("wait", d - c1), ("after", f - d)): pieces[k].append(v * 1e3)
    print(f"{label}: decode wall {wall:.3f} ms/token ({1e3 / wall:.0f} tok/s); graph alone on the GPU {gpu:.3f} ms; host pieces (median ms): "
          + ", ".join(f"{k} {np.median(v):.3f}" for k, v in pieces.items()), flush=True)
