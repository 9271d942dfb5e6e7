"""Diagnostic: the GPU timeline of prompts on the quarter cache (either walk), where the copy stream and the compute
stream wait. CUDA only; wraps the engine's Ring.copy_run, ExpertRunner.group and GpuEngine.moe with timing events.

python bench/prefill_timeline.py MODEL.gguf 250,900,8192 [n_ctx] [--walk=routed-only|stream-all] [--detail=LAYER]
    [--pre=MIN,WIDE] [--graph-rows=N]

--walk holds the walk of every chunk SPEC §3 sends down stream-all: routed-only (as policy.StreamWaste refusing) or
stream-all (as StreamWaste admitting); without it the engine chooses. --detail=LAYER prints that layer's copy runs and
launch groups of each prompt in the order the host issued them: host time, then the GPU's start and end (ms); a
pre-sync group, or their head or tail (ExpertRunner.pre_head, pre_tail), shows -1 members. --pre=MIN,WIDE sets
MoeBlock.pre_min_tokens and pre_wide_tokens (0,0: every layer takes pre-sync groups); --graph-rows=N
prompt_graph.GRAPH_ROWS (the chunks whose dense parts replay).

Per prompt: the copy stream's busy time and its idle time (the next copy issued by the host after the previous one
ended; issued early but waiting on a slot's `used` event; after the last copy), the compute stream's expert-group
time and the stalls between groups of one layer (waiting for a copy), GPU time outside the MoE blocks; then each
MoE block's span with its layer's copies."""
import sys, time, dataclasses, threading
import numpy as np
from strata import models, policy
from strata.accel import stream as st, moe as moe_mod
import strata.accel.prompt_graph as pgm
from strata.accel.arena import Arena
from strata.accel.device.cuda import CudaDevice
from strata.accel.engine import GpuEngine
from strata.accel.memplan import budget_holding

walk = next((x.split("=", 1)[1] for x in sys.argv if x.startswith("--walk=")), None)
detail = next((int(x.split("=", 1)[1]) for x in sys.argv if x.startswith("--detail=")), None)
pre = next((tuple(map(int, x.split("=", 1)[1].split(","))) for x in sys.argv if x.startswith("--pre=")), None)
rows = next((int(x.split("=", 1)[1]) for x in sys.argv if x.startswith("--graph-rows=")), None)
argv = [x for x in sys.argv if not x.startswith(("--walk=", "--detail=", "--pre=", "--graph-rows="))]
assert walk in (None, "routed-only", "stream-all"), f"--walk={walk}: routed-only or stream-all"
path, lengths = argv[1], [int(x) for x in argv[2].split(",")]
n_ctx = int(argv[3]) if len(argv) > 3 else 8200
m = models.load(path); c = m.cfg
dev = CudaDevice(); cp = dev.cp
arena = Arena(m, dev)
cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
REC = None
tl = threading.local()
def tev(stream):
    e = cp.cuda.Event(); e.record(stream.s); return e
oc, og, om, oi = st.Ring.copy_run, moe_mod.ExpertRunner.group, GpuEngine.moe, st.Walk._issue
state = {"layer": -1}
def issue(self, k0, k1):      # Walk._issue: one copy run of entries [k0, k1), all of one layer
    tl.layer = self.entries[k0][0]
    return oi(self, k0, k1)
def copy_run(self, s0, blobs, record=True):
    if REC is None:
        return oc(self, s0, blobs, record)
    h = time.perf_counter()
    for i in range(s0, s0 + blobs.shape[0]):
        u = self.used[i]
        if u is not None and u is not self._waited:
            self.dev.copy.wait(u); self._waited = u
    e0 = tev(self.dev.copy); ev = oc(self, s0, blobs, record); e1 = tev(self.dev.copy)
    REC.append(("copy", getattr(tl, "layer", state["layer"]), h, e0, e1, blobs.shape[0]))
    return ev
def group(self, layer, members, tab, lay, on_released=None):
    if REC is None:
        return og(self, layer, members, tab, lay, on_released)
    h = time.perf_counter(); e0 = tev(self.dev.compute)
    og(self, layer, members, tab, lay, on_released)
    e1 = tev(self.dev.compute)
    REC.append(("group", layer, h, e0, e1, len(members)))
def moe(self, h, layer, ids_dev, w_dev, out=None):
    if REC is None:
        return om(self, h, layer, ids_dev, w_dev, out)
    state["layer"] = layer
    t = time.perf_counter(); e0 = tev(self.dev.compute)
    out = om(self, h, layer, ids_dev, w_dev, out)
    e1 = tev(self.dev.compute)
    REC.append(("moe", layer, t, e0, e1, time.perf_counter()))
    return out
def group_pre(self, layer, g, read=None, rows=None):
    if REC is None:
        return ogp(self, layer, g, read, rows)
    h = time.perf_counter(); e0 = tev(self.dev.compute)
    ogp(self, layer, g, read, rows)
    e1 = tev(self.dev.compute)
    REC.append(("group", layer, h, e0, e1, -1))
def pre_run(self, layer, *a, **kw):      # the pre-sync head or tail (ExpertRunner.pre_head / pre_tail)
    if REC is None:
        return opr(self, layer, *a, **kw)
    h = time.perf_counter(); e0 = tev(self.dev.compute)
    opr(self, layer, *a, **kw)
    e1 = tev(self.dev.compute)
    REC.append(("group", layer, h, e0, e1, -1))
