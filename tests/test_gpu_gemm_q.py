"""The quantised grouped GEMM (`gemm_q`, cuda/gemm_q_kernels.cu) against the pair it replaces on CUDA, `dequant`
into an fp16 scratch then `gemm_grouped`: the same bits (the same fp16 weights, the same MMAs in the same k order),
for every type it takes, both tilings (64- and 128-row tiles), blobs at a 16-byte boundary and off it, rows whose
last super-step of 256 weights is partial, and an output column slice (`gpu`)."""

import numpy as np
import pytest

from strata import quants
from strata.accel.gpu import dequant as dq
from tests.test_gpu_kernels import devs  # noqa: F401 - the fixture
from tests.test_gpu_rows_kernels import _ref

pytestmark = pytest.mark.gpu

ROWS = [1, 17, 63, 64, 65, 100, 127, 128]     # rows an expert: warps end inside an m16 block, between, or idle


def _tiles(rows: list[int], bm: int) -> np.ndarray:
    starts = np.cumsum([0] + rows)
    return np.array([(g, r, min(r + bm, starts[g + 1])) for g in range(len(rows))
                     for r in range(starts[g], starts[g + 1], bm)], np.int32)


def _shapes(cls) -> tuple[tuple[int, int], ...]:
    """(N, K): K 256-weight super-steps whole, and (below 256-weight blocks) a partial last one."""
    if cls.block_size == 256:
        return (200, 512), (136, 256)
    return (200, 2 * cls.block_size), (136, 5 * cls.block_size)


@pytest.mark.parametrize("qtype", sorted(dq.GEMM_Q_TYPES))
def test_gemm_q_gives_the_scratch_path_bits(devs, qtype):
    c, _ = devs
    assert qtype in c.k.gemm_q_types
    cls = quants.get(qtype)
    rng = np.random.default_rng(qtype)
    G, R = len(ROWS), sum(ROWS)
    for N, K in _shapes(cls):
        nbytes = N * cls.row_bytes(K)
        raw = cls.random_blocks(rng, G * nbytes // cls.type_size, 1.0 / np.sqrt(K)).reshape(G, nbytes)
        a = c.asarray((rng.standard_normal((R, K)) / 4).astype(np.float16))
        cases = [(0, raw), (6, raw)]                         # 6: every row's blocks off a 16-byte boundary
        if cls.name == "Q4_K":         # its aligned fast path keeps finite scales; an inf d takes the exact one
            bad = raw.copy()
            bad[1, 2 * cls.type_size:2 * cls.type_size + 2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
            cases.append((0, bad))
        for off, blob in cases:
            buf = c.zeros((G, nbytes + 64), np.uint8)
            buf[:, off:off + nbytes] = c.asarray(blob)
            tab = c.k.upload(c.k.blob_table([_ref(buf, g) for g in range(G)], off), c.compute)
            w = c.zeros((G, N, K), np.float16)
            c.k.dequant(w, tab, qtype, N, K, c.compute)
            for bm in (64, 128):
                t = _tiles(ROWS, bm)
                tiles = c.k.upload(t, c.compute)
                want = c.zeros((R, N), np.float32) + np.float32(np.nan)
                c.k.gemm_grouped(want, a, w, tiles, len(t), c.compute, bm)
                got = c.zeros((R, N + 8), np.float32)
                c.k.gemm_q(got[:, 4:4 + N], a, tab, qtype, N, K, tiles, len(t), c.compute, bm)
                want, got = c.tohost(want), c.tohost(got)
                assert np.isfinite(want).all() == (blob is raw), "non-finite sums only from the inf scale"
                assert not got[:, :4].any() and not got[:, 4 + N:].any(), "writes outside the column slice"
                assert np.array_equal(got[:, 4:4 + N].view(np.uint32), want.view(np.uint32)), \
                    f"{cls.name} N {N} K {K} offset {off} {bm}-row tiles: bits differ from dequant + gemm_grouped"
