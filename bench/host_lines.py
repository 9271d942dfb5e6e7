"""Diagnostic, CUDA only: the host's time statement by statement on a prompt's path (line_clock.py: a clock reading
after every statement of the functions below), on bench/prefill.py's quarter-cache engine, share off, medians of
ROUNDS random prompts of TOKENS tokens after three warm-up ones. Four views:

- window: each statement's us inside a layer's window after its routing sync (from the sync's return to the gather's
  launch: the GPU idle), summed over its calls there, the median per layer averaged over layers 0-2 and over the rest
  (qwen3's synthesised model routes nearly every expert in its first layers, few in the others);
- presync: the same, inside a layer's block from its entry to its routing sync (the counts' download, the pre-sync
  groups' plan, rows, gather and launches where presync.takes_pre says: the GPU waits for them once it has run the
  layer's dense part);
- post: the same, from the layout's end (the gather's launch) to the combine's launch: the streamed groups, the
  walk's copies, the next layer's guess;
- start: the host's timeline from GpuEngine._prefill's entry to layer 0's routing sync (the GPU idle until its first
  launches), each reading's ms from the entry and us since the one before (those of 8 us or more).

python bench/host_lines.py MODEL.gguf TOKENS ROUNDS window|presync|post|start"""
import collections
import sys
import time

import numpy as np

import line_clock as LC
from strata.accel import buffers as BU, cache as CA, dense as DE, engine as EN, memplan as MP, moe as MO
from strata.accel import moe_block as MB, prompt_graph as PG, stream as ST
from strata.accel.gpu import cuda_kernels as CK
from strata.models import common as CM

path, L, R, view = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
assert view in ("window", "presync", "post", "start"), "window, presync, post or start"
if view == "presync":
    from strata.accel.gpu import cuda_presync as CP
    LC.instrument_methods([(MB.MoeBlock, "_block", "block"), (MB.MoeBlock, "_issue_pre", "_issue_pre"),
                           (CP.CudaPresyncKernels, "plan_groups", "plan_groups"),
                           (CP.CudaPresyncKernels, "plan_write", "plan_write"),
                           (MO.ExpertRunner, "pre_head", "pre_head"), (MO.ExpertRunner, "_pre_run", "_pre_run"),
                           (MO.ExpertRunner, "group_pre", "group_pre"), (CK.CudaKernels, "_send", "_send"),
                           (CK.CudaKernels, "_room", "_room"), (CK.CudaKernels, "route_hist", "route_hist"),
                           (CK.CudaKernels, "route_rows", "route_rows"), (ST.Walk, "acquire", "acquire")])
    _inner = MB.MoeBlock._block

    def _entry(self, *a, **kw):
        LC.CKS.append(("ENTRY", 0, LC.pc()))
        return _inner(self, *a, **kw)
    MB.MoeBlock._block = _entry
elif view == "window":
    LC.instrument_module_funcs([(MO, "placement", "placement"), (MO, "row_layout", "row_layout"),
                                (MO, "row_order", "row_order")])
    LC.instrument_methods([(MB.MoeBlock, "_block", "block"), (MO.ExpertRunner, "tables", "tables"),
                           (MO.ExpertRunner, "resident_groups", "res_groups"),
                           (CK.CudaKernels, "layer_tables", "layer_tables"), (CK._Staging, "reserve", "reserve"),
                           (CK.CudaKernels, "_send", "_send"), (CK.CudaKernels, "_room", "_room"),
                           (ST.Walk, "extend", "extend"), (ST.Walk, "prefetch", "prefetch")])
elif view == "post":
    LC.instrument_methods([(MB.MoeBlock, "_block", "block"), (MB.MoeBlock, "_guess", "_guess"),
                           (MO.ExpertRunner, "group", "group"), (ST.Walk, "prefetch", "prefetch"),
                           (ST.Walk, "_issue", "_issue"), (ST.Ring, "copy_run", "copy_run"),
                           (ST.Walk, "consume", "consume"), (ST.Walk, "acquire", "acquire"),
                           (ST.Walk, "ensure_issued", "ensure_issued")])
