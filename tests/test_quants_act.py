"""Activation quantisers: ggml's quantize_row_q8_0_ref / q8_1_ref / q8_K_ref on hand-computed rows
(rounding ties, zero rows, one huge value), invariants under hypothesis, and the float activation types."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import strata.quants as Q
from strata.quants import act

F16_ONE = [0x00, 0x3C]  # fp16 1.0, little-endian


def row(vals, n):
    x = np.zeros((1, n), np.float32)
    x[0, : len(vals)] = vals
    return x


def test_q8_0_ties_round_away_from_zero():
    # amax 127 -> d = 1.0 exactly, id = 1.0: roundf sends halves away from zero (2.5 -> 3, -0.5 -> -1)
    x = row([127, 2.5, -2.5, 0.5, -0.5, 1.5, np.float32(0.49999997), -127], 32)
    out = Q.quantize_act(x, 8)
    assert out.shape == (1, 34)
    assert out[0, :2].tolist() == F16_ONE
    assert out[0, 2:10].view(np.int8).tolist() == [127, 3, -3, 1, -1, 2, 0, -127]


def test_q8_1_sum_field():
    # as Q8_0, plus s = fp16(float(Σ qs)·d) = 127 + 3 - 3 + 1 - 1 + 2 + 0 - 127 = 2
    x = row([127, 2.5, -2.5, 0.5, -0.5, 1.5, np.float32(0.49999997), -127], 32)
    out = Q.quantize_act(x, 9)
    assert out.shape == (1, 36)
    assert out[0, :2].tolist() == F16_ONE and out[0, 2:4].view(np.float16)[0] == 2.0
    assert out[0, 4:12].view(np.int8).tolist() == [127, 3, -3, 1, -1, 2, 0, -127]


def test_q8_0_one_huge_value():
    # d = f32(1000/127) = 7.8740158 (fp16 7.875), id = f32(1/d) = 0.127: 4·id = 0.508 -> 1, -3.9·id = -0.495 -> 0;
    # the code uses the float32 id, not the fp16 d
    x = row([1000, 4.0, -3.9, 1.0], 32)
    out = Q.quantize_act(x, 8)
    assert out[0, :2].view(np.float16)[0] == np.float16(7.875)
    assert out[0, 2:6].view(np.int8).tolist() == [127, 1, 0, 0]
    # a value beyond fp16's range leaves d = inf in the block, as ggml's GGML_FP32_TO_FP16 does
    big = Q.quantize_act(row([1e30, 1.0], 32), 8)
    assert np.isinf(big[0, :2].view(np.float16)[0]) and big[0, 2:4].view(np.int8).tolist() == [127, 0]


@pytest.mark.parametrize("qt,size", [(8, 34), (9, 36), (15, 292)])
def test_zero_rows(qt, size):
    k = 256
    out = Q.quantize_act(np.zeros((2, k), np.float32), qt)
    assert out.shape == (2, k // Q.get(qt).block_size * size) and not out.any()


def test_q8_k_ties_to_even_and_first_max():
    # the first largest |x| is x[0] = -127 (x[1] = +127 ties but comes later): iscale = -127/-127 = 1, d = 1.
    # nearest_int rounds halves to even: 2.5 -> 2, -2.5 -> -2, 0.5 -> 0, 1.5 -> 2, 3.5 -> 4
    x = row([-127, 127, 2.5, -2.5, 0.5, 1.5, 3.5], 256)
    out = Q.quantize_act(x, 15)
    d, qs, bsums = act.unpack_q8_k(out)
    assert d[0] == 1.0
    assert qs[0, :7].tolist() == [-127, 127, 2, -2, 0, 2, 4] and not qs[0, 7:].any()
    assert bsums[0].tolist() == [6] + [0] * 15
    # positive max: iscale = -127/127 = -1, d = -1, codes change sign
    d, qs, _ = act.unpack_q8_k(Q.quantize_act(row([127, 2.5], 256), 15))
    assert d[0] == -1.0 and qs[0, :2].tolist() == [-127, -2]


def test_q8_k_one_huge_value():
    # iscale = -127/1e6 = -1.27e-4: 3000·iscale = -0.381 -> 0, -4000·iscale = 0.508 -> 1; d = 1/iscale
    x = row([1e6, 3000, -4000], 256)
    d, qs, _ = act.unpack_q8_k(Q.quantize_act(x, 15))
    iscale = np.float32(-127) / np.float32(1e6)
    assert d[0] == np.float32(1) / iscale and qs[0, :3].tolist() == [-127, 0, 1]


# zeros or |x| in [2^-6, 1e4]: keeps fp16 d normal (d >= 2^-6/127), where the half-step bound holds
finite = st.one_of(st.just(0.0), st.floats(0.015625, 1e4, width=32), st.floats(-1e4, -0.015625, width=32))


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, (2, 256), elements=finite))
def test_act_invariants(x):
    # every code within ±127, bsums/s consistent, and each value within half a step of d·q
    for qt in (8, 9, 15):
        out = Q.quantize_act(x, qt)
        cls = Q.get(qt)
        blocks = out.reshape(-1, cls.type_size)
        y = cls.dequantize(blocks).reshape(x.shape).astype(np.float64)
        if qt == 15:
            d, qs, bsums = act.unpack_q8_k(blocks)
            assert np.array_equal(bsums, qs.reshape(-1, 16, 16).astype(np.int32).sum(axis=2))
            step = np.repeat(np.abs(d.astype(np.float64)), 256)
        else:
            d, qs = (act.unpack_q8_0 if qt == 8 else lambda b: act.unpack_q8_1(b)[::2])(blocks)
            step = np.repeat(np.abs(d.astype(np.float64)), 32)  # fp16 d: codes were chosen with the f32 d
        assert np.abs(qs.astype(np.int32)).max() <= 127
        err = np.abs(y.reshape(-1) - x.reshape(-1).astype(np.float64))
        assert np.all(err <= 0.5 * step * (1 + 2e-3) + 128 * step * 1e-3), (qt, err.max())


def test_float_activation_types():
    x = np.array([[1.0, np.float32(1 / 3), -2.5e-8, 70000.0]], np.float32)
    assert np.array_equal(Q.quantize_act(x, 0).view(np.float32), x)
    with np.errstate(over="ignore"):
        assert np.array_equal(Q.quantize_act(x, 1).view(np.float16), x.astype(np.float16))  # 70000 -> inf
    bf = Q.quantize_act(x, 30).view(np.uint16)
    assert bf[0, 0] == 0x3F80 and bf[0, 1] == 0x3EAB  # 1/3 = 0x3EAAAAAB rounds up to 0x3EAB
    with pytest.raises(Q.UnsupportedQuantType, match="not an activation"):
        Q.quantize_act(x, 12)
