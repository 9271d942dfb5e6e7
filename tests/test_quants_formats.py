"""Quant formats: registry, dequantisation (oracle: gguf.quants, bit for bit), hand-built blocks, edge blocks,
encoders' round trip, random_blocks. Activation formats and dots live in test_quants_act.py / _dot.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import strata.quants as Q
from strata.quants import iq_grids as G
from strata.quants.testing import assert_bits_equal, diff_report

GT = gguf.GGMLQuantizationType
WEIGHT_TYPES = [c for c in Q.registered() if c.weight]
GGUF_DEQUANT = [c for c in WEIGHT_TYPES if c.name != "Q2_0"]  # gguf 0.19 has no Q2_0
REQUIRED = [
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ3_XXS",
    "IQ3_S",
    "Q2_0",
    "IQ2_S",
    "IQ1_S",
    "IQ1_M",
    "MXFP4",
]
# vec_dot_type per weight type, transcribed from ggml-cpu.c `type_traits_cpu`
VEC_DOT = {
    "F32": "F32",
    "F16": "F16",
    "BF16": "BF16",
    "Q4_0": "Q8_0",
    "Q4_1": "Q8_1",
    "Q5_0": "Q8_0",
    "Q5_1": "Q8_1",
    "Q8_0": "Q8_0",
    "MXFP4": "Q8_0",
    "Q2_0": "Q8_0",
    "IQ4_NL": "Q8_0",
    **{
        n: "Q8_K"
        for n in [
            "Q2_K",
            "Q3_K",
            "Q4_K",
            "Q5_K",
            "Q6_K",
            "IQ2_XXS",
            "IQ2_XS",
            "IQ2_S",
            "IQ3_XXS",
            "IQ3_S",
            "IQ1_S",
            "IQ1_M",
            "IQ4_XS",
        ]
    },
}
ids = lambda c: c.name  # noqa: E731


def gguf_dequant(cls, blocks):
    if cls.name in ("F32", "F16"):
        return blocks.view(np.float32 if cls.name == "F32" else np.float16).astype(np.float32)
    return np.asarray(gguf.quants.dequantize(blocks, GT(cls.qtype)), np.float32).reshape(blocks.shape[0], -1)


def test_registry_matches_ggml():
    names = {c.name for c in Q.registered()}
    assert set(REQUIRED) | {"Q8_1", "Q8_K"} == names
    for c in Q.registered():
        if c.name == "Q2_0":
            assert (c.block_size, c.type_size) == (64, 18)
        elif c.name == "Q8_1":  # gguf 0.19's table says (32, 40), a stale float d/s layout; ggml-common.h
            assert (c.block_size, c.type_size) == (32, 2 + 2 + 32)  # static_asserts 2·sizeof(ggml_half) + 32
        else:
            assert (c.block_size, c.type_size) == gguf.GGML_QUANT_SIZES[GT[c.name]], c.name
            assert c.qtype == GT[c.name].value
        if c.weight:
            assert Q.get(c.vec_dot_type).name == VEC_DOT[c.name], c.name
    with pytest.raises(Q.UnsupportedQuantType, match="TQ1_0"):
        Q.get(GT.TQ1_0)


def edge_blocks(cls) -> np.ndarray:
    """Byte patterns 00/FF/55/AA (all-zero, max codes, alternating) with finite extreme scales written over
    the fp16 scale fields: 0, 1, -1, the largest fp16 (65504) and the smallest subnormal (2^-24)."""
    pats = [np.full((1, cls.type_size), p, np.uint8) for p in (0x00, 0xFF, 0x55, 0xAA)]
    offs = {
        "Q2_K": (80, 82),
        "Q3_K": (108,),
        "Q6_K": (208,),
        "Q4_K": (0, 2),
        "Q5_K": (0, 2),
        "Q4_1": (0, 2),
        "Q5_1": (0, 2),
    }.get(cls.name, (0,))
    out = []
    for p in pats:
        for h in (0.0, 1.0, -1.0, 65504.0, 2.0**-24):
            b = p.copy()
            if cls.name == "MXFP4":
                b[:, 0] = {0.0: 0, 1.0: 127, -1.0: 1, 65504.0: 254, 2.0**-24: 2}[h]
            elif cls.name == "IQ1_M":  # d's nibbles are the top nibbles of the four u16 scales
                bits = int(np.float16(h).view(np.uint16))
                sc = b[:, 48:56].view(np.uint16) & 0x0FFF
                b[:, 48:56] = (sc | ((bits >> np.array([0, 4, 8, 12])) & 0xF).astype(np.uint16) << 12).view(
                    np.uint8
                )
            elif cls.block_size > 1:
                for o in offs:
                    b[:, o : o + 2] = np.float16(h).reshape(1, 1).view(np.uint8)
            out.append(b)
    return np.concatenate(out)


@pytest.mark.parametrize("cls", GGUF_DEQUANT, ids=ids)
def test_dequantize_equals_gguf(cls):
    rng = np.random.default_rng(cls.qtype)
    x = rng.standard_normal((16, cls.block_size * (4 if cls.block_size > 1 else 64))).astype(np.float32)
    blocks = np.concatenate(
        [
            cls.random_blocks(rng, 64, 0.5),
            cls.quantize(x.reshape(-1, cls.block_size)),
            cls.quantize(np.zeros((2, cls.block_size), np.float32)),
        ]
        + ([edge_blocks(cls)] if cls.block_size > 1 else [])
    )
    with np.errstate(all="ignore"):  # edge scales overflow to inf on purpose
        assert_bits_equal(
            cls.dequantize(blocks), gguf_dequant(cls, blocks), cls.block_size, f"{cls.name} dequant"
        )


def test_q2_0_dequantize_by_hand_formula():
    # Q2_0 is not in gguf 0.19: check against the C loop of dequantize_row_q2_0 written out per weight
    cls = Q.get(42)
    blocks = np.concatenate([cls.random_blocks(np.random.default_rng(0), 8, 1.0), edge_blocks(cls)])
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]
    ref = np.array(
        [
            [np.float32((int(b[2 + j // 4]) >> (2 * (j % 4)) & 3) - 1) * d[i] for j in range(64)]
            for i, b in enumerate(blocks)
        ],
        np.float32,
    )
    with np.errstate(all="ignore"):
        assert_bits_equal(cls.dequantize(blocks), ref, 64, "Q2_0 dequant")


def _blk(*parts) -> np.ndarray:
    """Concatenate byte parts (bytes / fp16 values / uint arrays) into one block [1, S]."""
    out = []
    for p in parts:
        if isinstance(p, float):
            out.append(np.float16(p).reshape(1).view(np.uint8))
        else:
            out.append(np.asarray(p).reshape(-1).view(np.uint8))
    return np.concatenate(out).reshape(1, -1)


def _u8(v, n):
    return np.full(n, v, np.uint8)


HAND = {
    # Q4_0: d = 0.5, every byte 0x9F: low nibble 15 -> (15-8)·0.5 = 3.5 (weights 0..15), high 9 -> 0.5
    "Q4_0": (_blk(0.5, _u8(0x9F, 16)), [3.5] * 16 + [0.5] * 16),
    # Q4_1: d = 0.25, m = -1, bytes 0x30: low 0 -> -1.0, high 3 -> 3·0.25 - 1 = -0.25
    "Q4_1": (_blk(0.25, -1.0, _u8(0x30, 16)), [-1.0] * 16 + [-0.25] * 16),
    # Q5_0: d = 1, qh bits 0 and 16 set, qs 0: weights 0 and 16 are (16 - 16) = 0, the rest (0 - 16) = -16
    "Q5_0": (
        _blk(1.0, np.array([0x00010001], np.uint32), _u8(0, 16)),
        [0.0] + [-16.0] * 15 + [0.0] + [-16.0] * 15,
    ),
    # Q5_1: d = 2, m = 1, qh bit 31 only, qs 0xFF: 15·2 + 1 = 31 everywhere, weight 31 is (15|16)·2 + 1 = 63
    "Q5_1": (_blk(2.0, 1.0, np.array([0x80000000], np.uint32), _u8(0xFF, 16)), [31.0] * 31 + [63.0]),
    # Q8_0: d = 0.125, qs = -128, -1, 0, 1, 127, then 0s
    "Q8_0": (
        _blk(0.125, np.array([-128, -1, 0, 1, 127] + [0] * 27, np.int8)),
        [-16, -0.125, 0, 0.125, 15.875] + [0] * 27,
    ),
    # Q2_K: every scale byte 0x21 (scale 1, min 2), d = 1, dmin = 0.5; qs bytes 0xE4 hold codes 0,1,2,3 at shifts
    # 0,2,4,6, so weight 128n + 32j + m has code j and value 1·j - 0.5·2 = j - 1
    "Q2_K": (
        _blk(_u8(0x21, 16), _u8(0xE4, 64), 1.0, 0.5),
        ([-1.0] * 32 + [0.0] * 32 + [1.0] * 32 + [2.0] * 32) * 2,
    ),
    # Q3_K: all 16 scales 33 (-> 1): low nibbles 1 (bytes 0..7 = 0x11), high bits 2 (bytes 8..11 = 0xAA); d = 1;
    # qs 0xE4 -> low code j; hmask 0x0F sets bits 0..3 (n = 0: no -4), clears bits 4..7 (n = 1: -4)
    "Q3_K": (
        _blk(_u8(0x0F, 32), _u8(0xE4, 64), _u8(0x11, 8), _u8(0xAA, 4), 1.0),
        [0.0] * 32
        + [1.0] * 32
        + [2.0] * 32
        + [3.0] * 32
        + [-4.0] * 32
        + [-3.0] * 32
        + [-2.0] * 32
        + [-1.0] * 32,
    ),
    # Q4_K: d = 1, dmin = 0.5; scales 1..8 (bytes 0-3 = 1,2,3,4 and low nibbles of 8-11 = 5..8), mins 0 except
    # m0 = 2 (byte 4); qs 0x21: code 1 in even sub-blocks, 2 in odd ones -> s=0: 1·1 - 1 = 0, s=1: 2·2 = 4, ...
    "Q4_K": (
        _blk(1.0, 0.5, np.array([1, 2, 3, 4, 2, 0, 0, 0, 5, 6, 7, 8], np.uint8), _u8(0x21, 128)),
        sum(
            ([float((s + 1) * (1 if s % 2 == 0 else 2) - (1.0 if s == 0 else 0.0))] * 32 for s in range(8)),
            [],
        ),
    ),
    # Q5_K: same scales/mins, qh 0x01 (bit 0 -> +16 in sub-block 0 only), qs 0: s=0: 1·16 - 1 = 15, others 0
    "Q5_K": (
        _blk(1.0, 0.5, np.array([1, 2, 3, 4, 2, 0, 0, 0, 5, 6, 7, 8], np.uint8), _u8(1, 32), _u8(0, 128)),
        [15.0] * 32 + [0.0] * 224,
    ),
    # Q6_K: ql = qh = 0 -> q = -32; scales s - 8; d = 0.5 -> 0.5·(s - 8)·(-32) = -16·(s - 8) per 16 weights
    "Q6_K": (
        _blk(_u8(0, 128), _u8(0, 64), np.arange(-8, 8, dtype=np.int8), 0.5),
        sum(([-16.0 * (s - 8)] * 16 for s in range(16)), []),
    ),
    # IQ4_NL: d = 1, bytes 0x80: low nibble 0 -> -127, high nibble 8 -> 1
    "IQ4_NL": (_blk(1.0, _u8(0x80, 16)), [-127.0] * 16 + [1.0] * 16),
    # IQ4_XS: d = 1; scales_l[0] = 0x21 and scales_h = 0b10 -> ls0 = 1 | 2 << 4 = 33 (-> 1), ls1 = 2 (-> -30),
    # others 0 (-> -32); qs 0x88 -> kvalue 1 everywhere: weights = the sub-block scales
    "IQ4_XS": (
        _blk(1.0, np.array([0b10], np.uint16), np.array([0x21, 0, 0, 0], np.uint8), _u8(0x88, 128)),
        [1.0] * 32 + [-30.0] * 32 + [-32.0] * 192,
    ),
    # MXFP4: e = 128 -> 2^0 = 1; bytes 0x7F: low nibble 15 -> -12, high nibble 7 -> 12
    "MXFP4": (
        np.concatenate([[128], _u8(0x7F, 16)]).astype(np.uint8).reshape(1, -1),
        [-12.0] * 16 + [12.0] * 16,
    ),
    # Q2_0: d = 2, bytes 0xE4 = codes 0,1,2,3 (LSB first) -> -2, 0, 2, 4 repeated
    "Q2_0": (_blk(2.0, _u8(0xE4, 16)), [-2.0, 0.0, 2.0, 4.0] * 16),
    # IQ2_XXS: d = 1; sub-block 0: grid rows 0,1,2,3, ksigns index 1 (0x81: weights 0 and 7 negative), ls 3 ->
    # db = (0.5 + 3)·0.25 = 0.875. iq2xxs_grid[0] = 8s, [1] = 0x080808080808082b (byte 0 = 43), [2] =
    # 0x0808080808081919 (bytes 0,1 = 25), [3] = 0x0808080808082b08 (byte 1 = 43). Other sub-blocks all zero bytes.
    "IQ2_XXS": (
        _blk(1.0, np.array([0, 1, 2, 3], np.uint8), np.array([1 | 3 << 28], np.uint32), _u8(0, 56)),
        [-7.0]
        + [7.0] * 6
        + [-7.0]
        + [37.625]
        + [7.0] * 7
        + [21.875] * 2
        + [7.0] * 6
        + [7.0, 37.625]
        + [7.0] * 6
        + [1.0] * 224,
    ),  # sub-blocks 1..7: row 0 (8s), no signs, ls 0 -> 8·0.125
    # IQ2_XS: d = 1; qs[0] = row 1 | ksigns 1 << 9; scales[0] = 0x21 -> ls 1 for weights 0..15, 2 for 16..31:
    # db = (0.5 + 1)·0.25 = 0.375, (0.5 + 2)·0.25 = 0.625; iq2xs_grid[1] = 43, then 8s; ksigns[1] = 0x81
    # (weights 0, 7 negative); the rest row 0 (8s) unsigned; other sub-blocks ls 0 -> 0.125·8 = 1
    "IQ2_XS": (
        _blk(1.0, np.array([1 | 1 << 9] + [0] * 31, np.uint16), np.array([0x21] + [0] * 7, np.uint8)),
        [-16.125] + [3.0] * 6 + [-3.0] + [3.0] * 8 + [5.0] * 16 + [1.0] * 224,
    ),
    # IQ2_S: d = 1; qs[0] = 1 (row 1: 43 then 8s), sign byte 0 = 0x02 (weight 1 negative), scales 0 -> db 0.125
    "IQ2_S": (
        _blk(1.0, np.array([1] + [0] * 31, np.uint8), np.array([2] + [0] * 31, np.uint8), _u8(0, 16)),
        [5.375, -1.0] + [1.0] * 254,
    ),
    # IQ3_XXS: d = 1; all rows 0 (iq3xxs_grid[0] = 4s); aux[0] = ksigns 1 | ls 1 << 28 -> db = (0.5 + 1)·0.5 =
    # 0.75, weights 0 and 7 negative; other sub-blocks ls 0 -> db 0.25 -> 1
    "IQ3_XXS": (
        _blk(1.0, _u8(0, 64), np.array([1 | 1 << 28] + [0] * 7, np.uint32)),
        [-3.0] + [3.0] * 6 + [-3.0] + [3.0] * 24 + [1.0] * 224,
    ),
    # IQ3_S: d = 1; rows 0 (iq3s_grid[0] = 1s); scales[0] = 0x01 -> db = 1·(1 + 2·1) = 3 for weights 0..31, 1
    # elsewhere; signs[0] = 0x01 -> weight 0 negative
    "IQ3_S": (
        _blk(
            1.0, _u8(0, 64), _u8(0, 8), np.array([1] + [0] * 31, np.uint8), np.array([1, 0, 0, 0], np.uint8)
        ),
        [-3.0] + [3.0] * 31 + [1.0] * 224,
    ),
    # IQ1_S: d = 1; rows 0 (iq1s_grid[0] = all -1); qh[0] = 0x8000 | 1 << 12 -> ls 2·1 + 1 = 3, delta -0.125:
    # 3·(-1 - 0.125) = -3.375; other sub-blocks ls 1, delta +0.125: -0.875
    "IQ1_S": (
        _blk(1.0, _u8(0, 32), np.array([0x8000 | 1 << 12] + [0] * 7, np.uint16)),
        [-3.375] * 32 + [-0.875] * 224,
    ),
    # IQ1_M: d = 1.0 = fp16 0x3C00 spread over the top nibbles of sc[2] (0xC) and sc[3] (0x3); rows 0 (all -1);
    # scales 0 -> dl = 1; qh[0] = 0x08 -> group 0 delta -0.125 (-1.125), all others +0.125 (-0.875)
    "IQ1_M": (
        _blk(_u8(0, 32), np.array([0x08] + [0] * 15, np.uint8), np.array([0, 0, 0xC000, 0x3000], np.uint16)),
        [-1.125] * 8 + [-0.875] * 248,
    ),
    # float types: 1.0 and -2.5 as F32 / F16 (0x3C00, 0xC100) / BF16 (0x3F80, 0xC020)
    "F32": (np.array([1.0, -2.5], np.float32).view(np.uint8).reshape(2, 4), [[1.0], [-2.5]]),
    "F16": (np.array([0x3C00, 0xC100], np.uint16).view(np.uint8).reshape(2, 2), [[1.0], [-2.5]]),
    "BF16": (np.array([0x3F80, 0xC020], np.uint16).view(np.uint8).reshape(2, 2), [[1.0], [-2.5]]),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_built_block(name):
    cls = Q.get(GT[name] if name != "Q2_0" else 42)
    blocks, want = HAND[name]
    assert blocks.shape[1] == cls.type_size
    want = np.array(want, np.float32).reshape(blocks.shape[0], -1)
    assert_bits_equal(cls.dequantize(blocks), want, cls.block_size, name)


def test_iq_grids_match_ggml_common_h():
    # first and last entries of each table, copied from ggml-common.h (little-endian bytes of the u64/u32)
    le = lambda v, n: np.frombuffer(int(v).to_bytes(n, "little"), np.uint8)  # noqa: E731
    cases = [
        (G.IQ2XXS_GRID, 0x080808080808082B, 0x2B2B2B1908081908, 8),
        (G.IQ2XS_GRID, 0x080808080808082B, 0x2B2B2B2B2B2B2B2B, 8),
        (G.IQ2S_GRID, 0x080808080808082B, 0x2B2B2B2B2B2B2B2B, 8),
        (G.IQ3XXS_GRID, 0x04040414, 0x3E341C04, 4),
        (G.IQ3S_GRID, 0x01010103, 0x0F0F0101, 4),
    ]
    for grid, second, last, n in cases:
        assert np.array_equal(grid[1], le(second, n)) and np.array_equal(grid[-1], le(last, n))
    assert np.array_equal(G.IQ1S_GRID[1].view(np.uint8), le(0xFFFFFFFFFFFFFF01, 8))
    assert np.array_equal(G.IQ1S_GRID[-1].view(np.uint8), le(0x0101010101010101, 8))  # last of iq1s_grid
    assert bytes(G.KSIGNS) == gguf.quants.IQ2_XXS.ksigns


# relative RMS error of encode -> decode on standard normal rows; ggml's own encoders (golden oracle) do better
# on K/i-quants; the bounds are our measured values + ~20 %, so a broken encoder fails them.
ROUND_TRIP = {
    "F32": 0.0,
    "F16": 3e-4,
    "BF16": 3e-3,
    "Q8_0": 0.007,
    "Q4_0": 0.11,
    "Q4_1": 0.10,
    "Q5_0": 0.055,
    "Q5_1": 0.05,
    "MXFP4": 0.14,
    "Q2_K": 0.40,
    "Q3_K": 0.19,
    "Q4_K": 0.095,
    "Q5_K": 0.05,
    "Q6_K": 0.025,
    "IQ4_NL": 0.095,
    "IQ4_XS": 0.095,
    "IQ2_XXS": 0.43,
    "IQ2_XS": 0.37,
    "IQ2_S": 0.31,
    "IQ3_XXS": 0.225,
    "IQ3_S": 0.17,
    "IQ1_S": 0.72,
    "IQ1_M": 0.60,
    "Q2_0": 0.75,
}


@pytest.mark.parametrize("cls", WEIGHT_TYPES, ids=ids)
def test_encoder_round_trip(cls):
    rng = np.random.default_rng(100 + cls.qtype)
    x = rng.standard_normal((32, 512)).astype(np.float32)
    blocks = Q.quantize_rows(x, cls.qtype)
    assert blocks.shape == (32, cls.row_bytes(512)) and blocks.dtype == np.uint8
    y = Q.dequantize(blocks, cls.qtype, x.shape)
    rel = float(np.sqrt(np.mean((y - x) ** 2) / np.mean(x**2)))
    assert rel <= ROUND_TRIP[cls.name], f"{cls.name}: relative RMS error {rel:.4f} > {ROUND_TRIP[cls.name]}"
    # zero rows encode to zeros, and scaling the input scales the output (no hidden absolute thresholds)
    z = Q.dequantize(Q.quantize_rows(np.zeros((1, 512), np.float32), cls.qtype), cls.qtype, (1, 512))
    assert not np.any(z), f"{cls.name}: zero row decodes to nonzero"
    y4 = Q.dequantize(Q.quantize_rows(4 * x, cls.qtype), cls.qtype, x.shape)
    assert np.sqrt(np.mean((y4 - 4 * x) ** 2) / np.mean((4 * x) ** 2)) <= ROUND_TRIP[cls.name] + 1e-6


def test_q8_0_encoder_is_ggml_reference_as_in_gguf():
    x = np.random.default_rng(5).standard_normal((64, 32)).astype(np.float32)
    x[0] = 0
    x[1, :] = np.arange(32) - 15.5  # halves after scaling exercise roundf
    assert np.array_equal(Q.get(8).quantize(x), gguf.quants.quantize(x, GT.Q8_0))


@pytest.mark.parametrize("cls", WEIGHT_TYPES, ids=ids)
def test_random_blocks_valid(cls):
    rng = np.random.default_rng(7)
    for scale in (1e-3, 0.02, 1.0):
        blocks = cls.random_blocks(rng, 300, scale)
        assert blocks.shape == (300, cls.type_size) and blocks.dtype == np.uint8
        w = cls.dequantize(blocks)
        assert np.isfinite(w).all(), cls.name
        rms = float(np.sqrt(np.mean(w.astype(np.float64) ** 2)))
        # "roughly": fp16 scales, block-to-block spread; MXFP4's scale is a power of two (within sqrt 2)
        assert 0.6 * scale < rms < 1.6 * scale, f"{cls.name}: rms {rms:.3g} for scale {scale}"
    again = cls.random_blocks(np.random.default_rng(11), 50, 0.1)
    assert np.array_equal(again, cls.random_blocks(np.random.default_rng(11), 50, 0.1)), "not deterministic"
    with pytest.raises(ValueError, match="does not fit"):
        cls.random_blocks(rng, 1, 1e40)


def test_dequantize_helper_checks_bytes():
    x = np.random.default_rng(0).standard_normal((4, 128)).astype(np.float32)
    raw = Q.quantize_rows(x, 42)
    assert Q.dequantize(raw, 42, (4, 128)).shape == (4, 128)
    with pytest.raises(ValueError, match="needs 144 bytes"):  # a fork's 128-weight/34-byte "type 42" tensor
        Q.dequantize(np.zeros(4 * 34, np.uint8), 42, (4, 128))
    f16 = x.astype(np.float16)  # GGUFReader hands out typed F16 arrays
    assert np.array_equal(Q.dequantize(f16, 1, x.shape), f16.astype(np.float32))
    with pytest.raises(Q.UnsupportedQuantType):
        Q.dequantize(raw, 34, (4, 128))


def test_diff_report_points_at_the_bad_block():
    a = np.zeros((4, 32), np.float32)
    b = a.copy()
    b[2, 5] = np.float32(1.0)
    rep = diff_report(a, b, 32, "demo")
    assert rep.startswith("demo: 1 of 4 blocks differ") and "worst block 2" in rep and "[69]" in rep
    assert diff_report(a, a.copy(), 32) is None


def test_bf16_encoder_equals_gguf():
    # ggml_compute_fp32_to_bf16: ties to even (0x3F808000 -> 0x3F80, 0x3F818000 -> 0x3F82), NaN made quiet
    bits = np.array([0x3F808000, 0x3F818000, 0x7F800001, 0xFF800000, 0x7F7FFFFF, 0x00000001], np.uint32)
    x = np.concatenate(
        [bits.view(np.float32), np.random.default_rng(2).standard_normal(1000).astype(np.float32)]
    )
    ours = Q.get(30).quantize(x.reshape(-1, 1))
    with np.errstate(all="ignore"):
        ref = gguf.quants.quantize(x.reshape(-1, 1), GT.BF16)
    assert np.array_equal(ours, np.ascontiguousarray(ref).view(np.uint8))
    assert ours[:2].view(np.uint16).ravel().tolist() == [0x3F80, 0x3F82]
