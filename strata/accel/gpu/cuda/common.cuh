// Helpers of engine_kernels.cu and decode_kernels.cu (NVRTC source). fp16 values travel as their bit patterns
// (unsigned short) and convert with the cvt instructions, so the kernels need no cuda_fp16.h.
#pragma once

typedef unsigned short half_t;
typedef unsigned int u32;

__device__ __forceinline__ float h2f(half_t h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ half_t f2h(float f) {
    half_t h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
}

// SwiGLU's fp16 intermediate of one column, silu(g) · u: the `swiglu` kernel's and the decode graph's down GEMV's
// (which computes it while staging its input row) one expression, so both give the same bits
__device__ __forceinline__ half_t swiglu_h(float g, float u) { return f2h(g / (1.f + __expf(-g)) * u); }

// the sum of v over the block (blockDim.x a multiple of 32, sh >= 33 floats), returned to every thread
__device__ __forceinline__ float block_sum(float v, float* sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    if (l == 0) sh[w] = v;
    __syncthreads();
    v = (threadIdx.x < (blockDim.x >> 5)) ? sh[threadIdx.x] : 0.f;
    if (w == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x == 0) sh[32] = v;
    __syncthreads();
    v = sh[32];
    __syncthreads();
    return v;
}

// A warp copies n bytes of src (device memory, or pinned host memory read over PCIe) into its shared stage st:
// 4-byte loads when src is 4-aligned, each byte read once and coalesced (what a zero-copy read over PCIe needs),
// then the ragged tail byte by byte. Followed by __syncwarp() before the stage is read.
__device__ __forceinline__ void warp_stage(unsigned char* st, const unsigned char* src, int n, int lane) {
    int i0 = 0;
    if (((unsigned long long)src & 3ull) == 0) {
        const int nw = n >> 2;
        for (int i = lane; i < nw; i += 32)
            reinterpret_cast<unsigned int*>(st)[i] = reinterpret_cast<const unsigned int*>(src)[i];
        i0 = nw << 2;
    }
    for (int i = i0 + lane; i < n; i += 32) st[i] = src[i];
    __syncwarp();
}

// One warp step along a quantised weight row of type Q: stage the row's blocks b0 .. b0 + 32/PPB - 1 (no further
// than block RB - 1) into the warp's stage st, then dequantise this lane's part exactly (Q::dq_part) into v.
// False for lanes past the row's end. The caller __syncwarp()s before the next step restages st.
template <class Q>
__device__ __forceinline__ bool stage_row_part(unsigned char* st, const unsigned char* row, int b0, int RB, int lane,
                                               float* v) {
    constexpr int PPB = Q::QK / Q::PART;  // parts per block
    const int nb = min(32 / PPB, RB - b0);
    warp_stage(st, row + (long long)b0 * Q::SIZE, nb * Q::SIZE, lane);
    if (lane >= nb * PPB) return false;
    Q::dq_part(st + (lane / PPB) * Q::SIZE, lane % PPB, v);
    return true;
}
