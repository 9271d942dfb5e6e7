"""In one process: rms_norm with a thread's values loaded together into registers (engine_kernels.cu now) against
the loop that loaded each in turn (before stop 43, its text below), CUDA only (bench/kernel_ab.py): alone at one row
(a decode token's norm) to 8,192 rows of 2,048 and 4,096 floats (and 5,120, past the registers' reach: the loop);
then prompts and decode on two quarter-cache engines, logits compared bit for bit.

python bench/rms_norm_ab.py MODEL.gguf 250,900,8192 ROUNDS"""
import sys, numpy as np
import cupy as cp

from kernel_ab import AB, compile_old

OLD = r'''
extern "C" __global__ void rms_norm_loop(float* out, const float* x, const float* w, int n, float eps) {
    __shared__ float sh[33];
    const float* xr = x + (long long)blockIdx.x * n;
    float s = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += xr[i] * xr[i];
    s = block_sum(s, sh);
    const float r = rsqrtf(s / n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[(long long)blockIdx.x * n + i] = xr[i] * r * w[i];
}
'''
old_fn = compile_old(OLD, "rms_norm_loop")


def old_rms_norm(out, x, w, eps, stream):
    n = x.shape[-1]
    old_fn((x.size // n,), (256,), (out, x, w, np.int32(n), np.float32(eps)), stream=stream.s)


path, lengths, rounds = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3])
ab = AB(path, "rms_norm", old_rms_norm, rounds)
rng = np.random.default_rng(0)
print(f"rms_norm alone: GPU us a launch (20 back to back), medians of {rounds * 4} interleaved timings", flush=True)
for n in (2048, 4096, 5120):
    w = cp.asarray(rng.standard_normal(n).astype(np.float32))
    for T in (1, 900, 8192):
        x = cp.asarray(rng.standard_normal((T, n)).astype(np.float32) * 3)
        out = cp.empty_like(x)
        ab.alone(f"{T:5d} rows of {n}", lambda f: (f(out, x, w, 1e-6, ab.dev.compute), (out,))[1])
ab.prompts(lengths, rng)
ab.decode(rng)
