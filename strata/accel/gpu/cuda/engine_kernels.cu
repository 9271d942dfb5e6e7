// The engine's CUDA kernels (strata/accel/gpu/kernels.py states each contract). NVRTC source: no host headers.
// Legend: T tokens, D hidden, R expert-major rows, K top-k, N/Kd a matrix's rows/row length, H/Hkv heads.
// Shared helpers (fp16 conversion, block_sum): common.cuh, flattened in by strata.accel.gpu.dequant's loader.

#include "common.cuh"
#include "mma.cuh"

// ---- grouped GEMM on tensor cores ---------------------------------------------------------------------------
// mma.cuh gemm_tile states the contract and the fixed-order sums. Which tiling runs where (bench/gemm_kernel.py,
// gemm_kernel_stop44.log on the H200): a k step of 64 in 3 stages instead of 32 in 3-4 halves the barriers a
// product; 64-row tiles (experts of up to 64 rows: weight reads bound them) take 8 warps of 32x32, 1.42-1.60x stop
// 43's 4 warps of 32x64 at 8-56 rows an expert; 128-row tiles keep 4 warps of 64x64, 1.02-1.38x their k32 form.

extern "C" __global__ void __launch_bounds__(GemmTile<GEMM64_ARGS>::THREADS) gemm_grouped_mma(
    float* C, int ldc, const half_t* A, int lda, const half_t* W, const int* tiles, int N, int Kd) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    gemm_tile<GEMM64_ARGS>(C, ldc, A, lda, W, tiles, N, Kd, smem_raw);
}

extern "C" __global__ void __launch_bounds__(GemmTile<GEMM128_ARGS>::THREADS) gemm_grouped_mma128(
    float* C, int ldc, const half_t* A, int lda, const half_t* W, const int* tiles, int N, int Kd) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    gemm_tile<GEMM128_ARGS>(C, ldc, A, lda, W, tiles, N, Kd, smem_raw);
}

// The same product on plain fp32 cores (STRATA_GEMM=simt): a fallback and a cross-check of the MMA kernel.
extern "C" __global__ void gemm_grouped_simt(float* C, int ldc, const half_t* A, int lda, const half_t* W,
                                             const int* tiles, int N, int Kd) {
    __shared__ float As[16][17];
    __shared__ float Bs[16][17];
    const int g = tiles[3 * blockIdx.x], r0 = tiles[3 * blockIdx.x + 1], r1 = tiles[3 * blockIdx.x + 2];
    const half_t* Wg = W + (long long)g * N * Kd;
    for (int rb = r0; rb < r1; rb += 16) {
        const int r = rb + threadIdx.y, n = blockIdx.y * 16 + threadIdx.x;
        float acc = 0.f;
        for (int k0 = 0; k0 < Kd; k0 += 16) {
            const int ra = rb + threadIdx.y, ka = k0 + threadIdx.x;
            As[threadIdx.y][threadIdx.x] = (ra < r1 && ka < Kd) ? h2f(A[(long long)ra * lda + ka]) : 0.f;
            const int nb = blockIdx.y * 16 + threadIdx.y;
            Bs[threadIdx.y][threadIdx.x] = (nb < N && ka < Kd) ? h2f(Wg[(long long)nb * Kd + ka]) : 0.f;
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < 16; kk++) acc = __fadd_rn(acc, __fmul_rn(As[threadIdx.y][kk], Bs[threadIdx.x][kk]));
            __syncthreads();
        }
        if (r < r1 && n < N) C[(long long)r * ldc + n] = acc;
    }
}

// ---- rows and elementwise --------------------------------------------------------------------------------------
// dst[0:n16] = src[0:n16], 16 bytes a thread, grid-stride. src is pinned host memory read over PCIe by the SMs
// (UVA: a cudaHostAlloc pointer is valid in kernels): the tables then reach the device without the copy engine,
// whose queue holds the ring's expert copies (cuda_kernels.py upload).
extern "C" __global__ void pull_bytes(uint4* dst, const uint4* src, long long n16) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x)
        dst[i] = src[i];
}

extern "C" __global__ void gather_f16(half_t* out, const float* x, const int* src, int R, int D) {
    const int r = blockIdx.x;
    const float* xs = x + (long long)src[r] * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) out[(long long)r * D + d] = f2h(xs[d]);
}

extern "C" __global__ void to_f16(half_t* out, const float* x, long long n, int cols, int ld) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = f2h(x[(i / cols) * ld + i % cols]);
}

