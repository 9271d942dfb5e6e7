"""Diagnostic: where the host's window after a prompt layer's routing sync goes, CUDA only. MoeBlock._block's source
is executed again with a clock reading after the steps below (the same code otherwise), on MODEL's quarter-cache
engine, share off. Per layer, medians over ROUNDS prompts of TOKENS random tokens, host us per segment: the routing's
counts, the placement, the guessed walk's extension and the row layout, the resident and streamed groups, the
plan's lists, the tables and the gather, the stats; `end`: the groups, combine and next guess (the GPU computes
meanwhile); `window`: the sum before `end` (the GPU idle).

python bench/prompt_window.py MODEL.gguf TOKENS ROUNDS"""
import sys, time, inspect, textwrap, re, numpy as np
from strata.accel import moe_block as MB

from prefill import quarter_engines            # bench/prefill.py

src = textwrap.dedent(inspect.getsource(MB.MoeBlock._block))
marks = [  # (regex of a line, label): a checkpoint after the statement that starts on that line
    (r"t_synced = time.perf_counter\(\)", "sync"),
    (r"cnt = np.bincount", "counts"),
    (r"parts = placement\(", "placement"),
    (r"lay = row_layout\(", "walk+layout"),
    (r"res_groups = self._runner.resident_groups", "res_groups"),
    (r"cache = self.cache$", "sgroups"),
    (r"plan \+= ", "plan"),
    (r"k.gather_f16\(", "tables+gather"),
    (r"ri = 0$", "stats"),
]
lines = src.split("\n")
out = []
for ln in lines:
    out.append(ln)
    for pat, lab in marks:
        if re.search(pat, ln):
            ind = len(ln) - len(ln.lstrip())
            out.append(" " * ind + f"_CK.append(({lab!r}, time.perf_counter()))")
src2 = "\n".join(out)
assert src2.count("\n    return out") == 1
src2 = src2.replace("\n    return out", "\n    _CK.append(('end', time.perf_counter()))\n    return out")
CK = []
ns = dict(vars(MB))
ns["_CK"] = CK
exec(src2, ns)
MB.MoeBlock._block = ns["_block"]

path, L, R = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dev, m, arena, (e,) = quarter_engines(path, 1)            # bench/prefill.py's quarter-cache engine, share off
c = m.cfg
rng = np.random.default_rng(0)
for _ in range(3):
    e.reset(); e.prefill(rng.integers(0, c.n_vocab, L).tolist())
per = {}
walls = []
for r in range(R):
    e.reset(); dev.synchronize(); CK.clear(); t0 = time.perf_counter()
    e.prefill(rng.integers(0, c.n_vocab, L).tolist()); walls.append((time.perf_counter() - t0) * 1e3)
    dev.synchronize()
    blocks, cur = [], []
    for lab, t in CK:
        cur.append((lab, t))
        if lab == "end":
            blocks.append(cur); cur = []
    for l, b in enumerate(blocks):
        for (la, ta), (lb, tb) in zip(b, b[1:]):
            per.setdefault((l, lb), []).append((tb - ta) * 1e6)
labels = [lab for _, lab in marks[1:]] + ["end"]
print(f"{path} {L} tokens: wall {np.median(walls):.2f} ms; host us from the routing sync's return, per segment "
      f"(medians of {R}); 'end' = the groups, combine and next guess")
print(" layer " + " ".join(f"{x:>13}" for x in labels) + "   window")
for l in range(c.n_layer):
    vals = [np.median(per.get((l, x), [0])) for x in labels]
    print(f" {l:5d} " + " ".join(f"{v:13.0f}" for v in vals) + f" {sum(vals[:-1]):8.0f}")
