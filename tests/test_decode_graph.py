"""The decode graph (strata/accel/decode_graph.py, SPEC §8): one captured step per token, routing on the device,
misses read from the arena. Oracle: the per-layer decode path of the same engine (itself held to the reference by
test_accel_engine.py), on the host twin (CI) and on CUDA (`gpu`). The two paths sum in different orders (a GEMV
per row against a tiled GEMM, online attention against cuBLAS), so they are held to a tolerance, not bits:
per-token KL <= 1e-3 and the same greedy token where the top two logits are not within 1e-3.
"""

import numpy as np
import pytest

from strata import models, policy
from strata.reference import golden
from tests.test_accel_engine import _devices, kl, make_device, top1_agreement


def _decode(m, kind, graph: bool, cache, n: int = 12):
    from strata.accel.engine import GpuEngine

    dev = make_device(kind)
    try:
        e = GpuEngine(m, dev, n_ctx=64, expert_cache=cache, config=policy.Config(decode_graph=graph))
        seen = []
        first = e.prefill(list(range(30, 50)))
        e.on_routing = lambda layer, ids: seen.append((layer, ids.copy()))      # decode's routing only
        out = [e.decode([t]) for t in range(60, 60 + n)]
        return first, np.concatenate(out), e, seen
    finally:
        dev.close()


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", ["strata-tiny", "tiny-qwen2moe"])
def test_graph_matches_the_per_layer_path(kind, name):
    m = models.load(golden.model_path(name))
    half = m.cfg.n_layer * m.cfg.n_expert // 2
    p_first, per_layer, _, p_seen = _decode(m, kind, False, half)
    g_first, graph, eng, g_seen = _decode(m, kind, True, half)
    assert np.array_equal(p_first, g_first)                     # the prompt path does not change
    assert eng.dgraph is not None and eng.dgraph.graph.launches == len(graph)      # captured once, replayed
    assert max(kl(per_layer, graph)) <= 1e-3
    agree, _ = top1_agreement(per_layer, graph)
    assert agree == 1.0
    # the routing read back per token equals the per-layer path's routing syncs (same router, same inputs)
    assert len(g_seen) == len(p_seen) == m.cfg.n_layer * len(graph)
    same = np.mean([np.array_equal(a[1], b[1]) for a, b in zip(p_seen, g_seen)])
    assert same >= 0.95
    assert 0 < eng.stats.hits < eng.stats.lookups                # half cached: some hits, some misses


@pytest.mark.parametrize("kind", _devices())
def test_graph_sees_residency_changes(kind):
    """The device residency table follows the cache: after a prompt lends slots and their refills land, the next
    token's hits count them; the bits never depend on it."""
    m = models.load(golden.model_path("strata-tiny"))
    _, full, e_full, _ = _decode(m, kind, True, None)
    _, none, e_none, _ = _decode(m, kind, True, 0)
    assert np.array_equal(full.view(np.uint32), none.view(np.uint32))
    assert e_full.stats.hits == e_full.stats.lookups and e_none.stats.hits == 0
    assert e_full.dgraph.version == e_full.cache.version


def test_rows_too_long_for_the_graph_fall_back_to_the_per_layer_path():
    from strata.accel.device.host import HostDevice
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path("strata-tiny"))
    dev = HostDevice()
    dev.k.moe_gemv_max_k = m.cfg.n_embd - 32                  # as CUDA's shared memory would bound it
    lines = []
    try:
        e = GpuEngine(m, dev, n_ctx=32, log=lines.append)
        e.prefill([1, 2, 3])
        e.decode([4])
    finally:
        dev.close()
    assert e.dgraph is None and any("decode: per layer (expert rows of" in x for x in lines)
    assert e.stats.decode_tokens == 1