// out fp16 [R, F] = silu(gu[:, :F]) * gu[:, F:2F]; gu fp32 [R, ldg]
extern "C" __global__ void swiglu(half_t* out, const float* gu, int R, int F, int ldg) {
    const int r = blockIdx.x;
    for (int f = threadIdx.x; f < F; f += blockDim.x) {
        const float g = gu[(long long)r * ldg + f], u = gu[(long long)r * ldg + F + f];
        out[(long long)r * F + f] = swiglu_h(g, u);
    }
}

// swiglu over rows span[0] .. span[1] - 1 of out and gu (a launch group's rows, made on the device before the
// routing sync: presync.py), the grid striding over them; the same expression, so the same bits
extern "C" __global__ void swiglu_span(half_t* out, const float* gu, const int* span, int F, int ldg) {
    const int r1 = span[1];
    for (int r = span[0] + blockIdx.x; r < r1; r += gridDim.x)
        for (int f = threadIdx.x; f < F; f += blockDim.x) {
            const float g = gu[(long long)r * ldg + f], u = gu[(long long)r * ldg + F + f];
            out[(long long)r * F + f] = swiglu_h(g, u);
        }
}

// out = a + b, n floats: a block's residual add (ops.add) as one raw launch, where CuPy's `a + b` cost its
// elementwise dispatch (~30 us of host time a call in a prompt on the H200, hostline_dense_q8_stop29.log); the same
// f32 sum
extern "C" __global__ void add_f32(float* out, const float* a, const float* b, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

// out [T, N] = y + b, b [N]: a projection's bias (qwen2moe's q, k, v) as a launch, the float add CuPy's y + b made
extern "C" __global__ void add_bias_f32(float* out, const float* y, const float* b, long long n, int N) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = y[i] + b[i % N];
}

// out [T, D] = s · sigmoid(g), g [T, 1]: the shared expert's gate (qwen2moe) in one launch where CuPy's
// elementwise ops took three; the same float operations (expf, 1 + e, 1 / that, the product) as those ops
extern "C" __global__ void sigmoid_gate(float* out, const float* s, const float* g, long long n, int D) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = s[i] * (1.f / (1.f + expf(-g[i / D])));
}

// out [T, D] = sum over k in order of w[t,k] * dm[slot[t,k], :]
extern "C" __global__ void combine(float* out, const float* dm, const int* slot, const float* w, int T, int K, int D) {
    const int t = blockIdx.x;
    for (int d = blockIdx.y * blockDim.x + threadIdx.x; d < D; d += gridDim.y * blockDim.x) {
        float acc = 0.f;
        for (int k = 0; k < K; k++)
            acc = __fadd_rn(acc, __fmul_rn(w[t * K + k], dm[(long long)slot[t * K + k] * D + d]));
        out[(long long)t * D + d] = acc;
    }
}


// one block per row: out = x / sqrt(mean(x^2) + eps) * w. A thread's values of rows of up to RN_REG·blockDim.x
// load together into registers, then add in the loop's order (x[t]², x[t + 256]², ...): a decode token's one block
// waited out each load in turn (8.1 us a norm, 17 a token, decode_profile_q8_stop41.log). 16 a thread cost
// 900-row prompts 0.8x (rms_norm_ab_q8_stop43a.log, likely blocks a multiprocessor); longer rows take the loop
#define RN_REG 8
extern "C" __global__ void rms_norm(float* out, const float* x, const float* w, int n, float eps) {
    __shared__ float sh[33];
    const float* xr = x + (long long)blockIdx.x * n;
    float* o = out + (long long)blockIdx.x * n;
    const int t = threadIdx.x, b = blockDim.x;
    float s = 0.f;
    if (n <= RN_REG * b) {
        float v[RN_REG];
#pragma unroll
        for (int j = 0; j < RN_REG; j++) v[j] = t + j * b < n ? xr[t + j * b] : 0.f;
#pragma unroll
        for (int j = 0; j < RN_REG; j++)
            if (t + j * b < n) s += v[j] * v[j];
        s = block_sum(s, sh);
        const float r = rsqrtf(s / n + eps);
#pragma unroll
        for (int j = 0; j < RN_REG; j++)
            if (t + j * b < n) o[t + j * b] = v[j] * r * w[t + j * b];
        return;
    }
    for (int i = t; i < n; i += b) s += xr[i] * xr[i];
    s = block_sum(s, sh);
    const float r = rsqrtf(s / n + eps);
    for (int i = t; i < n; i += b) o[i] = xr[i] * r * w[i];
}

