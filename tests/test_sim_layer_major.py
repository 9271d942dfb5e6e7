"""The simulated engine's layer-major prompts (policy.layer_major, sim/layer_major.py), with the engine's choice:
a prompt of several chunks whose chunks would walk routed-only (or stream-all refused as wasteful) and whose cache
keeps a whole layer runs layer by layer, each layer's routed experts copied once a prompt; stream-all that pays and
the CPU share's chunks stay chunk by chunk. Scenario and costs of tests/test_sim_stream_waste.py (2 layers of 8
experts, top-2, e0 resident in each, chunks of 1,024 tokens)."""

from sim.engine import Run, Session, prefill
from sim.hardware import machine
from sim.models import SimModel
from strata.policy import Config, Walk, share_policy
from tests.test_sim_stream_waste import CHUNK, RING, SHAPE, FixedCosts, routing

L, S, R = Walk.LAYER_MAJOR, Walk.STREAM_ALL, Walk.ROUTED_ONLY
RESIDENT = tuple(tuple(e == 0 for e in range(8)) for _ in range(2))


class ShareCosts(FixedCosts):   # µs; what a run with the CPU share asks besides
    def cpu_pool_us(self, l, counts): return 100.0 * len(counts)
    def input_d2h_us(self, t): return 10.0
    def rows_h2d_us(self, rows): return 10.0
    def pin_us(self, nbytes): return 10.0


def _run(chunks: int, skewed: bool, major: bool = True, cfg=Config(cpu_share=0.0), session=None, costs=None,
         defer: bool = True):
    r = Run(machine("h200-host16"), SimModel("tiny", SHAPE), chunks * CHUNK, cfg, cache_slots=200_000,
            routing=routing(chunks * CHUNK, skewed), costs=costs or FixedCosts(), residency=RESIDENT,
            plan=(CHUNK, RING),
            layer_major=major, defer_blocks=defer)
    session = session or Session(share_policy(r.share, r.gated))
    return prefill(r, session), session


def _walks(result):
    return [w for _, _, w in result.chunks]


def test_a_wasteful_stream_all_gives_way_to_layer_major_prompts_streaming_each_expert_once():
    r, session = _run(3, skewed=True)
    assert _walks(r) == [S, R, R]                    # the first prompt measures stream-all's waste
    r2, _ = _run(3, skewed=True, session=session)
    assert _walks(r2) == [L, L, L]
    assert r2.n_streamed == 2 * 2                   # e1 and e2 of each layer, once (the chunks route e0-e2)
    again, _ = _run(3, skewed=True, major=False, session=session)
    assert _walks(again) == [R, R, R] and again.n_streamed == 3 * 2 * 2
    assert r2.prompt_ms < again.prompt_ms


def test_stream_all_that_pays_and_the_shared_chunks_stay_chunk_by_chunk():
    r, session = _run(3, skewed=False)
    assert _walks(r) == [S, S, S]
    r2, _ = _run(3, skewed=False, session=session)
    assert _walks(r2) == [S, S, S]
    small = Config(cpu_share=0.5, stream_min=4096)  # routed-only chunks the CPU shares
    r3, _ = _run(3, skewed=True, cfg=small, costs=ShareCosts())
    assert _walks(r3) == [R, R, R]
    r4, _ = _run(3, skewed=True, cfg=Config(cpu_share=0.0, stream_min=4096))          # the same without the share
    assert _walks(r4) == [L, L, L]
    assert L not in _walks(r3)


def test_a_one_chunk_prompt_and_the_switch():
    r, session = _run(3, skewed=True)
    one, _ = _run(1, skewed=True, session=session)
    assert _walks(one) == [R]
    off, _ = _run(3, skewed=True, cfg=Config(cpu_share=0.0, prompt_layer_major=False), session=session)
    assert L not in _walks(off)


class LayoutCosts(FixedCosts):   # the host lays a chunk's rows out in 80 µs (FixedCosts: none)
    def group_us(self, t): return 80.0


def test_a_deferred_block_hides_the_layout_behind_the_next_chunks_dense_part():
    """Run.defer_blocks (strata/accel/deferred.py): each chunk's routing sync waits for its own dense part, and the
    host's sync and layout (5 + 80 µs here) run while the GPU computes the next chunk's dense part (100 µs): of the 6
    chunk-layers' windows, all but the prompt's last hidden; the same experts stream."""
    _, session = _run(3, skewed=True)                # the first prompt measures stream-all's waste
    got = {}
    for defer in (False, True):
        got[defer], _ = _run(3, skewed=True, session=session, costs=LayoutCosts(), defer=defer)
        assert _walks(got[defer]) == [L, L, L]
    assert got[True].n_streamed == got[False].n_streamed == 2 * 2
    saved = got[False].prompt_ms - got[True].prompt_ms
    assert abs(saved - 5 * 0.085) < 1e-9, saved
