"""Each CUDA kernel against the host twin's numpy kernel on random inputs (`gpu`: run on the lent H200).
Tolerances: both sides round matrix inputs to fp16 and accumulate in fp32 in different orders, so products agree
to ~1e-3 relative; elementwise kernels to a few fp32 ulps (exp, rsqrt)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def devs():
    from strata.accel.device.cuda import CudaDevice
    from strata.accel.device.host import HostDevice

    c, h = CudaDevice(), HostDevice()
    yield c, h
    c.close()
    h.close()


def run_both(devs, name, make_args, out_index=0):
    """make_args(xp_asarray) -> args; runs kernel `name` on both devices; returns (cuda_out, host_out)."""
    c, h = devs
    rng_state = np.random.default_rng(0)
    host_args = make_args(lambda a: np.array(a), rng_state)
    cuda_args = [c.asarray(a) if isinstance(a, np.ndarray) else a for a in host_args]
    getattr(h.k, name)(*host_args, stream=h.compute)
    getattr(c.k, name)(*cuda_args, stream=c.compute)
    c.synchronize()
    return c.tohost(cuda_args[out_index]), host_args[out_index]


def close(a, b, rel):
    scale = max(1e-6, float(np.abs(b).max()))
    err = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) / scale
    assert err <= rel, f"max error {err:.2e} of scale {scale:.3g} exceeds {rel:.0e}"


@pytest.mark.parametrize("K", [256, 96])
@pytest.mark.parametrize("kind,big", [("mma", False), ("mma", True), ("simt", True)])
def test_gemm_grouped(devs, kind, big, K, monkeypatch):
    """big: tiles of up to 128 rows (gemm_grouped_mma128 on "mma"), else of up to 64 (gemm_grouped_mma). K 96: the
    mma kernels' k step (64) ends past the rows' last half."""
    c, _ = devs
    monkeypatch.setattr(c.k, "gemm_kind", kind)
    R, N, G = 300, 200, 3
    rng = np.random.default_rng(1)
    a = rng.standard_normal((R, K)).astype(np.float16)
    w = (rng.standard_normal((G, N, K)) / 16).astype(np.float16)
    tiles = np.array([(0, 0, 64), (0, 64, 100), (2, 100, 164), (2, 164, 170), (1, 200, 264), (1, 264, 300)],
                     np.int32)
    if big:                        # one tile of 100 rows, one of 70 (a warp's rows end inside an m16 block)
        tiles = np.array([(0, 0, 100), (2, 100, 170), (1, 200, 300)], np.int32)
    out_h = np.full((R, N), np.nan, np.float32)
    _, hdev = devs
    hdev.k.gemm_grouped(out_h, a, w, tiles, len(tiles), hdev.compute)
    out_c = c.zeros((R, N), np.float32) + np.float32(np.nan)
    c.k.gemm_grouped(out_c, c.asarray(a), c.asarray(w), c.k.upload(tiles, c.compute), len(tiles), c.compute,
                     100 if big else 64)
    got = c.tohost(out_c)
    rows = np.r_[0:170, 200:300]
    close(got[rows], out_h[rows], 1e-3)
    assert np.isnan(got[170:200]).all(), "rows outside every tile must be untouched"


def test_gemm_residency_invariance(devs):
    """The same expert's rows give the same bits whether it is alone in a launch or grouped with others."""
    c, _ = devs
    rng = np.random.default_rng(2)
    a = c.asarray(rng.standard_normal((128, 256)).astype(np.float16))
    w = c.asarray((rng.standard_normal((4, 192, 256)) / 16).astype(np.float16))
    o1 = c.zeros((128, 192), np.float32)
    o2 = c.zeros((128, 192), np.float32)
    t1 = np.array([(2, 10, 74), (2, 74, 90)], np.int32)
    t2 = np.array([(0, 0, 10), (2, 10, 74), (2, 74, 90), (3, 90, 128)], np.int32)
    c.k.gemm_grouped(o1, a, w, c.k.upload(t1, c.compute), 2, c.compute)
    c.k.gemm_grouped(o2, a, w, c.k.upload(t2, c.compute), 4, c.compute)
    assert np.array_equal(c.tohost(o1)[10:90], c.tohost(o2)[10:90])


