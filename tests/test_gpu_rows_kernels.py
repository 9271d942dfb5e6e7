"""The prompt's few-row expert kernel (`expert_rows`) against the host twin's (`gpu`), on every golden model's
expert types: tiles of 1-8 rows, gate|up into a column slice, the 16-byte and the scalar input loads. Tolerance as
test_gpu_kernels.py (fp16 inputs, fp32 sums in different orders); against itself: the bits, whoever shares the
launch and wherever the blob sits (SPEC §2: residency must not change arithmetic)."""

import numpy as np
import pytest

from strata import models
from strata.reference import golden
from tests.test_gpu_decode_kernels import distinct_layers
from tests.test_gpu_kernels import close, devs  # noqa: F401 - the fixture

pytestmark = pytest.mark.gpu


def _blobs(dev, arena, layer, experts):
    """The experts' blobs copied into a fresh device buffer (a cache's or a ring's slots), in reverse order."""
    nb = arena.layers[layer].shape[1]
    buf = dev.zeros((len(experts), nb), np.uint8)
    for s, e in enumerate(reversed(experts)):
        dev.h2d(buf[s], arena.layers[layer][e], dev.copy)
    dev.synchronize()
    return buf, np.arange(len(experts))[::-1].copy()


@pytest.mark.parametrize("name", golden.golden_models())
def test_expert_rows(devs, name):
    from strata.accel.arena import Arena
    from strata.accel.moe import ROWS_TILE, blob_offsets

    c, h = devs
    m = models.load(golden.model_path(name))
    cfg = m.cfg
    D, F, E = cfg.n_embd, cfg.n_ff_exp, cfg.n_expert
    rng = np.random.default_rng(11)
    ac, ah = Arena(m, c), Arena(m, h)
    for layer, types in distinct_layers(ac):
        offs = blob_offsets(cfg, types)
        experts = rng.choice(E, min(E, 3), replace=False).tolist()
        counts = [1, ROWS_TILE, 5][:len(experts)]
        tiles = np.array([(g, sum(counts[:g]), sum(counts[:g + 1])) for g in range(len(experts))], np.int32)
        R = int(tiles[-1, 2])
        for qt, n, k, off in ((types[0], F, D, offs[0]), (types[1], F, D, offs[1]), (types[2], D, F, offs[2])):
            for pad in (0, 3):                                   # pad 3: odd row stride, the scalar loads
                a = (rng.standard_normal((R, k + pad)) / 4).astype(np.float16)
                outs = []
                for subset in (range(len(experts)), [1]):        # the whole launch, then one tile alone
                    buf, idx = _blobs(c, ac, layer, experts)
                    tab = c.k.upload(c.k.blob_table([_ref(buf, i) for i in idx], off), c.compute)
                    oc = c.zeros((R, n + 8), np.float32)
                    t = tiles[list(subset)]
                    c.k.expert_rows(oc[:, 4:4 + n], c.asarray(a)[:, :k], tab, c.k.upload(t, c.compute), len(t),
                                    qt, n, k, c.compute)
                    got = c.tohost(oc)
                    assert not got[:, :4].any() and not got[:, 4 + n:].any(), "writes outside the column slice"
                    outs.append(got[:, 4:4 + n])
                lo, hi = tiles[1, 1], tiles[1, 2]
                assert np.array_equal(outs[0][lo:hi].view(np.uint32), outs[1][lo:hi].view(np.uint32)), \
                    "the launch's other experts changed the bits"
                hb, hidx = _blobs(h, ah, layer, experts)
                oh = np.zeros((R, n), np.float32)
                h.k.expert_rows(oh, a[:, :k], h.k.blob_table([_ref(hb, i) for i in hidx], off), tiles, len(tiles),
                                qt, n, k, h.compute)
                h.synchronize()
                close(outs[0], oh, 2e-3)


def _ref(buf, i):
    from strata.accel.gpu.kernels import BlobRef

    return BlobRef(buf, int(i))
