"""policy.layer_major: when a prompt runs layer by layer, at what chunk and loan, and which cache slots take a
layer's experts."""

import numpy as np

from strata.policy.layer_major import layer_major_chunk, victims

MIB = 2**20


def _plan(tokens, chunk=1280, slots=600, max_loan=128, n_expert=128, owned=None, per_token=MIB // 4):
    # buffers of 1/4 MiB a token (qwen3-30b-a3b's ~0.22), residual streams of 8 KiB a token, 1 MiB slots
    return layer_major_chunk(tokens, chunk, slots, MIB, max_loan, n_expert, lambda t: t * per_token,
                             tokens * 8192, owned)


def test_the_fewest_equal_chunks_whose_buffers_and_streams_fit_the_loan():
    # 8192 tokens: 64 MiB of streams; 1280 tokens of buffers take 320 MiB, 256 take 64: 128 slots, the whole loan
    assert _plan(8192, slots=256) == (256, 128)
    assert _plan(2048, max_loan=400) == (1024, 272)          # 256 + 16 MiB: two chunks of 1024, not 1280 + 768
    assert _plan(2048, max_loan=300) == (1024, 272)
    assert _plan(2048, max_loan=271) == (683, 187)
    assert _plan(1280, max_loan=400) is None                  # one chunk: nothing to share
    assert _plan(1281, max_loan=400) == (641, 171)


def test_the_cache_must_keep_a_whole_layer():
    assert _plan(2048, max_loan=400, slots=400) == (1024, 272)
    assert _plan(2048, max_loan=400, slots=399) == (683, 187)      # 399 - 272 < 128
    assert _plan(2048, max_loan=400, slots=200) is None        # 8 chunks of 256 keep 120 slots; 9 go below 256


def test_an_owned_region_borrows_nothing():
    assert _plan(2048, owned=400 * MIB) == (1024, 0)
    assert _plan(2048, owned=200 * MIB) == (683, 0)
    assert _plan(2048, owned=10 * MIB) is None
    assert _plan(2048, owned=400 * MIB, slots=127) is None


def test_equal_chunks_off_the_grid():
    assert _plan(4000, chunk=1000, max_loan=1000) == (1000, 282)
    assert _plan(4000, chunk=1000, max_loan=270) == (800, 232)     # 4 of 1000 do not fit, 5 of 800 do
    assert _plan(8192, max_loan=357, slots=485) == (1171, 357)     # 7 chunks where 1280 does not fit
    assert _plan(8192, max_loan=356, slots=485) == (1024, 320)
    assert _plan(40, chunk=16, max_loan=10, per_token=1024) == (14, 1)    # below GRID: the first equal size only
    assert _plan(40, chunk=16, max_loan=0, per_token=1024) is None


def test_victims_empty_then_run_layers_earliest_first_then_later_layers_farthest_first():
    own = [2, -1, 0, 5, 1, 3, 2, 0, 7, -1]
    assert victims(own, 3, (3,)).tolist() == [1, 9, 2, 7, 4, 0, 6, 8, 3]
    assert victims(own, 3, (3, 4, 5)).tolist() == [1, 9, 2, 7, 4, 0, 6, 8]
    assert victims(own, 0, (0,)).tolist() == [1, 9, 8, 3, 5, 0, 6, 4]
    assert victims([], 2, (2,)).size == 0
    assert isinstance(victims(np.zeros(4, np.int64), 0, (0,)), np.ndarray)


def test_victims_of_run_layers_come_in_the_order_they_free():
    own = [0, 0, 1, 1, 4, -1]
    ready = [9, 3, 7, 1, 0, 0]
    assert victims(own, 2, (2,), ready).tolist() == [5, 3, 1, 2, 0, 4]
    assert victims(own, 2, (2,)).tolist() == [5, 0, 1, 2, 3, 4]
