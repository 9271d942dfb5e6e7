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