// one rotated pair in place: rope's and norm_rope's one expression
__device__ __forceinline__ void rope_pair(float* v, int i, int half, int neox, float c, float s) {
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float va = v[a], vb = v[b];
    v[a] = va * c - vb * s;
    v[b] = va * s + vb * c;
}

// in place on x [T, H, hd]; cos/sin [P, n_rot/2]; NeoX pairs (i, i + n_rot/2), normal pairs (2i, 2i + 1)
extern "C" __global__ void rope(float* x, const float* cs, const float* sn, const int* pos, int T, int H, int hd,
                                int n_rot, int neox) {
    const int half = n_rot / 2;
    const long long n = (long long)T * H * half;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n; idx += (long long)gridDim.x * blockDim.x) {
        const int i = idx % half, th = idx / half, t = th / H;
        rope_pair(x + (long long)th * hd, i, half, neox, cs[(long long)pos[t] * half + i], sn[(long long)pos[t] * half + i]);
    }
}

// qwen3's per-head q/k RMSNorm then RoPE in one launch (four before: a decode token ran them as its layer's
// smallest kernels): block (t, j) takes head j of token t, j < H of q, else of k. The norm is rms_norm's code at
// its 256 threads (the same block_sum), the rotation rope_pair on the normed head in shared memory. A decode
// token's 36 heads; a prompt's many take norm_rope_warp
extern "C" __global__ void norm_rope(float* qo, float* ko, const float* q, const float* k, const float* wq,
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

// norm_rope over a prompt's many heads, a warp a head: warp i of block b takes head t·(H + Hkv) + j = 8b + i. A block
// a head left half its threads idle behind six barriers (0.5 ms of a 900-token prompt's GPU time on qwen3,
// bench/results/h200/prefill_ops_q8_stop39.log; 2.5x faster alone at 900 tokens, norm_rope_ab_q8_stop43.log). The
// sum of squares is block_sum's at 256 threads replayed in one warp: virtual warp w's lanes sum x[32w + lane]
// (+ 256, ...), block_sum's butterfly reduces each, then its second stage the 8 warp sums (its 24 zero lanes add
// exact zeros): the same bits as norm_rope (tests/test_gpu_kernels.py). The head sits in shared memory, so its loads
// go out together. Slower than norm_rope on a decode token's 36 heads (0.78x: 5 blocks)
#define NR_VWARPS 8   // block_sum's 256 threads
extern "C" __global__ void __launch_bounds__(256) norm_rope_warp(
        float* qo, float* ko, const float* q, const float* k, const float* wq, const float* wk, float eps,
        const float* cs, const float* sn, const int* pos, int T, int H, int Hkv, int hd, int n_rot, int neox) {
    extern __shared__ float vs[];  // [8][hd]
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const long long head = (long long)blockIdx.x * (blockDim.x >> 5) + wi;
    if (head >= (long long)T * (H + Hkv)) return;     // a whole warp: no block barrier follows
    const int t = head / (H + Hkv), j = head % (H + Hkv);
    const bool isq = j < H;
    const long long off = (isq ? (long long)t * H + j : (long long)t * Hkv + (j - H)) * hd;
    const float* xr = (isq ? q : k) + off;
    const float* w = isq ? wq : wk;
    float* v = vs + wi * hd;
#pragma unroll 4
    for (int i = lane; i < hd; i += 32) v[i] = xr[i];
    __syncwarp();
    float u[NR_VWARPS];
#pragma unroll
    for (int vw = 0; vw < NR_VWARPS; vw++) {
        float s = 0.f;
        for (int i = 32 * vw + lane; i < hd; i += 32 * NR_VWARPS) s += v[i] * v[i];
        u[vw] = s;
    }
#pragma unroll
    for (int vw = 0; vw < NR_VWARPS; vw++)
        if (32 * vw < hd)                             // warp-uniform; past hd a virtual warp's sum is 0
            for (int o = 16; o > 0; o >>= 1) u[vw] += __shfl_xor_sync(0xffffffffu, u[vw], o);
#pragma unroll
    for (int o = NR_VWARPS / 2; o > 0; o >>= 1) {     // block_sum's second stage, lane 0's value
        float nu[NR_VWARPS];
#pragma unroll
        for (int l = 0; l < NR_VWARPS; l++) nu[l] = u[l] + u[l ^ o];
#pragma unroll
        for (int l = 0; l < NR_VWARPS; l++) u[l] = nu[l];
    }
    const float r = rsqrtf(u[0] / hd + eps);
#pragma unroll 4
    for (int i = lane; i < hd; i += 32) v[i] = v[i] * r * w[i];
    __syncwarp();
    const int half = n_rot / 2;
    const long long p = (long long)pos[t] * half;
    for (int i = lane; i < half; i += 32) rope_pair(v, i, half, neox, cs[p + i], sn[p + i]);
    __syncwarp();
    float* out = (isq ? qo : ko) + off;
#pragma unroll 4
    for (int i = lane; i < hd; i += 32) out[i] = v[i];
}

extern "C" __global__ void kv_store(half_t* kc, half_t* vc, const float* k, const float* v, long long off, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
        kc[off + i] = f2h(k[i]);
        vc[off + i] = f2h(v[i]);
    }
}

