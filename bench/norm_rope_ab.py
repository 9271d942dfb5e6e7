"""In one process: qwen3's q/k norm_rope as a warp a head (engine_kernels.cu now) against a 256-thread block a head
(the kernel before stop 43, compiled here from its text below), CUDA only.

1. The kernel alone at qwen3-30b-a3b's shape (32 q heads, 4 kv heads, 128 dims) over T tokens: GPU us a launch
   by events around REPS launches queued behind a busy GPU (so the host's launch cost is not timed: a decode graph
   replays them back to back), the arms interleaved, medians; the outputs compared bit for bit.
2. Prompts on two quarter-cache engines on one arena (bench/prefill.py's), the CPU share off: one runs the old
   kernel (its eager launches, and the prompt and decode graphs it captures), one the new; arms alternating;
   prompt ms medians, new/old per round, the logits compared bit for bit.

python bench/norm_rope_ab.py MODEL.gguf 250,600,900,2048,8192 ROUNDS"""
import sys, time, numpy as np
import cupy as cp
from strata.accel.gpu import dequant as dq

from prefill import quarter_engines, warm      # bench/prefill.py

OLD = r'''
extern "C" __global__ void norm_rope_block(float* qo, float* ko, const float* q, const float* k, const float* wq,
                                           const float* wk, float eps, const float* cs, const float* sn, const int* pos,
                                           int H, int Hkv, int hd, int n_rot, int neox) {
    extern __shared__ float v[];  // [hd]
    __shared__ float sh[33];
    const int t = blockIdx.x / (H + Hkv), j = blockIdx.x % (H + Hkv);
    const bool isq = j < H;
    const long long off = (isq ? (long long)t * H + j : (long long)t * Hkv + (j - H)) * hd;
    const float* xr = (isq ? q : k) + off;
    const float* w = isq ? wq : wk;
    float s = 0.f;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) s += xr[i] * xr[i];
    s = block_sum(s, sh);
    const float r = rsqrtf(s / hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = xr[i] * r * w[i];
    __syncthreads();
    const int half = n_rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x)
        rope_pair(v, i, half, neox, cs[(long long)pos[t] * half + i], sn[(long long)pos[t] * half + i]);
    __syncthreads();
    float* out = (isq ? qo : ko) + off;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) out[i] = v[i];
}
'''
old_fn = cp.RawModule(code=dq.source("engine_kernels.cu") + OLD, options=("--std=c++17",)).get_function(
    "norm_rope_block")


def old_norm_rope(qo, ko, q, k, wq, wk, eps, cos, sin, pos, n_rot, neox, stream):
    T, H, hd = q.shape
    old_fn((T * (H + k.shape[1]),), (256,), (qo, ko, q, k, wq, wk, np.float32(eps), cos, sin, pos, np.int32(H),
                                             np.int32(k.shape[1]), np.int32(hd), np.int32(n_rot),
                                             np.int32(bool(neox))), stream=stream.s, shared_mem=hd * 4)


path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
dev, m, arena, (eo, en) = quarter_engines(path, 2)
c = m.cfg
kern = dev.k
new_norm_rope = kern.norm_rope

# 1. the kernel alone
H, Hkv, hd = 32, 4, 128
rng = np.random.default_rng(0)
cos, sin = (cp.asarray(rng.standard_normal((8200, hd // 2)).astype(np.float32)) for _ in range(2))
wq, wk = (cp.asarray(rng.standard_normal(hd).astype(np.float32)) for _ in range(2))
REPS = 20
busy = cp.empty(1 << 28, np.uint8)      # a 256 MiB memset ahead of each timing: the launches queue behind it
print(f"norm_rope alone, {H} q + {Hkv} kv heads of {hd}: GPU us a launch ({REPS} back to back), medians of "
      f"{rounds * 4} interleaved timings", flush=True)
for T in (1, 256, 900, 1280, 8192):
    q = cp.asarray(rng.standard_normal((T, H, hd)).astype(np.float32) * 3)
    k = cp.asarray(rng.standard_normal((T, Hkv, hd)).astype(np.float32) * 3)
    pos = cp.arange(5, 5 + T, dtype=cp.int32)
    outs, us = {}, {"old": [], "new": []}
    for i in range(rounds * 4 + 2):
        for md, f in (("old", old_norm_rope), ("new", new_norm_rope)):
            qo, ko = cp.empty_like(q), cp.empty_like(k)
            e0, e1 = dev.event(), dev.event()
            with dev.compute.s:
                busy.fill(i & 255)
            e0.record(dev.compute)
            for _ in range(REPS):
                f(qo, ko, q, k, wq, wk, 1e-6, cos, sin, pos, hd, True, dev.compute)
            e1.record(dev.compute)
            e1.synchronize()
            if i >= 2:
                us[md].append(e0.elapsed_ms(e1) * 1e3 / REPS)
            outs[md] = (cp.asnumpy(qo), cp.asnumpy(ko))
    same = all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(outs["old"], outs["new"]))
    print(f"  T {T:5d}: old {np.median(us['old']):7.1f} us  new {np.median(us['new']):7.1f} us  old/new "
          f"x{np.median(us['old']) / np.median(us['new']):.2f}; bits identical: {same}", flush=True)

# 2. prompts
arms = {"old": (eo, old_norm_rope), "new": (en, new_norm_rope)}


def use(md):
    kern.norm_rope = arms[md][1]    # the engines share the device's kernels: the arm's launches (and captures)


for md in arms:
    use(md)
    warm((arms[md][0],), lengths, rng, c.n_vocab)
print(f"{path}: quarter cache {en.plan.cache_slots} slots, chunk {en.plan.chunk}; {rounds} rounds, arms alternating; "
      f"medians; ratio = old/new", flush=True)
for L in lengths:
    t = {"old": [], "new": []}
    same = True
    for r in range(rounds):
        p = rng.integers(0, c.n_vocab, L).tolist()
        outs = {}
        for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
            use(md)
            e = arms[md][0]
            e.reset()
            dev.synchronize()
            t0 = time.perf_counter()
            outs[md] = e.prefill(p)
            t[md].append((time.perf_counter() - t0) * 1e3)
            dev.synchronize()
        same &= np.array_equal(outs["old"].view(np.uint32), outs["new"].view(np.uint32))
    rr = np.array(t["old"]) / np.array(t["new"])
    print(f"  {L:5d}: old {np.median(t['old']):7.2f} ms  new {np.median(t['new']):7.2f} ms  old/new "
          f"x{np.median(t['old']) / np.median(t['new']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f}, median "
          f"{np.median(rr):.3f}); logits identical: {same}", flush=True)

# 3. decode: each engine after a 64-token prompt, 32 teacher-forced random tokens (its captured decode graph)
tps = {"old": [], "new": []}
for r in range(rounds):
    p = rng.integers(0, c.n_vocab, 64).tolist()
    d = rng.integers(0, c.n_vocab, 32).tolist()
    for md in (("old", "new") if r % 2 == 0 else ("new", "old")):
        use(md)
        e = arms[md][0]
        e.reset()
        e.prefill(p)
        dev.synchronize()
        t0 = time.perf_counter()
        for tok in d:
            e.decode([tok])
        dev.synchronize()
        tps[md].append(len(d) / (time.perf_counter() - t0))
rr = np.array(tps["new"]) / np.array(tps["old"])
print(f"  decode: old {np.median(tps['old']):.1f} tok/s  new {np.median(tps['new']):.1f} tok/s  new/old "
      f"x{np.median(tps['new']) / np.median(tps['old']):.3f} (per-round {rr.min():.3f}-{rr.max():.3f})", flush=True)
