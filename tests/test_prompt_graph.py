"""A prompt's dense parts as captured segments (strata/accel/prompt_graph.py). Oracles: the same prompt through a
fresh engine, whose first segments run eagerly on the same padded rows (bit for bit, on either device); on the host
twin also the engine without prompt graphs (its numpy products give the same bits on unpadded rows)."""

import numpy as np
import pytest

from strata import models, policy
from strata.accel.buffers import segment_bytes
from strata.accel.device.host import HostDevice
from strata.accel.prompt_graph import BUCKET, GRAPH_ROWS
from strata.reference import golden
from tests.test_accel_engine import _devices, make_device

CHUNK = 64


def _engine(m, dev, graphs=True, **kw):
    from strata.accel.engine import GpuEngine

    kw.setdefault("expert_cache", 0)
    return GpuEngine(m, dev, n_ctx=4 * CHUNK, chunk=CHUNK, config=policy.Config(prompt_graph=graphs, **kw.pop(
        "config", {})), **kw)


def _prompt(m, n, salt):
    return [(7 * i + 3 * salt + 1) % m.cfg.n_vocab for i in range(n)]


def _bits(a):
    return a.view(np.uint32)


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_replayed_segments_give_the_eager_bits(kind, name):
    """Prompts of 40-63 tokens share the 64-row segments: the first runs them eagerly, the second captures them,
    the rest replay. Each replayed prompt's logits are those of the same prompt on a fresh engine (eager, padded
    rows). The replays really ran the graphs: other prompts left other values in the regions."""
    m = models.load(golden.model_path(name))
    lengths = [40, 63, 50, 41, 63]
    dev = make_device(kind)
    try:
        e = _engine(m, dev)
        got = []
        for i, n in enumerate(lengths):
            e.reset()
            got.append(e.prefill(_prompt(m, n, i)))
        pg = e.pgraphs
        want = []
        for i, n in enumerate(lengths):
            fresh = _engine(m, dev)
            want.append(fresh.prefill(_prompt(m, n, i)))
            assert fresh.pgraphs.captures == fresh.pgraphs.replays == 0
    finally:
        dev.close()
    L = m.cfg.n_layer
    assert (pg.eager, pg.captures, pg.replays) == (L, L, L * (len(lengths) - 2))
    assert set(pg.graphs) == {(layer, BUCKET, 0) for layer in range(L)}
    for i, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(_bits(a), _bits(b)), f"prompt {i} ({lengths[i]} tokens)"


@pytest.mark.parametrize("name", golden.golden_models())
def test_padded_segments_keep_the_unpadded_bits_on_the_twin(name):
    """On the host twin, whose products are row by row, padding a chunk to 64 rows changes no bit: prompts of
    several chunks (the last one short) on both walks, graphs against none. The twin's GEMMs pad their rows to
    PAD_ROWS (a BLAS's rows may take other bits with the row count), which a padded segment's rows must match."""
    from strata.accel.gpu.host_kernels import PAD_ROWS
    from strata.accel.prompt_graph import BUCKET

    assert PAD_ROWS % BUCKET == 0
    m = models.load(golden.model_path(name))
    ids = _prompt(m, 2 * CHUNK + 21, 5)
    for stream_min in (None, 0):
        out = {}
        for graphs in (True, False):
            dev = HostDevice()
            try:
                e = _engine(m, dev, graphs, config={"stream_min": stream_min})
                for _ in range(3):                      # eager, capture, replay
                    e.reset()
                    out[graphs] = e.prefill(ids, all_logits=True)       # every real row's logits [T, V]
            finally:
                dev.close()
            if graphs:
                assert {k[1:] for k in e.pgraphs.graphs} == {(64, 0), (64, 64), (64, 128)}
                assert e.pgraphs.replays == 3 * m.cfg.n_layer
        assert out[True].shape == (len(ids), m.cfg.n_vocab)
        assert np.array_equal(_bits(out[True]), _bits(out[False])), f"stream_min {stream_min}"


