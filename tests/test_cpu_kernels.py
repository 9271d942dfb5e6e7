"""The Numba q8-path kernels against the numpy reference (strata/quants), bit for bit (docs/NUMERICS.md).

Oracle: `strata.quants.q8_matmul` (each class's `vec_dot` and float32 block formula) and the reference
activation quantisers; comparisons are on the float32 bit patterns. Fixtures: a hand-built block with a known
answer, random valid blocks (hypothesis: seeds, odd row counts, 1..8 tokens), all-zero blocks, and extreme
blocks (every code byte random, the largest finite scale the format allows).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata import quants
from strata.accel.cpu import kernels as K
from strata.accel.cpu.rows import MAXT
from strata.mathfn import silu32

WEIGHT_TYPES = [c for c in quants.registered() if c.weight]
ACT_TYPES = (0, 1, 30, 8, 9, 15)   # F32, F16, BF16, Q8_0, Q8_1, Q8_K
_SCALE_OFFSETS = {  # fp16 super-scale fields (byte offsets) per type, for the extreme blocks
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82), "Q3_K": (108,),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,),
    "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,), "IQ4_NL": (0,), "IQ4_XS": (0,), "Q2_0": (0,),
}


def _same_bits(got: np.ndarray, ref: np.ndarray, what: str):
    assert got.shape == ref.shape, f"{what}: shape {got.shape} vs {ref.shape}"
    g, r = got.view(np.uint32), ref.view(np.uint32)
    bad = np.argwhere(g != r)
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(f"{what}: {len(bad)} of {g.size} values differ; first at {i}: "
                             f"{got[i]!r} (0x{g[i]:08x}) vs reference {ref[i]!r} (0x{r[i]:08x})")


def _k_for(cls, n_blocks: int) -> int:
    return cls.block_size * n_blocks if cls.block_size > 1 else 32 * n_blocks


def test_known_answer_q8_0():
    """One Q8_0 row of 32 twos (d = 0.5, codes 4) against x = 1..32: Σ 2·k = 1056 (x quantises exactly:
    d_x = 32/127 is not exact, so the answer goes through the reference's own rounding — both must agree and
    land within 1 ulp-ish of 1056)."""
    blk = np.zeros((1, 34), np.uint8)
    blk[0, 0:2] = np.array([0.5], np.float16).view(np.uint8)
    blk[0, 2:] = 4
    x = np.arange(1, 33, dtype=np.float32).reshape(1, 32)
    got = K.q8_matmul(x, blk, 8)
    _same_bits(got, quants.q8_matmul(x, blk, 8), "Q8_0 known answer")
    assert abs(float(got[0, 0]) - 1056.0) < 1.0


@pytest.mark.parametrize("act", ACT_TYPES, ids=lambda t: quants.type_name(t))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 5), log_mag=st.integers(-18, 18),
       pattern=st.sampled_from(["normal", "zero-block", "ties", "spiky"]))
def test_activation_quantisers(act, seed, rows, log_mag, pattern):
    """ggml's reference quantisers (rounding included) and the float vec_dot types' conversions. "ties" rows
    hold a block maximum of ±127 and halves (x.5), so roundf (Q8_0/Q8_1: away from zero) and nearest-even
    (Q8_K) are both exercised on exact ties."""
    rng = np.random.default_rng(seed)
    k = 512
    x = (rng.standard_normal((rows, k)) * 10.0**log_mag).astype(np.float32)
    if pattern == "zero-block":
        x[0, :256] = 0.0
    elif pattern == "ties":
        x = (rng.integers(-254, 255, (rows, k)) / 2).astype(np.float32)
        x[:, ::32] = 127.0
        x[:, 1::256] = -127.0
    elif pattern == "spiky":
        x[:, rng.integers(0, k, 8)] *= 1e4
    ref = quants.quantize_act(x, act)
    got = K.quantize_act(x, act)
    assert got.dtype == np.uint8 and np.array_equal(got, ref), f"{quants.type_name(act)} bytes differ"


def test_half_conversions_exhaustive():
    """All 65536 half bit patterns widen exactly (NaN payloads included); float32 -> half rounds like numpy
    on every half value, every midpoint between neighbours and a random sample."""
    from numba import njit

    from strata.accel.cpu._llvm import half_to_f32
    from strata.accel.cpu.act import f32_to_f16

    widen = njit(lambda h: np.array([half_to_f32(v) for v in h]))
    narrow = njit(lambda x: np.array([f32_to_f16(v) for v in x]))
    h = np.arange(65536, dtype=np.int64)
    _same_bits(widen(h).astype(np.float32), h.astype(np.uint16).view(np.float16).astype(np.float32), "f16->f32")
    finite = h.astype(np.uint16).view(np.float16).astype(np.float32)
    finite = finite[np.isfinite(finite)]
    srt = np.sort(finite)
    mids = ((srt[1:].astype(np.float64) + srt[:-1]) / 2).astype(np.float32)
    rnd = np.random.default_rng(0).standard_normal(200_000).astype(np.float32) * np.float32(3e4)
    xs = np.concatenate([finite, mids, np.nextafter(mids, np.float32(np.inf)), rnd,
                         np.array([65504, 65519.99, 65520, 1e9, np.inf, -np.inf, 6e-8, 3e-8, 2.98e-8], np.float32)])
    assert np.array_equal(narrow(xs).astype(np.uint16), xs.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("cls", WEIGHT_TYPES, ids=lambda c: c.name)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n_rows=st.sampled_from([1, 3, 5, 7, 9]), t=st.integers(1, MAXT),
       n_blocks=st.integers(1, 3), scale=st.sampled_from([1e-3, 0.05, 2.0]))
def test_rows_random_blocks(cls, seed, n_rows, t, n_blocks, scale):
    rng = np.random.default_rng(seed)
    k = _k_for(cls, n_blocks)
    w = cls.random_blocks(rng, n_rows * k // cls.block_size, scale).reshape(n_rows, -1)
    x = (rng.standard_normal((t, k)) * rng.choice([0.01, 1.0, 100.0])).astype(np.float32)
    _same_bits(K.q8_matmul(x, w, cls.qtype), quants.q8_matmul(x, w, cls.qtype), f"{cls.name} random blocks")


@pytest.mark.parametrize("cls", WEIGHT_TYPES, ids=lambda c: c.name)
def test_rows_zero_and_extreme_blocks(cls):
    """All-zero blocks, all-zero activations, and blocks of random code bytes under the largest finite scale
    (MXFP4: the largest exponent that keeps weights finite; floats: ±65504 / ±3e38 values)."""
    rng = np.random.default_rng(7)
    k = _k_for(cls, 2)
    n = 5
    zero = np.zeros((n, cls.row_bytes(k)), np.uint8)
    if cls.name == "IQ1_M":  # d lives in the scales' top nibbles: zero bytes are a zero block too
        pass
    x = rng.standard_normal((3, k)).astype(np.float32)
    _same_bits(K.q8_matmul(x, zero, cls.qtype), quants.q8_matmul(x, zero, cls.qtype), f"{cls.name} zero blocks")
    w = cls.random_blocks(rng, n * k // cls.block_size, 0.05).reshape(n, -1)
    x0 = np.zeros((2, k), np.float32)
    _same_bits(K.q8_matmul(x0, w, cls.qtype), quants.q8_matmul(x0, w, cls.qtype), f"{cls.name} zero activations")
    ext = rng.integers(0, 256, size=(n * k // cls.block_size, cls.type_size), dtype=np.uint8)
    if cls.name in _SCALE_OFFSETS:
        big = np.array([65504.0], np.float16).view(np.uint8)
        for off in _SCALE_OFFSETS[cls.name]:
            ext[:, off:off + 2] = big
    elif cls.name == "IQ1_M":
        sc = ext[:, 48:56].copy().view(np.uint16) & 0x0FFF
        sc |= (np.uint16(0x7BFF) >> np.array([0, 4, 8, 12], np.uint16) & 0xF) << 12
        ext[:, 48:56] = sc.view(np.uint8)
    elif cls.name == "MXFP4":
        ext[:, 0] = 250
    elif cls.name == "F32":
        ext = (rng.choice([-3e38, 3e38, 1.0], size=ext.shape[0])).astype(np.float32).view(np.uint8).reshape(ext.shape)
    else:  # F16, BF16: largest finite values
        ext = cls.quantize(rng.choice([-65504.0, 65504.0], size=(ext.shape[0], 1)).astype(np.float32))
    ext = ext.reshape(n, -1)
    xe = (rng.standard_normal((4, k)) * 1e3).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = quants.q8_matmul(xe, ext, cls.qtype)
    _same_bits(K.q8_matmul(xe, ext, cls.qtype), ref, f"{cls.name} extreme blocks")


_RUN_TYPES = ("Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")


@pytest.mark.parametrize("cls", [c for c in WEIGHT_TYPES if c.name in _RUN_TYPES], ids=lambda c: c.name)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), n_rows=st.sampled_from([1, 3, 5]), n_blocks=st.integers(1, 9),
       pattern=st.sampled_from(["random", "zero", "extreme"]), tokens=st.sampled_from([1, 2, 7, MAXT]))
def test_block_runs(cls, seed, n_rows, n_blocks, pattern, tokens):
    """Runs of four blocks and one run of the 1..3 left (strata/accel/cpu/runs.py), at one token, a few, and a
    full MAXT job (the K-quants' shared-unpack runs): every row length up to 9 blocks, with random, all-zero
    and extreme blocks (random code bytes under the largest finite scale)."""
    rng = np.random.default_rng(seed)
    k = 256 * n_blocks
    if pattern == "random":
        w = cls.random_blocks(rng, n_rows * n_blocks, rng.choice([1e-3, 0.05, 2.0]))
    elif pattern == "zero":
        w = np.zeros((n_rows * n_blocks, cls.type_size), np.uint8)
        w[::2] = cls.random_blocks(rng, len(w[::2]), 0.05).reshape(-1, cls.type_size)
    else:
        w = rng.integers(0, 256, size=(n_rows * n_blocks, cls.type_size), dtype=np.uint8)
        for off in _SCALE_OFFSETS[cls.name]:
            w[:, off:off + 2] = np.array([65504.0], np.float16).view(np.uint8)
    w = w.reshape(n_rows, -1)
    x = (rng.standard_normal((tokens, k)) * rng.choice([0.01, 1.0, 1e3])).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = quants.q8_matmul(x, w, cls.qtype)
    _same_bits(K.q8_matmul(x, w, cls.qtype), ref, f"{cls.name} {tokens} tokens, {pattern} blocks")


@pytest.mark.parametrize("cls", [c for c in WEIGHT_TYPES if c.name in ("Q8_0", "Q4_0", "IQ4_NL")], ids=lambda c: c.name)
@pytest.mark.parametrize("pattern", ["random", "zero", "extreme", "saturated"])
def test_one_token_runs_of_32_weight_blocks(cls, pattern):
    """One token over 32-weight blocks in runs of 8, 4, 2, 1 (strata/accel/cpu/runs32.py): every row length of 1
    to 19 blocks (each tail), with random, all-zero and extreme blocks (random code bytes, the largest scale),
    and saturated ones (every code at its largest against equal activations: |sumi| > 2^13, where the order of
    the three float factors shows in the bits)."""
    rng = np.random.default_rng(23)
    for m in range(1, 20):
        if pattern == "random":
            w = cls.random_blocks(rng, 3 * m, 0.05)
        elif pattern == "zero":
            w = np.zeros((3 * m, cls.type_size), np.uint8)
            w[::2] = cls.random_blocks(rng, len(w[::2]), 0.05).reshape(-1, cls.type_size)
        elif pattern == "extreme":
            w = rng.integers(0, 256, size=(3 * m, cls.type_size), dtype=np.uint8)
            w[:, 0:2] = np.array([65504.0], np.float16).view(np.uint8)
        else:
            w = np.full((3 * m, cls.type_size), 0x7F if cls.name == "Q8_0" else 0xFF, np.uint8)
            w[:, 0:2] = rng.uniform(0.001, 0.1, 3 * m).astype(np.float16).view(np.uint8).reshape(-1, 2)
        w = w.reshape(3, -1)
        x = (rng.standard_normal((1, 32 * m)) * rng.choice([0.01, 1.0, 1e3])).astype(np.float32)
        if pattern == "saturated":
            x = rng.uniform(0.5, 1.0, (1, 32 * m)).astype(np.float32)   # one sign, codes 64..127: odd big sums
        with np.errstate(over="ignore", invalid="ignore"):
            ref = quants.q8_matmul(x, w, cls.qtype)
        _same_bits(K.q8_matmul(x, w, cls.qtype), ref, f"{cls.name} one token, {m} blocks, {pattern}")


@pytest.mark.parametrize("cls", [c for c in WEIGHT_TYPES if c.name in ("Q4_K", "Q5_K", "Q6_K", "IQ2_XS")],
                         ids=lambda c: c.name)
def test_full_job_runs_every_tail(cls):
    """Shared-unpack token runs (runs.run_tokens) for every run tail: rows of 1..9 blocks, against eight distinct
    token rows (the K-quants' full MAXT job) and, for IQ2_XS's groups of 8, 4, 2 and a last single token
    (loops._loop_token_groups), every token count 2..8."""
    rng = np.random.default_rng(17)
    counts = range(2, MAXT + 1) if cls.name == "IQ2_XS" else (MAXT,)
    for n_blocks in range(1, 10):
        w = cls.random_blocks(rng, 3 * n_blocks, 0.05).reshape(3, -1)
        for t in counts:
            x = rng.standard_normal((t, 256 * n_blocks)).astype(np.float32)
            _same_bits(K.q8_matmul(x, w, cls.qtype), quants.q8_matmul(x, w, cls.qtype),
                       f"{cls.name} {t} tokens, {n_blocks} blocks")


@pytest.mark.parametrize("cls", [c for c in WEIGHT_TYPES if c.name in ("Q4_K", "Q8_0", "IQ2_XS", "F16")],
                         ids=lambda c: c.name)
def test_row_ranges_compose(cls):
    """Rows computed in pieces [r0, r1) (as pool tiles do) equal the whole matrix at once."""
    rng = np.random.default_rng(3)
    k, n = _k_for(cls, 2), 11
    w = cls.random_blocks(rng, n * k // cls.block_size, 0.05).reshape(n, -1)
    x = rng.standard_normal((5, k)).astype(np.float32)
    a = K.quantize_act(x, cls.vec_dot_type)
    whole = np.full((5, n), np.nan, np.float32)
    K.rows(w, cls.qtype, 0, n, a, whole)
    parts = np.full((5, n), np.nan, np.float32)
    for r0, r1 in ((0, 1), (1, 4), (4, 4), (4, 10), (10, 11)):
        K.rows(w, cls.qtype, r0, r1, a, parts)
    _same_bits(parts, whole, f"{cls.name} row pieces")


def test_rows_checks_arguments():
    w = quants.get(8).random_blocks(np.random.default_rng(0), 4, 0.1).reshape(2, -1)
    a = K.quantize_act(np.ones((1, 64), np.float32), 8)
    with pytest.raises(ValueError, match="outside"):
        K.rows(w, 8, 0, 3, a, np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="float32"):
        K.rows(w, 8, 0, 2, a, np.zeros((1, 2), np.float64))
    with pytest.raises(quants.UnsupportedQuantType):
        K.rows(w, 15, 0, 2, a, np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match="do not hold"):
        K.q8_matmul(np.ones((1, 96), np.float32), w, 8)


def test_swiglu_matches_reference():
    rng = np.random.default_rng(5)
    g = np.concatenate([rng.standard_normal(4096) * 10, [0.0, -0.0, 800.0, -800.0, 1e-30, 88.7, -745.5]])
    g = g.astype(np.float32).reshape(1, -1)
    u = rng.standard_normal(g.shape).astype(np.float32)
    _same_bits(K.swiglu(g, u), silu32(g) * u, "swiglu")


def test_generic_vector_paths(monkeypatch):
    """The decoders and the block runs (runs.py) have an AVX2 form (pshufb, pmaddubsw, pmaddwd, psignb) and a
    generic-IR form for other CPUs; CI runs on AVX2, so compile the generic form here too and check both give
    the same integers and the same float32 bits."""
    from numba import njit

    from strata.accel.cpu import _vec
    from strata.accel.cpu import decode as Dd
    from strata.accel.cpu import runs as RN
    from strata.accel.cpu import runs32 as R32

    rng = np.random.default_rng(11)
    a = K.quantize_act(rng.standard_normal((1, 256 * 6)).astype(np.float32), 15).reshape(-1)
    dy = np.array([np.frombuffer(a[292 * b:292 * b + 4].tobytes(), np.float32)[0] for b in range(6)], np.float32)
    a0 = K.quantize_act(rng.standard_normal((1, 32 * 10)).astype(np.float32), 8).reshape(-1)    # Q8_0 rows
    dy0 = np.array([np.frombuffer(a0[34 * b:34 * b + 2].tobytes(), np.float16)[0] for b in range(10)], np.float32)
    b32 = {t: quants.get(t).random_blocks(rng, 10, 0.05).reshape(-1) for t in (8, 2, 20)}
    blocks = {t: quants.get(t).random_blocks(rng, 6, 0.05).reshape(-1) for t in (12, 13, 14, 20, 23, 17, 21)}

    def build():
        from strata.accel.cpu._llvm import dot_i16_i8_256

        @njit
        def sums(wq4, wq5, wq6, w_nl, w_xs, w2xs, w3s, a, dy):
            out = np.zeros((6, 4), np.int64)
            sc = np.zeros(512, np.int16)
            aux = np.zeros(16, np.int32)
            for b in range(6):
                Dd.dec_iq4_nl(w_nl, 18 * b, sc, aux)
                out[b, 0] = np.int64(sc.view(np.int8)[:32].astype(np.int64).sum())
                Dd.dec_iq4_xs(w_xs, 136 * b, sc, aux)
                out[b, 1] = np.int64(sc.view(np.int8)[:256].astype(np.int64).sum()) + aux[:8].sum()
                Dd.dec_iq2_xs(w2xs, 74 * b, sc, aux)
                out[b, 2] = dot_i16_i8_256(sc, 0, a, 292 * b + 4)
                Dd.dec_iq3_s(w3s, 110 * b, sc, aux)
                out[b, 3] = dot_i16_i8_256(sc, 0, a, 292 * b + 4)
            f = np.zeros((5, 2), np.float32)       # runs of four blocks, then of two, from a non-zero sum
            z = np.float32(0.5)
            f[0, 0], f[0, 1] = RN.q4_k_x4(wq4, 0, a, 0, dy, 0, z), RN.q4_k_x2(wq4, 144 * 4, a, 292 * 4, dy, 4, z)
            f[1, 0], f[1, 1] = RN.q5_k_x4(wq5, 0, a, 0, dy, 0, z), RN.q5_k_x2(wq5, 176 * 4, a, 292 * 4, dy, 4, z)
            f[2, 0], f[2, 1] = RN.q6_k_x4(wq6, 0, a, 0, dy, 0, z), RN.q6_k_x2(wq6, 210 * 4, a, 292 * 4, dy, 4, z)
            f[3, 0], f[3, 1] = RN.iq2_xs_x4(w2xs, 0, a, 0, dy, 0, z), RN.iq2_xs_x2(w2xs, 74 * 4, a, 292 * 4, dy, 4, z)
            f[4, 0], f[4, 1] = RN.iq3_s_x4(w3s, 0, a, 0, dy, 0, z), RN.iq3_s_x2(w3s, 110 * 4, a, 292 * 4, dy, 4, z)
            return out, f

        @njit
        def sums32(w8, w4, wnl, a0, dy0):   # runs of 32-weight blocks against Q8_0 activations (runs32.py)
            f = np.zeros((3, 2), np.float32)
            z = np.float32(0.5)
            f[0, 0], f[0, 1] = R32.q8_0_x8(w8, 0, a0, 0, dy0, 0, z), R32.q8_0_x2(w8, 34 * 8, a0, 34 * 8, dy0, 8, z)
            f[1, 0], f[1, 1] = R32.q4_0_x8(w4, 0, a0, 0, dy0, 0, z), R32.q4_0_x2(w4, 18 * 8, a0, 34 * 8, dy0, 8, z)
            f[2, 0], f[2, 1] = R32.iq4_nl_x8(wnl, 0, a0, 0, dy0, 0, z), R32.iq4_nl_x1(wnl, 18 * 8, a0, 34 * 8, dy0,
                                                                                    8, z)
            return f

        return (sums(blocks[12], blocks[13], blocks[14], blocks[20], blocks[23], blocks[17], blocks[21], a, dy),
                sums32(b32[8], b32[2], b32[20], a0, dy0))

    native = build()
    monkeypatch.setattr(_vec, "_AVX2", False)
    generic = build()
    assert np.array_equal(native[0][0], generic[0][0])
    for got, want in ((generic[0][1], native[0][1]), (generic[1], native[1])):
        assert np.array_equal(want.view(np.uint32), got.view(np.uint32))
        assert np.all(want != 0.5), "every run added its blocks"
