"""The decode graph's down GEMV computing SwiGLU as it stages its input (moe_gemv's glu) against the `swiglu`
kernel followed by the fp16-input GEMV: the same bits, on every golden model's down type, from the cache and the
arena, on the host twin (CI) and on CUDA (`gpu`)."""

import numpy as np
import pytest

from strata import models, quants
from strata.reference import golden
from tests.test_accel_engine import _devices, make_device
from tests.test_gpu_decode_kernels import _source, distinct_layers


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_glu_staging_gives_swiglus_bits(kind, name):
    from strata.accel.arena import Arena

    m = models.load(golden.model_path(name))
    cfg = m.cfg
    D, F, K, E = cfg.n_embd, cfg.n_ff_exp, cfg.n_expert_used, cfg.n_expert
    dev = make_device(kind)
    try:
        arena = Arena(m, dev)
        rng = np.random.default_rng(11)
        for layer, types in distinct_layers(arena):
            ids = dev.asarray(rng.choice(E, K, replace=False).astype(np.int32))
            gu = dev.asarray((rng.standard_normal((K, 2 * F)) * 2).astype(np.float32))
            off = (quants.get(types[0]).row_bytes(D) + quants.get(types[1]).row_bytes(D)) * F
            src = _source(dev, arena, layer, list(range(0, E, 2)))
            hh = dev.zeros((K, F), np.float16)
            two, one = dev.zeros((K, D), np.float32), dev.zeros((K, D), np.float32)
            dev.k.swiglu(hh, gu, F, dev.compute)
            dev.k.moe_gemv(two, hh, 1, ids, src, off, types[2], D, F, dev.compute)
            dev.k.moe_gemv(one, gu, 1, ids, src, off, types[2], D, F, dev.compute, glu=True)
            dev.synchronize()
            a, b = dev.tohost(two), dev.tohost(one)
            assert np.abs(a).max() > 0
            assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"layer {layer}: glu staging changed the bits"
    finally:
        dev.close()
