"""Which prompt attention kernel a launch takes (cuda_attn.attn_block_rows): 128-row blocks (32 rows a warp) where
they fill W32_WAVES waves of the GPU, 64-row blocks below; both give the same bits (test_gpu_kernels.py)."""

from strata.accel.gpu.cuda_attn import W32_WAVES, attn_block_rows

H200_SMS = 132


def test_qwen3s_prompts_on_the_h200():
    g, Hkv = 8, 4                                               # 32 query heads, 4 kv heads
    assert attn_block_rows(1280 * g, Hkv, H200_SMS) == 64       # a quarter cache's chunk: 320 blocks
    assert attn_block_rows(2048 * g, Hkv, H200_SMS) == 64       # 512 blocks
    assert attn_block_rows(8192 * g, Hkv, H200_SMS) == 128      # the resident engine's 8K chunk: 2,048 blocks


def test_the_threshold_is_whole_waves_of_two_blocks_a_multiprocessor():
    need = W32_WAVES * 2 * H200_SMS                             # 128-row blocks
    assert attn_block_rows(need * 128, 1, H200_SMS) == 128
    assert attn_block_rows((need - 1) * 128, 1, H200_SMS) == 64
    assert attn_block_rows((need - 1) * 128 + 1, 1, H200_SMS) == 128      # a partial block counts
    assert attn_block_rows(need * 64, 2, H200_SMS) == 128                 # blocks of every kv head
