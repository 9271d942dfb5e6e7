"""In one process: a prompt of one chunk run as it is (its routed-only walk, the engine's default) against the same
prompt cut into k equal chunks run layer by layer (policy.layer_major, which the engine takes only past one chunk):
layer by layer, chunk j's MoE block waits for chunk j+1's dense part and runs on the side stream (deferred.py), so
the GPU computes while the host lays chunk j out after its routing sync. Engines on one arena with bench/prefill.py's
quarter cache, the CPU share off; arms in rotating order; the chunking changes the GPU's GEMM shapes, so logits are
compared by the last token's KL and top-1, not bit for bit. CUDA only.

python bench/split_ab.py MODEL.gguf 250,600,900 2,3 ROUNDS

Per length and arm: medians of the prompt time and MB streamed, the ratio to its PCIe floor (MB / pinned H2D GB/s
measured here), the time until its refill has landed, and one/arm with its per-round spread."""
import sys, numpy as np
from strata.accel.layer_major import chunking
from strata.reference.agree import kl

from prefill import h2d_gbps, quarter_engines, timed_prompt, warm      # bench/prefill.py

path, lengths, splits, rounds = (sys.argv[1], [int(x) for x in sys.argv[2].split(",")],
                                 [int(x) for x in sys.argv[3].split(",")], int(sys.argv[4]))
dev, m, arena, engines = quarter_engines(path, 1 + len(splits))
c = m.cfg
arms = {"one": engines[0]}


def forced(e, k: int):
    """e's layer-major choice for any prompt of at least 2k tokens: k equal chunks (layer_major.chunking, the loan
    as choose prices it)."""
    def choose(n: int):
        got = chunking(e, n, -(-n // k)) if n >= 2 * k else None
        return None if got is None else (*got, False)
    return choose


for k, e in zip(splits, engines[1:]):
    e._layer_major = forced(e, k)
    arms[f"split{k}"] = e
bw, _ = h2d_gbps(dev, arena.blob(0, 0).nbytes)
rng = np.random.default_rng(0)
warm(list(arms.values()), lengths, rng, c.n_vocab)
names = list(arms)
print(f"{path}: quarter cache {engines[0].plan.cache_slots} slots, chunk {engines[0].plan.chunk}; H2D {bw:.1f} GB/s; "
      f"one = the prompt as one chunk, splitK = K chunks layer by layer; {rounds} rounds, arms rotating; medians",
      flush=True)
for L in lengths:
    t = {a: [] for a in names}; mb = {a: [] for a in names}; rf = {a: [] for a in names}
    kls = {a: [] for a in names[1:]}; top1 = {a: 0 for a in names[1:]}; walks = {}
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, L).tolist()
        outs = {}
        for a in names[r % len(names):] + names[:r % len(names)]:
            e = arms[a]
            n0 = len(e.stats.chunks)
            ms, outs[a], after, got = timed_prompt(dev, e, p)
            t[a].append(ms); rf[a].append(after); mb[a].append(got)
            walks[a] = [(n, w) for n, w, _ in e.stats.chunks[n0:]]
        for a in names[1:]:
            kls[a].append(float(kl(outs["one"].astype(np.float64), outs[a].astype(np.float64))))
            top1[a] += int(np.argmax(outs["one"])) == int(np.argmax(outs[a]))
    line = []
    for a in names:
        ms, mbs = np.median(t[a]), np.median(mb[a])
        s = f"{a} {ms:6.2f} ms ({mbs:4.0f} MB, x{ms / (mbs / bw):.2f} floor, refill {np.median(rf[a]):.1f})"
        if a != "one":
            rr = np.array(t["one"]) / np.array(t[a])
            s += (f" one/{a} x{np.median(t['one']) / ms:.3f} (per-round {rr.min():.3f}-{rr.max():.3f}), KL max "
                  f"{max(kls[a]):.1e}, top-1 same {top1[a]}/{rounds}")
        line.append(s)
    print(f"  {L:5d}: " + "  ".join(line) + f"; chunks {walks}", flush=True)
