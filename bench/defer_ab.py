"""In one process, one engine: a layer-major prompt's MoE blocks deferred behind the next chunk's dense part
(accel/deferred.py, the default) against each block issued in place (the engine's defer_blocks off); or, with
`side`, the deferred blocks on the device's side stream (moe_block._beside) against on the compute stream; or, with
`rows`, the prompt attention's blocks chosen by cuda_attn.attn_block_rows (128 rows late in a long prompt) against
64-row blocks everywhere (what it chose for the quarter cache's chunks before stop 39); or, with `pendingN`, at most N
side-stream blocks the compute stream has not waited for (the engine's side_pending) against no bound (before stop
42). Arms alternating, the
quarter cache of bench/prefill.py, the CPU share off; logits compared bit for bit; the host's time blocked in
routing syncs per arm. CUDA only.

python bench/defer_ab.py MODEL.gguf 2048,8192 ROUNDS [defer|side|rows|pendingN]"""
import sys, numpy as np

from prefill import quarter_engines, timed_prompt, warm      # bench/prefill.py

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
what = sys.argv[4] if len(sys.argv) > 4 else "defer"
dev, m, arena, (e,) = quarter_engines(path, 1)
c = m.cfg
rng = np.random.default_rng(0)


def arm(new: bool):
    if what == "defer":
        e.defer_blocks = new
    elif what == "side":
        e.side_blocks = new
    elif what.startswith("pending"):
        e.side_pending = int(what[7:]) if new else 1 << 30
    else:
        dev.k.attn_rows = None if new else 64


for on in (False, True):
    arm(on)
    warm((e,), lengths, rng, c.n_vocab)
names = {"defer": "old = blocks in place, new = deferred", "side": "old = deferred blocks on the compute stream, new = on the side stream", "rows": "old = 64-row attention blocks, new = attn_block_rows"}
names.setdefault(what, f"old = side-stream blocks unbounded, new = at most {what[7:]} in flight")
print(f"{path}: quarter cache {e.plan.cache_slots} slots (chunk {e.plan.chunk}); {names[what]}; {rounds} rounds, arms alternating; medians", flush=True)
for L in lengths:
    t = {"old": [], "new": []}; w = {"old": [], "new": []}; same = True
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, L).tolist()
        outs = {}
        for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
            arm(md == "new")
            w0 = e.stats.sync_wait_s
            ms, outs[md], after, _ = timed_prompt(dev, e, p)
            t[md].append(ms + after); w[md].append((e.stats.sync_wait_s - w0) * 1e3)
        same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
    rr = np.array(t["old"]) / np.array(t["new"])
    walk = e.stats.chunks[-1][1]
    print(f"  {L:5d} ({walk}): old {np.median(t['old']):7.2f} ms (blocked in syncs {np.median(w['old']):5.1f})  new {np.median(t['new']):7.2f} ms (blocked {np.median(w['new']):5.1f})  old/new x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}, median {np.median(rr):.3f}); logits identical: {same}", flush=True)
