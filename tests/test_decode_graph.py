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
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("name", golden.golden_models())
def test_one_gemv_for_q_k_v_gives_the_bits_of_three(kind, graph, name):
    """A token's q|k|v come from one GEMV over the layer's concatenated matrix (DenseWeights.qkv): each row is the
    same dot product as in its own GEMV, so the logits keep their bits; and the fused GEMV did run."""
    c = models.load(golden.model_path(name)).cfg
    outs, calls = _fused_or_not(kind, graph, name, "fuse_qkv", "linear", lambda out, x, w, *a: w.shape[0])
    assert np.array_equal(outs[0][1].view(np.uint32), outs[1][1].view(np.uint32))
    n_qkv = c.n_q + 2 * c.n_kv
    assert calls[0].count(n_qkv) == 0 and calls[1].count(n_qkv) >= c.n_layer   # per token, or once (the capture)


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_a_prompts_qkv_from_one_fp16_input_keep_the_bits(kind, name):
    """A prompt's q, k and v come from one call (Kernels.linear_many: CUDA rounds the normed input to fp16 once
    for the three GEMMs): the prompt's logits keep their bits, and each layer made that call once."""
    c = models.load(golden.model_path(name)).cfg
    outs, calls = _fused_or_not(kind, False, name, "fuse_qkv", "linear_many", lambda outs, x, ws, *a: len(ws))
    assert np.array_equal(outs[0][0].view(np.uint32), outs[1][0].view(np.uint32))
    assert calls[0] == [] and calls[1] == [3] * c.n_layer


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("graph", [True, False])
@pytest.mark.parametrize("name", ["strata-tiny", "tiny-qwen3moe"])
def test_qk_norm_and_rope_in_one_kernel_keep_the_bits(kind, graph, name):
    """qwen3's per-head q/k RMSNorm and RoPE in one launch (Kernels.norm_rope) against rms_norm and rope twice
    each: the prompt's and the decode steps' logits keep their bits."""
    c = models.load(golden.model_path(name)).cfg
    outs, calls = _fused_or_not(kind, graph, name, "fuse_norm_rope", "norm_rope", lambda *a: 1)
    for a, b in zip(outs[0], outs[1]):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
    assert len(calls[0]) == 0 and len(calls[1]) >= c.n_layer