ogp, opr = moe_mod.ExpertRunner.group_pre, moe_mod.ExpertRunner._pre_run
st.Ring.copy_run, moe_mod.ExpertRunner.group, GpuEngine.moe, st.Walk._issue = copy_run, group, moe, issue
moe_mod.ExpertRunner.group_pre, moe_mod.ExpertRunner._pre_run = group_pre, pre_run
if rows is not None:
    pgm.GRAPH_ROWS = rows                  # read when the engine plans and builds its PromptGraphs
logs = []
eq = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=budget_holding(m, n_ctx, c.n_layer * c.n_expert // 4), config=cfg,
               arena=arena, log=logs.append)
if pre is not None:
    eq.pre_min_tokens, eq.pre_wide_tokens = pre
if walk is not None:
    eq.stream_waste.admit = (lambda: walk == "stream-all")
print(f"# pre_min_tokens {eq.pre_min_tokens}, pre_wide_tokens {eq.pre_wide_tokens}, graph rows {pgm.GRAPH_ROWS}")
print(f"# {path.split('/')[-1]} walk {walk or 'chosen by the engine'}; plan chunk {eq.plan.chunk} ring {eq.plan.ring} group {eq.plan.group} loan {eq.plan.loan_slots}")
rng = np.random.default_rng(0)
for L in lengths:
    ids = rng.integers(0, c.n_vocab, L).tolist()
    for _ in range(2):
        eq.reset(); eq.prefill(ids)
    walls = []
    for _ in range(3):
        eq.reset(); dev.synchronize(); t0 = time.perf_counter(); eq.prefill(ids); dev.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
    REC = []
    k0 = len(eq.stats.chunks)
    eq.reset(); dev.synchronize()
    base = tev(dev.compute); base.synchronize(); hb = time.perf_counter()
    eq.prefill(ids); dev.synchronize()
    end_h = (time.perf_counter() - hb) * 1e3
    rec, REC = REC, None
    g = lambda e: float(cp.cuda.get_elapsed_time(base, e))
    cs = sorted((g(a), g(b), (hh - hb) * 1e3, l, n) for k, l, hh, a, b, n in rec if k == "copy")
    gs = [(g(a), g(b), (hh - hb) * 1e3, l, n) for k, l, hh, a, b, n in rec if k == "group"]
    ms = [(g(a), g(b), l) for k, l, t, a, b, t1 in rec if k == "moe"]
    busy = sum(b - a for a, b, *_ in cs)
    ring_full = slot_wait = 0.0
    for j in range(1, len(cs)):
        gap = cs[j][0] - cs[j - 1][1]
        if gap > 0.003:
            if cs[j][2] > cs[j - 1][1] - 0.003: ring_full += gap
            else: slot_wait += gap
    gbusy = sum(b - a for a, b, *_ in gs)
    stall = 0.0; stall_by_layer = {}
    gs_sorted = sorted(gs)
    for j in range(1, len(gs_sorted)):
        if gs_sorted[j][3] == gs_sorted[j - 1][3]:
            gap = gs_sorted[j][0] - gs_sorted[j - 1][1]
            if gap > 0.003:
                stall += gap; stall_by_layer[gs_sorted[j][3]] = stall_by_layer.get(gs_sorted[j][3], 0) + gap
    moe_t = sum(b - a for a, b, _ in ms)
    end = max(b for a, b, _ in ms)
    print(f"## {L} tokens: walls {[round(w, 1) for w in walls]} ms; timed {end_h:.1f}; chunks {eq.stats.chunks[k0:]}")
    print(f"  copies {len(cs)}: busy {busy:.1f} ms, first start {cs[0][0]:.1f}, last end {cs[-1][1]:.1f}, GPU end {end:.1f};"
          f" idle ring-full/host-late {ring_full:.1f}, slot-wait {slot_wait:.1f}, after last copy {end - cs[-1][1]:.1f}")
    print(f"  compute: MoE blocks {moe_t:.1f} ms, expert groups {gbusy:.1f} ms, stalls between groups of a layer {stall:.1f} ms, outside MoE {end - moe_t:.1f} ms")
    # per-layer summary: when the layer's copies ran vs when its groups ran
    lay = sorted(set(l for *_, l, n in cs) | set(l for a, b, l in ms))
    rows = []
    for li, (a, b, l) in enumerate(ms):
        lc = [x for x in cs if x[3] == l]
        rows.append(f"L{l}@{a:.1f}-{b:.1f}: copies {lc[0][0]:.1f}-{lc[-1][1]:.1f} busy {sum(y - x for x, y, *_ in lc):.1f}" if lc else f"L{l}@{a:.1f}-{b:.1f}: no copies")
    print("  " + "; ".join(rows[:24]))
    if detail is not None:   # one layer's chronology: when the host issued each copy run and group, when the GPU ran it
        a, b, l = next(x for x in ms if x[2] == detail)
        t_in = next((t - hb) * 1e3 for k, ll, t, *_ in rec if k == "moe" and ll == detail)
        t_out = next((t1 - hb) * 1e3 for k, ll, t, e0, e1, t1 in rec if k == "moe" and ll == detail)
        print(f"  L{detail} detail: MoE on the GPU {a:.2f}-{b:.2f}, on the host {t_in:.2f}-{t_out:.2f} (ms)")
        evs = [("copy", h, x, y, n) for x, y, h, ll, n in cs if ll == detail and a - 1 <= x <= b]
        evs += [("group", h, x, y, n) for x, y, h, ll, n in gs if ll == detail and a - 1 <= x <= b]
        for kind, h, x, y, n in sorted(evs, key=lambda e: e[1]):
            print(f"    {kind:5s} {n:3d}  host {h:7.2f}  gpu {x:7.2f}-{y:7.2f}")