@pytest.mark.parametrize("seed", [3, 4])
def test_gemm_mma128_gives_mma_bits(devs, seed):
    """gemm_grouped_mma128 over tiles of up to 128 rows gives gemm_grouped_mma's bits over the same rows cut into
    64-row tiles (the same MMAs in the same k order), so which one gemm_grouped picks never changes the arithmetic.
    Rows 1..128 a tile: warps end inside an m16 block, between blocks, or hold no rows; Kd 768 and 2048 as qwen3's,
    96 and 32 not multiples of the k step."""
    c, _ = devs
    rng = np.random.default_rng(seed)
    for N, K in ((1536, 2048), (2048, 768), (200, 256), (200, 96), (136, 32)):
        rows = [1, 17, 63, 64, 65, 100, 127, 128]
        R, G = sum(rows), len(rows)
        a = c.asarray(rng.standard_normal((R, K)).astype(np.float16))
        w = c.asarray((rng.standard_normal((G, N, K)) / 16).astype(np.float16))
        starts = np.cumsum([0] + rows)
        big = np.array([(g, starts[g], starts[g + 1]) for g in range(G)], np.int32)
        small = np.array([(g, r, min(r + 64, starts[g + 1])) for g in range(G)
                          for r in range(starts[g], starts[g + 1], 64)], np.int32)
        outs = []
        for t, most in ((big, 128), (small, 64)):           # the 128-row kernel, then the 64-row one
            o = c.zeros((R, N), np.float32) + np.float32(np.nan)
            c.k.gemm_grouped(o, a, w, c.k.upload(t, c.compute), len(t), c.compute, most)
            outs.append(c.tohost(o))
        assert not np.isnan(outs[0]).any()
        assert np.array_equal(outs[0], outs[1]), f"N {N} K {K}: the two kernels' bits differ"


def test_gather_swiglu_combine(devs):
    def gather(asarray, rng):
        x = rng.standard_normal((7, 64)).astype(np.float32)
        return [np.zeros((12, 64), np.float16), x, rng.integers(0, 7, 12).astype(np.int32)]

    cu, ho = run_both(devs, "gather_f16", gather)
    assert np.array_equal(cu, ho)

    def swiglu(asarray, rng):
        return [np.zeros((9, 40), np.float16), rng.standard_normal((9, 80)).astype(np.float32) * 3, 40]

    cu, ho = run_both(devs, "swiglu", swiglu)
    close(cu.astype(np.float32), ho.astype(np.float32), 2e-3)

    def combine(asarray, rng):
        return [np.zeros((5, 32), np.float32), rng.standard_normal((10, 32)).astype(np.float32),
                rng.permutation(10).reshape(5, 2).astype(np.int32), rng.random((5, 2)).astype(np.float32)]

    def combine_wide(asarray, rng):          # rows wider than one block's 256 columns, the last block partial
        return [np.zeros((3, 600), np.float32), rng.standard_normal((9, 600)).astype(np.float32),
                rng.permutation(9).reshape(3, 3).astype(np.int32), rng.random((3, 3)).astype(np.float32)]

    for make in (combine, combine_wide):
        cu, ho = run_both(devs, "combine", make)
        close(cu, ho, 1e-6)

    def add(asarray, rng):                   # a block's residual add: one IEEE f32 sum an element, the bits
        return [np.zeros((37, 300), np.float32), rng.standard_normal((37, 300)).astype(np.float32),
                (rng.standard_normal((37, 300)) * 1e-3).astype(np.float32)]

    cu, ho = run_both(devs, "add", add)
    assert np.array_equal(cu.view(np.uint32), ho.view(np.uint32)) and np.abs(cu).max() > 0


