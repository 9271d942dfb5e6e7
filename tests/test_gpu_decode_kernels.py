"""The decode graph's CUDA kernels against the host twin's (`gpu`): moe_gemv on every golden model's expert types,
from the cache and from the pinned arena (read over PCIe); attn_decode and kv_store_at at a device-held position.
Tolerance as test_gpu_kernels.py (fp16 inputs, fp32 sums in different orders); cache against arena: the bits."""

import numpy as np
import pytest

from strata import models
from strata.reference import golden
from tests.test_gpu_kernels import close, devs  # noqa: F401 - the fixture

pytestmark = pytest.mark.gpu


def _source(dev, arena, layer, cached):
    from strata.accel.gpu.kernels import ExpertSource

    E, nb = arena.layers[layer].shape
    cache = dev.zeros((len(cached), nb), np.uint8)
    slot_of = np.full(E, -1, np.int32)
    for s, e in enumerate(cached):
        dev.h2d(cache[s], arena.layers[layer][e], dev.copy)
        slot_of[e] = s
    dev.synchronize()
    return ExpertSource(cache, dev.asarray(slot_of), arena.layers[layer])


def distinct_layers(arena):
    """(layer, its expert types) for the first layer of each distinct (gate, up, down) type triple."""
    seen = set()
    for layer, types in enumerate(arena.types):
        if types not in seen:
            seen.add(types)
            yield layer, types


@pytest.mark.parametrize("name", golden.golden_models())
def test_moe_gemv(devs, name):
    from strata import quants
    from strata.accel.arena import Arena

    c, h = devs
    m = models.load(golden.model_path(name))
    cfg = m.cfg
    D, F, K, E = cfg.n_embd, cfg.n_ff_exp, cfg.n_expert_used, cfg.n_expert
    rng = np.random.default_rng(7)
    ac, ah = Arena(m, c), Arena(m, h)
    for layer, types in distinct_layers(ac):
        ids = rng.choice(E, K, replace=False).astype(np.int32)
        x = rng.standard_normal((1, D)).astype(np.float32)
        hh = (rng.standard_normal((K, F)) / 4).astype(np.float16)
        gb = quants.get(types[0]).row_bytes(D) * F
        ub = quants.get(types[1]).row_bytes(D) * F
        mats = [(0, types[0], F, D, x, K), (gb, types[1], F, D, x, K), (gb + ub, types[2], D, F, hh, 1)]
        for off, qt, n, k, xin, div in mats:
            outs = []
            for cached in (list(range(E)), ids[::2].tolist(), []):         # all, half of the routed, none
                src = _source(c, ac, layer, cached)
                oc = c.zeros((K, n + 8), np.float32)
                c.k.moe_gemv(oc[:, :n], c.asarray(xin), div, c.asarray(ids), src, off, qt, n, k, c.compute)
                outs.append(c.tohost(oc))
                assert not outs[-1][:, n:].any(), "writes past the row slice"
            for o in outs[1:]:
                assert np.array_equal(o.view(np.uint32), outs[0].view(np.uint32)), "residency changed the bits"
            oh = np.zeros((K, n), np.float32)
            h.k.moe_gemv(oh, xin, div, ids, _source(h, ah, layer, ids[1::2].tolist()), off, qt, n, k, h.compute)
            close(outs[0][:, :n], oh, 2e-3)


@pytest.mark.parametrize("pos,S,H,Hkv", [(0, 48, 8, 2), (7, 48, 8, 2), (40, 48, 8, 2), (1023, 3000, 8, 2),
                                         (1100, 3000, 8, 2), (2999, 3000, 8, 2), (2999, 3000, 10, 2),
                                         (40, 48, 16, 1), (5000, 6000, 16, 1)])
def test_attn_decode_and_kv_store_at(devs, pos, S, H, Hkv):
    """Positions from one key to the cache's last row, over one to all of the kernel's key parts, the last partly
    filled (CUDA splits a head's keys over parts, the host twin takes them in one pass); 4, 5 and 16 query heads a
    kv head (CUDA's blocks take 4, 5 and 8 of them)."""
    c, h = devs
    rng = np.random.default_rng(8)
    hd = 64
    q = rng.standard_normal((1, H, hd)).astype(np.float32)
    k = rng.standard_normal((1, Hkv, hd)).astype(np.float32)
    v = rng.standard_normal((1, Hkv, hd)).astype(np.float32)
    kc = rng.standard_normal((S, Hkv, hd)).astype(np.float16)
    vc = rng.standard_normal((S, Hkv, hd)).astype(np.float16)
    kh, vh = kc.copy(), vc.copy()
    h.k.kv_store(kh, vh, k, v, pos, h.compute)
    out_h = np.zeros((1, H * hd), np.float32)
    h.k.attention(out_h, q, kh, vh, pos, None, h.compute)
    kd, vd, pd = c.asarray(kc), c.asarray(vc), c.asarray(np.array([pos], np.int32))
    c.k.kv_store_at(kd, vd, c.asarray(k), c.asarray(v), pd, c.compute)
    out_c = c.zeros((1, H * hd), np.float32)
    c.k.attn_decode(out_c, c.asarray(q), kd, vd, pd, c.empty((H, c.k.attn_decode_cols(S, hd)), np.float32),
                    c.compute)
    assert np.array_equal(c.tohost(kd), kh) and np.array_equal(c.tohost(vd), vh)
    close(c.tohost(out_c), out_h, 3e-3)
