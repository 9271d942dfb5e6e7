"""In one process: a routed-only prompt borrowing decode's weight scratch and giving its room to the ring
(memplan.for_prompt since stop 38: group DECODE_SCRATCH, a ring of up to ROUTED_ONLY_SLOTS within the loan it would
have taken) against carving a scratch of its own beside a ring of at most the plan's (the same plan with
rows=None: the code before). Two quarter-cache engines on one arena, the CPU share off, arms alternating; logits
compared bit for bit (the launch groups differ, the sums do not); MB streamed, the ratio to each arm's PCIe floor,
the ring, the loan and the refill after the prompt reported. CUDA only.

python bench/decode_scratch_ab.py MODEL.gguf 250,600,900 ROUNDS"""
import sys, dataclasses, numpy as np

from prefill import h2d_gbps, quarter_engines, timed_prompt, warm      # bench/prefill.py

path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev, m, arena, (eo, en) = quarter_engines(path, 2)
c = m.cfg
eo.plan = dataclasses.replace(eo.plan, rows=None)
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
            ms, outs[md], after, got = timed_prompt(dev, eo if md == "old" else en, p)
            t[md].append(ms); rf[md].append(after); mb[md].append(got)
        same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
    rr = np.array(t["old"]) / np.array(t["new"])
    sh = {md: e.plan.for_prompt(e.config, e.share, L) for md, e in (("old", eo), ("new", en))}
    fo, fn = np.median(mb["old"]) / bw, np.median(mb["new"]) / bw
    print(f"  {L:5d}: old {np.median(t['old']):6.2f} ms ({np.median(mb['old']):4.0f} MB, x{np.median(t['old']) / fo:.2f} floor, ring {sh['old'][1]}, loan {sh['old'][2]}, group {sh['old'][3]}, refill {np.median(rf['old']):.1f})  "
          f"new {np.median(t['new']):6.2f} ms ({np.median(mb['new']):4.0f} MB, x{np.median(t['new']) / fn:.2f} floor, ring {sh['new'][1]}, loan {sh['new'][2]}, decode's scratch, refill {np.median(rf['new']):.1f})  "
          f"old/new x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}, median {np.median(rr):.3f}); logits identical: {same}", flush=True)