@pytest.mark.parametrize("T, K, E, skew", [(900, 8, 128, True), (3, 8, 128, False), (1280, 10, 512, False),
                                           (70, 2, 8, True)])
def test_route_tables(devs, T, K, E, skew):
    """route_hist and route_rows: the same integer tables as the host twin's (which test_row_layout holds to the
    loop), across tiles, with experts a warp's lanes share (skew) and models of many experts."""
    from strata.accel.gpu.kernels import ROUTE_TILE
    from strata.accel.moe import placement, row_order

    c, h = devs
    rng = np.random.default_rng(T)
    p = np.r_[np.full(4, 0.2), np.full(E - 4, 0.2 / (E - 4))] if skew else None
    ids = np.stack([rng.choice(E, K, replace=False, p=p) for _ in range(T)]).astype(np.int32)
    P, nt = T * K, -(-T * K // ROUTE_TILE)
    cnt = np.bincount(ids.ravel(), minlength=E)
    resident = rng.random(E) < 0.3
    off = row_order(cnt, placement(cnt, resident, [])).off.astype(np.int32)
    outs = []
    for d in (c, h):
        hist = d.zeros((nt + 1, E), np.int32)
        slot, src = d.zeros((P + 5,), np.int32), d.zeros((P + 5,), np.int32)
        d_ids = d.asarray(ids)
        d.k.route_hist(hist, d_ids, P, d.compute)
        d.k.route_rows(slot, src, d_ids, d.asarray(off), hist, P, K, d.compute)
        d.synchronize()
        outs.append([d.tohost(a) if d is c else np.array(a) for a in (hist, slot, src)])
    (ch, cs, cr), (hh, hs, hr) = outs
    assert np.array_equal(ch[:nt], hh[:nt]) and np.array_equal(ch[:nt].sum(0), cnt)
    assert np.array_equal(cs, hs) and np.array_equal(cr, hr)
    assert sorted(cs[:P].tolist()) == list(range(P))


def test_sigmoid_gate(devs):
    """One kernel, the bits of the CuPy expression it replaced (s · 1 / (1 + exp(-g)))."""
    c, _ = devs
    rng = np.random.default_rng(5)

    def gate(asarray, rng):
        return [np.zeros((4, 300), np.float32), rng.standard_normal((4, 300)).astype(np.float32),
                rng.standard_normal((4, 1)).astype(np.float32) * 4]

    cu, ho = run_both(devs, "sigmoid_gate", gate)
    close(cu, ho, 1e-6)
    s = c.asarray(rng.standard_normal((4, 300)).astype(np.float32))
    g = c.asarray(rng.standard_normal((4, 1)).astype(np.float32))
    out = c.zeros((4, 300), np.float32)
    c.k.sigmoid_gate(out, s, g, c.compute)
    c.synchronize()
    assert np.array_equal(c.tohost(out), c.tohost(s * (1.0 / (1.0 + c.cp.exp(-g)))))


def test_rms_norm_rope_kv(devs):
    def norm(asarray, rng):
        return [np.zeros((6, 3, 64), np.float32), rng.standard_normal((6, 3, 64)).astype(np.float32),
                rng.standard_normal(64).astype(np.float32), 1e-6]

    cu, ho = run_both(devs, "rms_norm", norm)
    close(cu, ho, 1e-5)
    from strata.mathfn import rope_table

    cos, sin = rope_table(32, 48, 1e4)
    for neox in (True, False):
        def rope(asarray, rng, neox=neox):
            return [rng.standard_normal((5, 3, 64)).astype(np.float32), cos, sin,
                    np.array([0, 3, 7, 8, 31], np.int32), 48, neox]

        cu, ho = run_both(devs, "rope", rope)
        close(cu, ho, 1e-5)


def test_router(devs):
    def router(asarray, rng):
        logits = rng.standard_normal((9, 128)).astype(np.float32) * 3
        logits[0, [5, 9]] = 10.0                                   # an exact tie: the lower id first
        return [np.zeros((9, 8), np.int32), np.zeros((9, 8), np.float32), logits, 8, False]

    c, h = devs
    rng = np.random.default_rng(3)
    args = router(None, rng)
    cargs = [c.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
    h.k.router(*args, stream=h.compute)
    c.k.router(*cargs, stream=c.compute)
    assert np.array_equal(c.tohost(cargs[0]), args[0])
    assert args[0][0, 0] == 5 and args[0][0, 1] == 9
    close(c.tohost(cargs[1]), args[1], 1e-5)


# head sizes 64 and 128 take the one-pass kernel (several row and key blocks from T = 150; g = 1 and 4), 96 the
# cuBLAS blocks; the tolerance covers where each rounds the probabilities to fp16
@pytest.mark.parametrize("pos0,T,hd,Hkv", [(0, 9, 64, 2), (5, 3, 64, 2), (11, 1, 64, 2), (0, 150, 128, 2),
                                           (40, 150, 128, 8), (70, 65, 64, 2), (3, 70, 96, 2)])
def test_attention(devs, pos0, T, hd, Hkv):
    c, h = devs
    rng = np.random.default_rng(4)
    H, S = 8, pos0 + T + 5
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    kc = rng.standard_normal((S, Hkv, hd)).astype(np.float16)
    vc = rng.standard_normal((S, Hkv, hd)).astype(np.float16)
    out_h = np.zeros((T, H * hd), np.float32)
    h.k.attention(out_h, q, kc, vc, pos0, None, h.compute)
    out_c = c.zeros((T, H * hd), np.float32)
    scratch = c.empty((1 << 20,), np.uint8)
    c.k.attention(out_c, c.asarray(q), c.asarray(kc), c.asarray(vc), pos0, scratch, c.compute)
    close(c.tohost(out_c), out_h, 3e-3)
    small = c.empty((H * (hd * 6 + (pos0 + T) * 6) + 1024,), np.uint8)   # one query per block
    out_s = c.zeros((T, H * hd), np.float32)
    c.k.attention(out_s, c.asarray(q), c.asarray(kc), c.asarray(vc), pos0, small, c.compute)
    close(c.tohost(out_s), out_h, 3e-3)


# g = H / Hkv of 1, 4 and 8 (qwen3's); blocks of 128 rows ending inside a warp's rows or a query's heads; keys
# ending inside and at the end of a 32-key half; contexts of one step and of many
@pytest.mark.parametrize("pos0,T,hd,H,Hkv", [(0, 9, 64, 8, 2), (0, 150, 128, 8, 2), (40, 150, 128, 8, 8),
                                             (70, 65, 64, 8, 2), (0, 300, 128, 32, 4), (1000, 77, 128, 32, 4),
                                             (95, 33, 64, 4, 4), (0, 1, 128, 32, 4)])
def test_attention_w32_gives_the_16_row_bits(devs, pos0, T, hd, H, Hkv, monkeypatch):
    """flash_attention_w32 (32 query rows a warp, 128 a block) against flash_attention (16 a warp, 64 a block):
    the same bits, so prompt and decode keep one arithmetic whichever runs."""
    c, _ = devs
    rng = np.random.default_rng(pos0 + T + hd)
    S = pos0 + T + 3
    q = c.asarray((rng.standard_normal((T, H, hd)) * 2).astype(np.float32))
    kc = c.asarray(rng.standard_normal((S, Hkv, hd)).astype(np.float16))
    vc = c.asarray(rng.standard_normal((S, Hkv, hd)).astype(np.float16))
    outs = []
    for rows in (64, 128):
        monkeypatch.setattr(c.k, "attn_rows", rows)
        out = c.zeros((T, H * hd), np.float32) + np.float32(np.nan)
        c.k.attention(out, q, kc, vc, pos0, None, c.compute)
        outs.append(c.tohost(out))
    assert np.isfinite(outs[1]).all(), "a row the 128-row blocks leave unwritten"
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("T", [13, 3, 1])       # cuBLAS, and the decode GEMV (T <= 8)
@pytest.mark.parametrize("K", [96, 100, 2056])  # the GEMV's 8-wide loads (K % 8 == 0) and its scalar path
def test_linear(devs, T, K):
    c, h = devs
    rng = np.random.default_rng(5)
    x = rng.standard_normal((T, K)).astype(np.float32)
    for wdt in (np.float16, np.float32):
        w = (rng.standard_normal((40, K)) / 8).astype(wdt)
        oh = np.zeros((T, 80), np.float32)
        h.k.linear(oh[:, :40], x, w, h.compute)     # (K = 96: 8-wide loads; 100: scalar; 2056: both)
        oc = c.zeros((T, 80), np.float32)
        c.k.linear(oc[:, :40], c.asarray(x), c.asarray(w), c.compute)
        close(c.tohost(oc)[:, :40], oh[:, :40], 2e-3)
        assert not c.tohost(oc)[:, 40:].any(), "writes past the column slice"


@pytest.mark.parametrize("T,H,Hkv,hd,n_rot,neox", [(1, 32, 4, 128, 128, True), (3, 8, 2, 64, 32, False),
                                                  (5, 4, 4, 256, 256, True), (300, 32, 4, 128, 128, True),
                                                  (7, 5, 2, 80, 64, False), (2, 3, 1, 512, 512, True),
                                                  (1025, 3, 1, 64, 64, False), (1100, 3, 1, 512, 512, True),
                                                  (1030, 3, 1, 80, 64, False), (64, 2, 1, 2048, 64, True),
                                                  (2, 1, 1, 4096, 64, False), (1, 1, 1, 5120, 64, True)])
def test_norm_rope_gives_rms_norm_then_rope_bits(devs, T, H, Hkv, hd, n_rot, neox):
    """norm_rope (one launch) against rms_norm then rope on each of q and k: the same bits, on CUDA. Both kernels: a
    block a head (fewer than cuda_kernels.NR_MANY heads) and a warp a head (from NR_MANY; 1,025 tokens of 4 heads
    leave the last block half empty), head sizes up to and past block_sum's 256 threads. The block kernel's norm is
    rms_norm's loop, so the head sizes of a hidden row (2,048: rms_norm's registers; 4,096 and 5,120: its loop) hold
    rms_norm's register form to the loop's bits too."""
    c, _ = devs
    rng = np.random.default_rng(hd + T)
    q, k = (rng.standard_normal((T, n, hd)).astype(np.float32) * 3 for n in (H, Hkv))
    wq, wk = (rng.standard_normal(hd).astype(np.float32) for _ in range(2))
    cos, sin = (rng.standard_normal((7 + T, n_rot // 2)).astype(np.float32) for _ in range(2))
    pos = np.arange(7, 7 + T, dtype=np.int32)
    d = {n: c.asarray(a) for n, a in dict(q=q, k=k, wq=wq, wk=wk, cos=cos, sin=sin, pos=pos).items()}
    two = [c.zeros(q.shape, np.float32), c.zeros(k.shape, np.float32)]
    for o, x, w in zip(two, (d["q"], d["k"]), (d["wq"], d["wk"])):
        c.k.rms_norm(o, x, w, 1e-6, c.compute)
        c.k.rope(o, d["cos"], d["sin"], d["pos"], n_rot, neox, c.compute)
    one = [c.zeros(q.shape, np.float32), c.zeros(k.shape, np.float32)]
    c.k.norm_rope(one[0], one[1], d["q"], d["k"], d["wq"], d["wk"], 1e-6, d["cos"], d["sin"], d["pos"], n_rot, neox,
                  c.compute)
    c.synchronize()
    for a, b in zip(two, one):
        a, b = c.tohost(a), c.tohost(b)
        assert np.abs(a).max() > 0
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"max |diff| {np.abs(a - b).max():.3g}"