// one block per token: softmax over E logits, then k rounds of argmax (ties -> the lower id)
extern "C" __global__ void router_topk(int* ids, float* w, const float* logits, int E, int K, int renorm) {
    extern __shared__ float p[];
    __shared__ float sh[33];
    __shared__ int besti[32];
    __shared__ float bestv[32];
    const float* l = logits + (long long)blockIdx.x * E;
    float m = -3.0e38f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) m = fmaxf(m, l[e]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = m;
    __syncthreads();
    m = sh[0];
    for (int i = 1; i < (blockDim.x >> 5); i++) m = fmaxf(m, sh[i]);
    __syncthreads();
    float s = 0.f;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        p[e] = expf(l[e] - m);
        s += p[e];
    }
    s = block_sum(s, sh);
    for (int e = threadIdx.x; e < E; e += blockDim.x) p[e] = p[e] / s;
    __syncthreads();
    for (int k = 0; k < K; k++) {
        float bv = -1.f;
        int bi = 0x7fffffff;
        for (int e = threadIdx.x; e < E; e += blockDim.x)
            if (p[e] > bv || (p[e] == bv && e < bi)) { bv = p[e]; bi = e; }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if ((threadIdx.x & 31) == 0) { bestv[threadIdx.x >> 5] = bv; besti[threadIdx.x >> 5] = bi; }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int i = 1; i < (blockDim.x >> 5); i++)
                if (bestv[i] > bv || (bestv[i] == bv && besti[i] < bi)) { bv = bestv[i]; bi = besti[i]; }
            ids[blockIdx.x * K + k] = bi;
            w[blockIdx.x * K + k] = bv;
            p[bi] = -2.f;
        }
        __syncthreads();
    }
    // renormalised over the k: the sum in k order from +0.0 and IEEE division, RefOps.renorm's arithmetic (a kernel
    // here, not two CuPy ops after it: a decode token's graph ran those two small kernels in every layer)
    if (renorm && threadIdx.x == 0) {
        float* wt = w + (long long)blockIdx.x * K;
        float s = 0.f;
        for (int k = 0; k < K; k++) s += wt[k];
        for (int k = 0; k < K; k++) wt[k] = wt[k] / s;
    }
}

// ---- attention through cuBLAS: permute, masked softmax, permute back ---------------------------------------------
// qp fp16 [Hkv][M = Tq*g][hd] <- q fp32 [T, H, hd] rows q0 .. q0+Tq-1; query head j*g+i of kv head j
extern "C" __global__ void attn_qperm(half_t* qp, const float* q, int q0, int Tq, int H, int Hkv, int hd) {
    const int g = H / Hkv;
    const long long n = (long long)Hkv * Tq * g * hd;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n; idx += (long long)gridDim.x * blockDim.x) {
        const int d = idx % hd;
        const long long row = idx / hd;               // j * (Tq*g) + t*g + i
        const int j = row / (Tq * g), ti = row % (Tq * g), t = ti / g, i = ti % g;
        qp[idx] = f2h(q[((long long)(q0 + t) * H + j * g + i) * hd + d]);
    }
}

// p fp16 [B][M][S] <- softmax over s <= pos of scale * sc fp32 [B][M][S]; row m is query t = m / g at pos0+q0+t
extern "C" __global__ void attn_softmax(half_t* p, const float* sc, int M, int S, int g, int qpos0, float scale) {
    __shared__ float sh[33];
    const long long row = blockIdx.x;                 // b * M + m
    const int m = row % M, lim = qpos0 + m / g;       // keys 0..lim
    const float* x = sc + row * S;
    float mx = -3.0e38f;
    for (int s = threadIdx.x; s <= lim && s < S; s += blockDim.x) mx = fmaxf(mx, x[s] * scale);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = sh[0];
    for (int i = 1; i < (blockDim.x >> 5); i++) mx = fmaxf(mx, sh[i]);
    __syncthreads();
    float sum = 0.f;
    for (int s = threadIdx.x; s <= lim && s < S; s += blockDim.x) sum += expf(x[s] * scale - mx);
    sum = block_sum(sum, sh);
    const float inv = 1.f / sum;
    for (int s = threadIdx.x; s < S; s += blockDim.x)
        p[row * S + s] = f2h(s <= lim ? expf(x[s] * scale - mx) * inv : 0.f);
}

