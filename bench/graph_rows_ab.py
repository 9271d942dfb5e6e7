"""In one process, two engines on one arena with bench/prefill.py's quarter cache: the dense parts of chunks up to
prompt_graph.GRAPH_ROWS (640) as captured segments, against up to ROWS (a 900-token prompt's chunk then replays
960-row segments where it ran op by op). Each engine's budget holds the same cache beside its own regions
(memplan.budget_holding). Arms alternating; the padded rows are another GEMM shape, so the logits are compared by
their largest difference and top token, not bit for bit. CUDA only.

python bench/graph_rows_ab.py MODEL.gguf 600,900 ROUNDS ROWS [KNOBS]
    KNOBS: name=value[,name=value] integer MoeBlock attributes set on the new engine alone (pre_min_tokens=0: its
    short chunks take the pre-sync groups too, strata/accel/presync.py)"""
import dataclasses
import sys

import numpy as np

from prefill import quarter_engines, timed_prompt, warm      # bench/prefill.py
import strata.accel.prompt_graph as pgm
from strata import policy
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding

path, lengths, rounds, rows = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), int(sys.argv[4])
n_ctx = 8200
dev, m, arena, (old,) = quarter_engines(path, 1, n_ctx)
c = m.cfg
keep = pgm.GRAPH_ROWS
pgm.GRAPH_ROWS = rows                      # read when the engine plans and builds its PromptGraphs
try:
    new = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget_holding(m, n_ctx, int(0.25 * c.n_layer * c.n_expert)),
                    config=dataclasses.replace(policy.from_process(), cpu_share=0.0), arena=arena)
finally:
    pgm.GRAPH_ROWS = keep
spec = sys.argv[5] if len(sys.argv) > 5 else ""
for kv in filter(None, spec.split(",")):
    name, value = kv.split("=", 1)
    assert hasattr(new, name), f"{name}: not an engine attribute"
    setattr(new, name, int(value))
assert new.plan.cache_slots == old.plan.cache_slots and new.plan.chunk == old.plan.chunk, (new.plan, old.plan)
rng = np.random.default_rng(0)
warm((old, new), lengths, rng, c.n_vocab, rounds=3)       # eager, capture, replay
print(f"{path}: quarter cache {old.plan.cache_slots} slots (chunk {old.plan.chunk}); old = segments up to {keep} "
      f"rows, new = up to {new.pgraphs.cap} {spec}; {rounds} rounds, arms alternating; medians", flush=True)
for L in lengths:
    t = {"old": [], "new": []}
    diff, top = 0.0, True
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, L).tolist()
        outs = {}
        for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
            ms, outs[md], after, _ = timed_prompt(dev, old if md == "old" else new, p)
            t[md].append(ms + after)
        diff = max(diff, float(np.abs(outs["old"] - outs["new"]).max()))
        top &= int(outs["old"][-1].argmax()) == int(outs["new"][-1].argmax())
    rr = np.array(t["old"]) / np.array(t["new"])
    print(f"  {L:5d}: old {np.median(t['old']):7.2f} ms  new {np.median(t['new']):7.2f} ms  old/new "
          f"x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}, median "
          f"{np.median(rr):.3f}); replays new {new.pgraphs.replays}; logits max diff {diff:.2e}, same top token {top}",
          flush=True)
