"""The dense weights' load: a quantised matrix goes up as its GGUF bytes and the device dequantises it
(Kernels.dequant_matrix). Oracle: the host's path (strata.quants' float32, rounded to fp16 by numpy), every array
bit for bit, q|k|v's concatenation included. The golden models' dense matrices are Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K and Q6_K."""

import numpy as np
import pytest

from strata import models
from strata.accel.dense import DEVICE_TYPES, DenseWeights, _is_f32, dense_names
from strata.reference import golden
from tests.test_accel_engine import _devices, device_of


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_the_device_dequantises_the_dense_weights_to_the_hosts_bits(kind, name):
    m = models.load(golden.model_path(name))
    on_dev = [x for x in dense_names(m) if not _is_f32(x) and len(m.tensors.info(x).shape) == 2
              and m.tensors.info(x).qtype in DEVICE_TYPES]
    assert on_dev, "no quantised matrix: the test would prove nothing"
    with device_of(kind) as dev:
        want = DenseWeights(m, dev, on_device=False)
        got = DenseWeights(m, dev)
        assert sorted(got.w) == sorted(want.w) and sorted(got.qkv) == sorted(want.qkv)
        assert [p for _, p in got.qkv.values()] == [p for _, p in want.qkv.values()]
        pairs = [(n, got.w[n], want.w[n]) for n in want.w] + [(n, got.qkv[n][0], want.qkv[n][0]) for n in want.qkv]
        for n, a, b in pairs:
            a, b = dev.tohost(a), dev.tohost(b)
            assert a.dtype == b.dtype and a.shape == b.shape, (n, a.dtype, b.dtype, a.shape, b.shape)
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8)), n