def test_a_replay_issues_no_dense_op():
    """A replayed prompt's dense parts are graph launches: the model code's calls are answered from the tape, so the
    engine's ops run only the head's norm and product."""
    m = models.load(golden.model_path("tiny-qwen3moe"))
    dev = HostDevice()
    try:
        e = _engine(m, dev)
        for n in (50, 51):
            e.reset()
            e.prefill(_prompt(m, n, n))
        calls = []
        for name in ("rms_norm", "linear", "attention", "router_probs", "topk"):
            real = getattr(e.ops, name)
            setattr(e.ops, name, lambda *a, _n=name, _r=real, **k: calls.append(_n) or _r(*a, **k))
        e.reset()
        e.prefill(_prompt(m, 52, 52))
    finally:
        dev.close()
    assert calls == ["rms_norm", "linear"], calls


@pytest.mark.parametrize("name", golden.golden_models())
def test_segment_bytes_bound_what_the_segments_carve(name):
    """The regions are sized by segment_bytes: every eager segment carved at most that, and those after the first
    (which also take the last MoE block's sum) not under half of it: a bound far above the need would take VRAM from
    the expert cache. (CUDA carves more than the twin: the GEMMs' fp16 inputs, qwen2moe's biases.)"""
    m = models.load(golden.model_path(name))
    dev = HostDevice()
    try:
        e = _engine(m, dev)
        for n, salt in ((CHUNK, 0), (2 * CHUNK + 5, 1), (17, 2)):
            e.reset()
            e.prefill(_prompt(m, n, salt))
    finally:
        dev.close()
    assert e.pgraphs.used
    for (layer, rows, _), used in e.pgraphs.used.items():
        bound = segment_bytes(m.cfg, rows)
        assert used <= bound and (layer == 0 or used > bound // 2), (layer, rows, used, bound)


def test_rows_round_up_within_the_chunk_and_the_context():
    from strata.accel.prompt_graph import PromptGraphs

    m = models.load(golden.model_path("tiny-mixtral"))
    dev = HostDevice()
    pg = PromptGraphs(dev, m.cfg, chunk=100, n_ctx=230)
    assert [pg.rows(t, 0) for t in (1, 64, 65, 100, 101)] == [64, 64, 100, 100, None]
    assert pg.rows(30, 200) == 30 and pg.rows(20, 200) == 30 and pg.rows(1, 229) == 1
    assert PromptGraphs(dev, m.cfg, chunk=4096, n_ctx=8192).cap == GRAPH_ROWS


def test_the_twin_records_a_capture_and_spills_an_eager_segment():
    """begin_segment(capture=True) records the compute stream's work without running it, and every launch runs it
    again on the same arrays; an eager segment past its region goes on in fresh memory, a capture may not."""
    dev = HostDevice()
    region = np.zeros(1024, np.uint8)
    a = np.arange(4, dtype=np.float32)
    dev.begin_segment(region, capture=True)
    out = dev.empty((4,), np.float32)
    dev.k.add(out, a, a, dev.compute)
    assert not out.any()                                  # recorded, not run
    g, used, spilled = dev.end_segment()
    assert used == 16 and not spilled and np.shares_memory(out, region)
    g.launch()
    assert out.tolist() == [0, 2, 4, 6]
    a[:] = 1
    g.launch()
    assert out.tolist() == [2, 2, 2, 2]
    dev.begin_segment(region, capture=False)
    big = dev.empty((512,), np.float32)
    _, _, spilled = dev.end_segment()
    assert spilled and not np.shares_memory(big, region)
    dev.begin_segment(region, capture=True)
    with pytest.raises(MemoryError):
        dev.empty((512,), np.float32)
    dev.end_segment()
    assert dev._bump is None and dev.compute.tape is None


def test_an_error_inside_a_segment_leaves_no_segment_open():
    """An exception out of the model code (here the MoE block, while the next segment captures) ends the open
    segment: the next prompt runs, captures and replays with the bits of a fresh engine."""
    m = models.load(golden.model_path("tiny-qwen3moe"))
    dev = HostDevice()
    try:
        e = _engine(m, dev)
        e.prefill(_prompt(m, 50, 0))
        moe = e.ops.moe

        def fail(h, layer, ids, w, **kw):
            if layer == 1:
                raise RuntimeError("boom")
            return moe(h, layer, ids, w, **kw)

        e.ops.moe = fail
        e.reset()
        with pytest.raises(RuntimeError, match="boom"):
            e.prefill(_prompt(m, 50, 1))
        assert dev._bump is None and dev.compute.tape is None
        e.ops.moe = moe
        got = []
        for salt in (2, 3):
            e.reset()
            got.append(e.prefill(_prompt(m, 50, salt)))
        want = [_engine(m, dev).prefill(_prompt(m, 50, salt)) for salt in (2, 3)]
    finally:
        dev.close()
    assert e.pgraphs.replays > 0
    assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(got, want))