else:
    LC.instrument_module_funcs([(BU, "carve_prompt", "carve_prompt"), (BU, "carve", "carve"),
                                (CM, "attention", "attention")])
    LC.instrument_methods([(EN.GpuEngine, "_prefill", "_prefill"), (EN.GpuEngine, "_prompt_chunk", "_prompt_chunk"),
                           (EN.GpuEngine, "_step", "_step"), (EN.GpuEngine, "_lend", "_lend"),
                           (CA.ExpertCache, "lend", "lend"), (MB.MoeBlock, "_block", "block"),
                           (MB.MoeBlock, "_guess", "_guess"), (MP.MemoryPlan, "for_prompt", "for_prompt"),
                           (PG.PromptGraphs, "chunk", "pg.chunk"), (DE.DeviceOps, "embed", "embed"),
                           (ST.Walk, "prefetch", "prefetch")])

from prefill import quarter_engines                      # noqa: E402  (bench/prefill.py; after the instrumenting)

dev, m, arena, (e,) = quarter_engines(path, 1)
c = m.cfg
rng = np.random.default_rng(0)
for _ in range(3):
    e.reset()
    e.prefill(rng.integers(0, c.n_vocab, L).tolist())
blk = LC.SRCS["block"]
at = lambda text: next(i + 1 for i, ln in enumerate(blk) if text in ln)
runs, walls = [], []
for r in range(R):
    e.reset()
    dev.synchronize()
    LC.reset()
    t0 = time.perf_counter()
    e.prefill(rng.integers(0, c.n_vocab, L).tolist())
    walls.append((time.perf_counter() - t0) * 1e3)
    dev.synchronize()
    runs.append((t0, list(LC.CKS)))
print(f"{path} {L} tokens: prompt {np.median(walls):.2f} ms instrumented (medians of {R}); a reading costs "
      f"{LC.PC_COST:.3f} us")


def windows(opens, closes, title: str, top: int) -> None:
    """Each statement's us inside a layer's windows (from a reading opens(label, line) to the reading (block,
    closes)), the median per layer over the runs, averaged over layers 0-2 and over the rest."""
    acc = collections.defaultdict(list)                  # (layer, (label, line)) -> us per window, one per run
    for _, cks in runs:
        layer, per, prev = -1, None, 0.0
        for lab, ln, t in cks:
            if opens(lab, ln):
                layer, per, prev = layer + 1, collections.Counter(), t
                continue
            if per is not None:
                per[(lab, ln)] += (t - prev) * 1e6 - LC.PC_COST
                prev = t
                if lab == "block" and ln == closes:
                    for k, v in per.items():
                        acc[(layer, k)].append(v)
                    acc[(layer, ("WINDOW", 0))].append(sum(per.values()))
                    per = None
    for layers, tag in ((range(0, 3), "layers 0-2"), (range(3, c.n_layer), f"layers 3-{c.n_layer - 1}")):
        keys = {k for (l, k) in acc if l in layers}
        rows = sorted(((np.mean([np.median(acc[(l, k)]) for l in layers if (l, k) in acc]), k) for k in keys),
                      reverse=True)
        print(f"== {tag}: {title}, the median per layer, averaged over the layers")
        for v, (lab, ln) in rows[:top]:
            if v >= 1.5 or lab == "WINDOW":
                print(f"  {v:8.1f}  {lab:>12}:{ln:<4} {LC.line(lab, ln)}")


if view == "window":
    synced = at("t_synced = time.perf_counter()")
    windows(lambda lab, ln: lab == "block" and ln == synced, at("k.gather_f16("), "us a window", 40)
elif view == "post":
    windows(lambda lab, ln: lab == "block" and ln == at("self.stats.layouts += 1"), at("k.combine(out, bufs.dm"),
            "us from the layout's end (the gather's launch) to the combine's launch", 45)
elif view == "presync":
    windows(lambda lab, ln: lab == "ENTRY", at("t_sync = time.perf_counter()"),
            "us from the block's entry to its routing sync", 45)
else:
    start = at("t_sync = time.perf_counter()")
    seqs = []
    for t0, cks in runs:
        seq = []
        for lab, ln, t in cks:
            seq.append((lab, ln, (t - t0) * 1e3))
            if lab == "block" and ln == start:
                break
        seqs.append(seq)
    n = min(len(s) for s in seqs)
    print("from _prefill's entry to layer 0's routing sync: ms from the entry, us since the reading before")
    prev = 0.0
    for i in range(n):
        lab, ln, _ = seqs[0][i]
        t = float(np.median([s[i][2] for s in seqs]))
        d, prev = (t - prev) * 1e3, t
        if d >= 8 or i == n - 1:
            print(f"  {t:7.3f} ms  +{d:7.1f} us  {lab:>14}:{ln:<4} {LC.line(lab, ln)}")
