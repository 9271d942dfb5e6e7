"""Which prompt attention kernel a launch takes (cuda_attn.attn_block_rows): 128-row blocks (32 rows a warp) where
they fill W32_WAVES waves of the GPU or the chunk has W32_KEYS keys a query, 64-row blocks below; both give the
same bits (test_gpu_kernels.py)."""

from strata.accel.gpu.cuda_attn import W32_KEYS, W32_WAVES, attn_block_rows

H200_SMS = 132


def test_qwen3s_prompts_on_the_h200():
    g, Hkv = 8, 4                                               # 32 query heads, 4 kv heads
    assert attn_block_rows(1280 * g, Hkv, H200_SMS) == 64       # a quarter cache's chunk: 320 blocks
    assert attn_block_rows(2048 * g, Hkv, H200_SMS) == 64       # 512 blocks
    assert attn_block_rows(8192 * g, Hkv, H200_SMS) == 128      # the resident engine's 8K chunk: 2,048 blocks
    # the quarter cache's 8K prompt in 7 chunks of 1,171: the 4th (3,513 keys before it) on, 128-row blocks
    for j, rows in enumerate((64, 64, 64, 128, 128, 128, 128)):
        assert attn_block_rows(1171 * g, Hkv, H200_SMS, 1171, (j + 1) * 1171) == rows, j
    assert attn_block_rows(100 * g, Hkv, H200_SMS, 100, W32_KEYS * 100 - 1) == 64
    assert attn_block_rows(100 * g, Hkv, H200_SMS, 100, W32_KEYS * 100) == 128


def test_the_threshold_is_whole_waves_of_two_blocks_a_multiprocessor():
    need = W32_WAVES * 2 * H200_SMS                             # 128-row blocks
    assert attn_block_rows(need * 128, 1, H200_SMS) == 128
    assert attn_block_rows((need - 1) * 128, 1, H200_SMS) == 64
    assert attn_block_rows((need - 1) * 128 + 1, 1, H200_SMS) == 128      # a partial block counts
    assert attn_block_rows(need * 64, 2, H200_SMS) == 128                 # blocks of every kv head


def test_the_wrapper_launches_the_kernel_it_chooses():
    """CudaAttentionKernels.attention launches what attn_rows forces (64 or 128, as the gpu bits test compares) or
    attn_block_rows chooses, with that kernel's grid and dynamic shared memory: the kernels recorded, not run."""
    from types import SimpleNamespace

    import numpy as np

    from strata.accel.gpu.cuda_attn import CudaAttentionKernels, _w32_smem

    launches = []

    def kernel(key):
        return lambda grid, block, args, stream=None, shared_mem=0: launches.append((key, grid, shared_mem))

    k = SimpleNamespace(attn_rows=None, sms=H200_SMS,
                        _afn={(d, r): kernel((d, r)) for d in (64, 128) for r in (64, 128)})
    hd, H, Hkv = 128, 32, 4
    kc = vc = np.zeros((16, Hkv, hd), np.float16)
    stream = SimpleNamespace(s=None)

    def launch(T, rows=None):
        k.attn_rows = rows
        q = np.zeros((T, H, hd), np.float32)
        CudaAttentionKernels.attention(k, np.zeros((T, H * hd), np.float32), q, kc, vc, 0, None, stream)
        return launches[-1]

    M = 8192 * H // Hkv
    assert launch(8192) == ((hd, 128), (M // 128, Hkv), _w32_smem(hd))          # 2,048 blocks: the 32-row warps
    assert launch(1280) == ((hd, 64), (1280 * 8 // 64, Hkv), 0)                   # 320 blocks of 128: the 16-row
    assert launch(8192, rows=64) == ((hd, 64), (M // 64, Hkv), 0)                 # forced, as the bits test does
    assert launch(1280, rows=128) == ((hd, 128), (1280 * 8 // 128, Hkv), _w32_smem(hd))
    pos0 = W32_KEYS * 1280 - 1280                                                 # late in a long prompt
    k.attn_rows = None
    CudaAttentionKernels.attention(k, np.zeros((1280, H * hd), np.float32), np.zeros((1280, H, hd), np.float32),
                                   kc, vc, pos0, None, stream)
    assert launches[-1] == ((hd, 128), (1280 * 8 // 128, Hkv), _w32_smem(hd))
