"""A prompt of several chunks on the GPU engine: the chunks before the last run back to back. They compute no head
(their logits are not asked for) and the host does not wait for the GPU between them; the next chunk's ring copies
wait on the GPU for the compute that read the same slots. Oracle: the same prompt fed to the engine a chunk a call,
so that every chunk ends on the host with its last token's logits, as every chunk did before."""

import numpy as np
import pytest

from strata import models, policy
from strata.reference import golden
from tests.test_accel_engine import _devices, make_device

CHUNK = 8


def _engine(m, dev, n_ctx, cfg):
    from strata.accel.engine import GpuEngine

    return GpuEngine(m, dev, n_ctx=n_ctx, expert_cache=0, chunk=CHUNK, config=cfg)


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_chunks_before_the_last_keep_the_bits_and_leave_no_logits(kind, name, monkeypatch):
    """No expert cached, so every chunk streams: on either walk (stream-all's first copies go before the routing
    sync, into slots the previous chunk's last groups read) the last token's logits are the bits of the prompt fed a
    chunk a call, and one head and one download serve the whole prompt. (`all_logits` is no oracle here: the head
    over every row of a chunk is another GEMM shape than over its last row, with other bits.)"""
    import strata.accel.engine as engine_mod

    m = models.load(golden.model_path(name))
    ids = [(7 * i + 3) % m.cfg.n_vocab for i in range(4 * CHUNK + 3)]
    heads = []
    real_head = engine_mod.head
    monkeypatch.setattr(engine_mod, "head", lambda ops, cfg, rows: heads.append(rows.shape[0]) or real_head(
        ops, cfg, rows))
    for stream_min in (None, 0):
        cfg = policy.Config(stream_min=stream_min)
        dev = make_device(kind)
        try:
            a_call = _engine(m, dev, len(ids) + 2, cfg)
            for i in range(0, len(ids), CHUNK):
                by_calls = a_call.prefill(ids[i:i + CHUNK])                                 # [V]
            heads.clear()
            e = _engine(m, dev, len(ids) + 2, cfg)
            pulls = []
            tohost = dev.tohost
            dev.tohost = lambda a: pulls.append(a.shape) or tohost(a)
            last = e.prefill(ids)                                                          # [V]
            dev.tohost = tohost
        finally:
            dev.close()
        walks = [w for _, w, _ in e.stats.chunks]
        assert len(walks) == 5, walks
        if stream_min == 0:
            assert walks.count("stream-all") >= 1 and walks[0] == "stream-all", walks
        assert heads == [1] and pulls == [(1, m.cfg.n_vocab)], (heads, pulls)
        assert np.array_equal(last.view(np.uint32), by_calls.view(np.uint32)), f"stream_min {stream_min}"


def test_a_chunks_copies_wait_for_the_last_chunks_compute():
    """The host twin's compute runs inline, so no race shows there: the order is checked instead. Before a chunk's
    first ring copy the copy stream waits for an event recorded on the compute stream after the previous chunk's
    last expert group (the reader of those slots), on both walks."""
    from strata.accel.device.host import HostDevice
    from strata.accel.moe import ExpertRunner
    from strata.accel.stream import Ring

    m = models.load(golden.model_path("tiny-qwen3moe"))
    ids = list(range(5, 5 + 3 * CHUNK))
    for stream_min in (None, 0):
        dev = HostDevice()
        log, keep = [], []
        new_event = dev.event

        def event(timing=True):
            ev = new_event(timing)
            keep.append(ev)
            rec = ev.record
            ev.record = lambda stream, ev=ev, rec=rec: (log.append(("record", id(ev), stream is dev.compute)),
                                                        rec(stream))
            return ev

        dev.event = event
        wait = dev.copy.wait
        dev.copy.wait = lambda ev: (log.append(("wait", id(ev))), wait(ev))
        try:
            e = _engine(m, dev, len(ids) + 2, policy.Config(stream_min=stream_min))
            chunk = e._prompt_chunk
            e._prompt_chunk = lambda *a, **kw: (log.append(("chunk",)), chunk(*a, **kw))[1]
            with pytest.MonkeyPatch.context() as mp:
                group, copy_run = ExpertRunner.group, Ring.copy_run
                mp.setattr(ExpertRunner, "group", lambda self, *a, **kw: (log.append(("group",)),
                                                                         group(self, *a, **kw))[1])
                mp.setattr(Ring, "copy_run", lambda self, *a, **kw: (log.append(("pre-copy",)), copy_run(
                    self, *a, **kw), log.append(("copy",)))[1])
                e.prefill(ids)
        finally:
            dev.close()
        starts = [i for i, x in enumerate(log) if x[0] == "chunk"]
        assert len(starts) == 3, starts
        for c in (1, 2):
            prev = log[starts[c - 1]:starts[c]]
            last_group = starts[c - 1] + max(i for i, x in enumerate(prev) if x[0] == "group")
            first_copy = next(i for i in range(starts[c], len(log)) if log[i][0] == "copy")
            recorded_after = {x[1] for x in log[last_group:starts[c]] if x[0] == "record" and x[2]}
            waits = {x[1] for x in log[starts[c]:first_copy] if x[0] == "wait"}
            assert waits & recorded_after, (stream_min, c)