// out fp32 [T, H*hd] rows q0.. <- o fp32 [Hkv][M][hd]
extern "C" __global__ void attn_operm(float* out, const float* o, int q0, int Tq, int H, int Hkv, int hd) {
    const int g = H / Hkv;
    const long long n = (long long)Hkv * Tq * g * hd;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n; idx += (long long)gridDim.x * blockDim.x) {
        const int d = idx % hd;
        const long long row = idx / hd;
        const int j = row / (Tq * g), ti = row % (Tq * g), t = ti / g, i = ti % g;
        out[((long long)(q0 + t) * H + j * g + i) * hd + d] = o[idx];
    }
}

// ---- decode-sized products: out [T, N] = x [T, Kd] · W [N, Kd]^T for T <= 8, one warp per output row ------------
// (cuBLAS's per-call cost dominates at these sizes; a warp streams its weight row once for all T tokens)
// vec = 1 when Kd % 8 == 0 and W, x (and ldx·4 bytes) are 16-byte aligned: each lane loads 8 weights at a time
// (512 bytes a warp per step, what saturates HBM; 4-byte loads reached 1.6 TB/s on the H200's 778 MB head)
template <class Wt>
__device__ __forceinline__ void gemv_rows(float* out, int ldo, const float* x, int ldx, const Wt* W, int N, int Kd,
                                          int T, int vec) {
    const int n = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (n >= N) return;
    const Wt* w = W + (long long)n * Kd;
    float acc[8];
#pragma unroll
    for (int t = 0; t < 8; t++) acc[t] = 0.f;
    int k0 = 0;
    if (vec) {
        for (int k = lane * 8; k + 8 <= Kd; k += 256) {
            float wf[8];
            if constexpr (sizeof(Wt) == 2) {
                const uint4 v = *reinterpret_cast<const uint4*>(w + k);
                const u32 u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    wf[2 * i] = h2f((half_t)(u[i] & 0xffff));
                    wf[2 * i + 1] = h2f((half_t)(u[i] >> 16));
                }
            } else {
                const float4 a = *reinterpret_cast<const float4*>(w + k), b = *reinterpret_cast<const float4*>(w + k + 4);
                wf[0] = a.x; wf[1] = a.y; wf[2] = a.z; wf[3] = a.w; wf[4] = b.x; wf[5] = b.y; wf[6] = b.z; wf[7] = b.w;
            }
#pragma unroll
            for (int t = 0; t < 8; t++) {
                if (t >= T) break;
                const float4 a = *reinterpret_cast<const float4*>(x + (long long)t * ldx + k);
                const float4 b = *reinterpret_cast<const float4*>(x + (long long)t * ldx + k + 4);
                acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                          wf[6] * b.z + wf[7] * b.w;
            }
        }
        k0 = Kd;
    }
    for (int k = k0 + lane; k < Kd; k += 32) {
        float wk;
        if constexpr (sizeof(Wt) == 2) wk = h2f(w[k]); else wk = w[k];
#pragma unroll
        for (int t = 0; t < 8; t++)
            if (t < T) acc[t] += wk * x[(long long)t * ldx + k];
    }
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t >= T) break;
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) out[(long long)t * ldo + n] = v;
    }
}

extern "C" __global__ void gemv_f16(float* out, int ldo, const float* x, int ldx, const half_t* W, int N, int Kd,
                                    int T, int vec) {
    gemv_rows<half_t>(out, ldo, x, ldx, W, N, Kd, T, vec);
}

extern "C" __global__ void gemv_f32(float* out, int ldo, const float* x, int ldx, const float* W, int N, int Kd,
                                    int T, int vec) {
    gemv_rows<float>(out, ldo, x, ldx, W, N, Kd, T, vec);
}

// f16 input rows for the f16 GEMV (the shared expert's intermediate): widen to f32 first
extern "C" __global__ void to_f32(float* out, const half_t* x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        out[i] = h2f(x[i]);
}