def _fused_or_not(kind, graph, name, flag, kernel, what):
    """(prompt logits, decode logits) and the `kernel` calls seen (what(*its arguments) each) with
    DeviceOps.`flag` off, then on."""
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(name))
    outs, seen = [], []
    for fuse in (False, True):
        dev = make_device(kind)
        try:
            e = GpuEngine(m, dev, n_ctx=64, config=policy.Config(decode_graph=graph))
            setattr(e.ops, flag, fuse)
            calls = []
            fn = getattr(dev.k, kernel)
            setattr(dev.k, kernel, lambda *a, **kw: (calls.append(what(*a)), fn(*a, **kw))[1])
            first = e.prefill(list(range(30, 50)), all_logits=True)
            if e.dgraph is not None:
                setattr(e.dgraph.ops, flag, fuse)
                e.dgraph.graph = None
            outs.append((first, np.concatenate([e.decode([t]) for t in range(60, 66)])))
            seen.append(calls)
        finally:
            dev.close()
    return outs, seen


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", ["strata-tiny", "tiny-mixtral"])
def test_swiglu_in_the_down_gemv_keeps_the_graphs_bits(kind, name):
    """The graph's down GEMV computes SwiGLU while staging its rows (DecodeGraph.fuse_glu): the logits of a
    half-cached engine keep their bits against the swiglu launch it replaces."""
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path(name))
    outs = []
    for fuse in (False, True):
        dev = make_device(kind)
        try:
            e = GpuEngine(m, dev, n_ctx=64, expert_cache=m.cfg.n_layer * m.cfg.n_expert // 2)
            e.prefill(list(range(30, 50)))
            e.decode([59])
            e.dgraph.fuse_glu, e.dgraph.graph = fuse, None
            outs.append(np.concatenate([e.decode([t]) for t in range(60, 66)]))
        finally:
            dev.close()
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("kind", _devices())
def test_the_device_residency_table_follows_the_cache(kind):
    """A residency change between tokens (an adaptive-tier move: evict one expert, load another into its slot)
    reaches the device's table before the next launch; the bits stay those of an engine that holds every expert
    (a stale table would send the victim's tokens to its old slot, which now holds the newcomer)."""
    from strata.accel.engine import GpuEngine
    from strata.policy.tier import Move

    m = models.load(golden.model_path("strata-tiny"))
    E = m.cfg.n_expert
    outs = []
    for cache in (None, m.cfg.n_layer * E // 2):
        dev = make_device(kind)
        try:
            e = GpuEngine(m, dev, n_ctx=64, expert_cache=cache)
            e.prefill(list(range(30, 50)))
            out = [e.decode([60])]
            if cache is not None:
                res = e.cache.resident(0)
                victim, newcomer = int(np.flatnonzero(res)[0]), int(np.flatnonzero(~res)[0])
                slot = int(e.cache.slot_of[0, victim])
                ev = dev.event()
                ev.record(dev.compute)
                assert e.cache.apply_moves([Move(0, newcomer, victim, 1.0)], e.arena, ev) == 1
                dev.synchronize()
            out += [e.decode([t]) for t in range(61, 66)]           # decode() polls: the newcomer lands
            outs.append(np.concatenate(out))
            if cache is not None:
                assert e.cache.slot_of[0, victim] == -1 and e.cache.slot_of[0, newcomer] == slot
                assert e.dgraph.version == e.cache.version
                assert np.array_equal(dev.tohost(e.dgraph.table), e.cache.slot_of)
        finally:
            dev.close()
    assert np.array_equal(outs[0].view(np.uint32), outs[1].view(np.uint32))


@pytest.mark.parametrize("graph", [True, False])
def test_decode_past_the_context_is_refused(graph):
    from strata.accel.device.host import HostDevice
    from strata.accel.engine import GpuEngine
    from strata.reference.engine import ContextOverflow

    m = models.load(golden.model_path("strata-tiny"))
    dev = HostDevice()
    try:
        e = GpuEngine(m, dev, n_ctx=8, config=policy.Config(decode_graph=graph))
        e.prefill(list(range(1, 7)))
        e.decode([7, 8] if not graph else [7])
        with pytest.raises(ContextOverflow, match="do not fit the context of 8"):
            e.decode([9, 10])
        if graph:
            e.decode([9])
            with pytest.raises(ContextOverflow, match="9 tokens do not fit the context of 8"):
                e.decode([10])
    finally:
        dev.close()


@pytest.mark.parametrize("what", ["rows", "heads"])
def test_what_the_graph_does_not_take_falls_back_to_the_per_layer_path(what):
    """Expert rows longer than moe_gemv takes (CUDA: its shared memory), or heads attn_decode is not built for
    (CUDA: over 256 or not 8k): decode runs per layer, and the start says why."""
    from strata.accel.device.host import HostDevice
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path("strata-tiny"))
    dev = HostDevice()
    if what == "rows":
        dev.k.moe_gemv_max_k = m.cfg.n_embd - 32
        said = "decode: per layer (expert rows of"
    else:
        dev.k.attn_decode_takes = lambda hd: hd != m.cfg.head_dim
        said = f"decode: per layer (heads of {m.cfg.head_dim}"
    lines = []
    try:
        e = GpuEngine(m, dev, n_ctx=32, log=lines.append)
        e.prefill([1, 2, 3])
        e.decode([4])
    finally:
        dev.close()
    assert e.dgraph is None and any(said in x for x in lines)
    assert e.stats.decode_tokens == 1


def test_per_layer_decode_steps_take_the_decode_attention():
    """A one-query step of the per-layer path goes through attn_decode (split over the keys on CUDA), a prompt
    chunk through the prompt kernel: counted on the host twin, whose two kernels give the same numbers."""
    from strata.accel.device.host import HostDevice
    from strata.accel.engine import GpuEngine

    m = models.load(golden.model_path("strata-tiny"))
    dev = HostDevice()
    calls = {"attention": 0, "attn_decode": 0}
    attention = dev.k.attention

    def counted_attention(*a, **kw):
        calls["attention"] += 1
        return attention(*a, **kw)

    def counted_decode(out, q, kc, vc, pos, scratch, stream):      # the host twin's attn_decode, counted apart
        calls["attn_decode"] += 1
        return attention(out, q, kc, vc, int(pos[0]), scratch, stream)

    dev.k.attention, dev.k.attn_decode = counted_attention, counted_decode
    try:
        e = GpuEngine(m, dev, n_ctx=32, config=policy.Config(decode_graph=False))
        e.prefill([1, 2, 3])
        prompt = dict(calls)
        e.decode([4])
        e.decode([5])
    finally:
        dev.close()
    L = m.cfg.n_layer
    assert prompt == {"attention": L, "attn_decode": 0}
    assert calls == {"attention": L, "attn_decode": 2 * L}


@pytest.mark.parametrize("h,hkv,group", [(32, 4, 8), (20, 4, 5), (64, 4, 8), (16, 16, 1), (24, 2, 6), (28, 2, 7),
                                         (18, 1, 6)])
def test_attn_decode_blocks_take_a_divisor_of_the_heads_sharing_a_kv_head(h, hkv, group):
    """CUDA's attn_decode gives a block the query heads of one kv head, at most 8: the largest such divisor, so
    no block straddles two kv heads (qwen3 8, flash-shape's 5, olmoe's 1)."""
    from strata.accel.gpu.cuda_decode import AD_MAXG, query_group

    g = query_group(h, hkv)
    assert g == group and (h // hkv) % g == 0 and g <= AD_MAXG
