"""The router kernel's renormalisation (qwen3moe, mixtral: w / Σ_k w) against the reference's arithmetic, bit for
bit, on the host twin (CI) and on CUDA (`gpu`): the sum in k order from +0.0, then IEEE division (RefOps.renorm).
The decode graph runs it inside the top-k kernel, where two CuPy ops (a sum, a divide) ran after it in every layer."""

import numpy as np
import pytest

from strata.reference.ops import RefOps


def _device(kind):
    if kind == "host":
        from strata.accel.device.host import HostDevice

        return HostDevice()
    from strata.accel.device.cuda import CudaDevice

    return CudaDevice()


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("E,K", [(128, 8), (8, 2), (60, 4)])
def test_router_renorm_is_the_references_renorm(kind, E, K):
    dev = _device(kind)
    try:
        rng = np.random.default_rng(E + K)
        logits = (rng.standard_normal((33, E)) * 3).astype(np.float32)
        logits[0, [1, 4]] = 9.0                                          # a tie: the lower id first, both taken
        got = {}
        for renorm in (False, True):
            ids, w = dev.asarray(np.zeros((33, K), np.int32)), dev.asarray(np.zeros((33, K), np.float32))
            dev.k.router(ids, w, dev.asarray(logits), K, renorm, dev.compute)
            dev.synchronize()
            got[renorm] = dev.tohost(ids), dev.tohost(w)
        assert np.array_equal(got[False][0], got[True][0]), "renormalising changed the routed ids"
        want = RefOps.renorm(None, got[False][1])
        assert np.array_equal(got[True][1], want), \
            f"max |diff| {np.abs(got[True][1] - want).max():.3g}: not the reference's k-order sum and division"
        assert got[True][0][0, 0] == 1 and got[True][0][0, 1] == 4
    finally:
        dev.close()