def test_chunks_past_graph_rows_run_op_by_op(monkeypatch):
    """A chunk of more than GRAPH_ROWS tokens runs its dense parts op by op (there the GPU's work covers their issue)
    with the unpadded bits; a shorter one in the same engine takes the segments."""
    import strata.accel.prompt_graph as pgm

    monkeypatch.setattr(pgm, "GRAPH_ROWS", 32)
    m = models.load(golden.model_path("tiny-olmoe"))
    out = {}
    for graphs in (True, False):
        dev = HostDevice()
        try:
            e = _engine(m, dev, graphs)
            out[graphs] = [e.prefill(_prompt(m, 50, 0))]
            if graphs:
                assert e.pgraphs.cap == 32 and e.pgraphs.eager == 0
            e.reset()
            out[graphs].append(e.prefill(_prompt(m, 20, 1)))
            if graphs:
                assert e.pgraphs.eager == m.cfg.n_layer and set(e.pgraphs.seen) == {(0, 32, 0), (1, 32, 0)}
        finally:
            dev.close()
    assert all(np.array_equal(_bits(a), _bits(b)) for a, b in zip(out[True], out[False]))


@pytest.mark.parametrize("kind", _devices())
def test_the_bias_kernel_adds_as_array_arithmetic(kind):
    """A projection's bias is one launch (a segment holds only launches, so qwen2moe's segments can be captured),
    with the bits of the array arithmetic it replaced."""
    dev = make_device(kind)
    try:
        rng = np.random.default_rng(3)
        y = dev.asarray(rng.standard_normal((37, 100)).astype(np.float32))
        b = dev.asarray(rng.standard_normal(100).astype(np.float32))
        out = dev.empty((37, 100), np.float32)
        dev.k.add_bias(out, y, b, dev.compute)
        with dev.on(dev.compute):
            want = dev.tohost(y + b)
        assert np.array_equal(_bits(dev.tohost(out)), _bits(want))
    finally:
        dev.close()


def test_the_switch_turns_the_graphs_and_their_memory_off():
    """STRATA_PROMPT_GRAPH=0: no segments (each chunk op by op) and no regions priced in the plan."""
    from strata.accel.buffers import temp_bytes
    from strata.accel.prompt_graph import graph_temp_bytes

    m = models.load(golden.model_path("tiny-qwen3moe"))
    dev = HostDevice()
    try:
        on, off = _engine(m, dev, True), _engine(m, dev, False)
        off.prefill(_prompt(m, 50, 0))
    finally:
        dev.close()
    assert off.pgraphs is None and on.pgraphs is not None
    assert on.plan.decode - off.plan.decode == graph_temp_bytes(m.cfg, CHUNK) - temp_bytes(m.cfg, CHUNK) > 0


def test_keys_met_once_are_forgotten_past_seen_max(monkeypatch):
    """Shapes that never come back (every chat turn starts at a new position) do not grow the engine's memory: past
    SEEN_MAX keys met once, they are forgotten (a key met again later runs eagerly again)."""
    import strata.accel.prompt_graph as pgm

    monkeypatch.setattr(pgm, "SEEN_MAX", 3)
    m = models.load(golden.model_path("tiny-mixtral"))
    dev = HostDevice()
    try:
        e = _engine(m, dev)
        sizes = []
        for n in (10, 30, 50, 70):                  # new positions each time: the prompt continues
            e.prefill(_prompt(m, 5, n))
            sizes.append((len(e.pgraphs.seen), len(e.pgraphs.used)))
    finally:
        dev.close()
    assert max(max(s) for s in sizes) <= 3 and e.pgraphs.captures == 0, sizes
