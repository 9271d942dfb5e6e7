"""In one process: qwen3's q/k norm_rope as a warp a head (engine_kernels.cu now) against a 256-thread block a head
(the kernel before stop 43, which the tree keeps for a decode token's heads), CUDA only (bench/kernel_ab.py).

1. The kernel alone at qwen3-30b-a3b's shape (32 q heads, 4 kv heads, 128 dims) over T tokens: GPU us a launch
   by events around REPS launches queued behind a busy GPU (so the host's launch cost is not timed: a decode graph
   replays them back to back), the arms interleaved, medians; the outputs compared bit for bit.
2. Prompts on two quarter-cache engines on one arena (bench/prefill.py's), the CPU share off: one runs the old
   kernel (its eager launches, and the prompt and decode graphs it captures), one the new; arms alternating;
   prompt ms medians, new/old per round, the logits compared bit for bit.
3. Decode: each engine's captured graph, tok/s over 32 tokens after a 64-token prompt.

python bench/norm_rope_ab.py MODEL.gguf 250,600,900,2048,8192 ROUNDS"""
import sys, numpy as np
import cupy as cp

from kernel_ab import AB


def old_norm_rope(qo, ko, q, k, wq, wk, eps, cos, sin, pos, n_rot, neox, stream):
    """The block-a-head kernel on every launch (the tree keeps it for a decode token's heads)."""
    T, H, hd = q.shape
    ab.kern.fn["norm_rope"]((T * (H + k.shape[1]),), (256,),
                            (qo, ko, q, k, wq, wk, np.float32(eps), cos, sin, pos, np.int32(H), np.int32(k.shape[1]),
                             np.int32(hd), np.int32(n_rot), np.int32(bool(neox))), stream=stream.s, shared_mem=hd * 4)


path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
ab = AB(path, "norm_rope", old_norm_rope, rounds)
H, Hkv, hd = 32, 4, 128
rng = np.random.default_rng(0)
cos, sin = (cp.asarray(rng.standard_normal((8200, hd // 2)).astype(np.float32)) for _ in range(2))
wq, wk = (cp.asarray(rng.standard_normal(hd).astype(np.float32)) for _ in range(2))
print(f"norm_rope alone, {H} q + {Hkv} kv heads of {hd}: GPU us a launch (20 back to back), medians of "
      f"{rounds * 4} interleaved timings", flush=True)
for T in (1, 256, 900, 1280, 8192):
    q = cp.asarray(rng.standard_normal((T, H, hd)).astype(np.float32) * 3)
    k = cp.asarray(rng.standard_normal((T, Hkv, hd)).astype(np.float32) * 3)
    pos = cp.arange(5, 5 + T, dtype=cp.int32)
    qo, ko = cp.empty_like(q), cp.empty_like(k)
    ab.alone(f"T {T:5d}", lambda f: (f(qo, ko, q, k, wq, wk, 1e-6, cos, sin, pos, hd, True, ab.dev.compute),
                                      (qo, ko))[1])
ab.prompts(lengths, rng)
ab.decode(rng)
