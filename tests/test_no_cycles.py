"""The engine's steps leave no reference cycles: a prompt's and a decode step's arrays free when the last reference
goes, not when Python's cyclic collector next runs. On the GPU a cycle's arrays stay in the memory pool's use
meanwhile, and the pool grows past what the memory plan priced (deferred.py's blocks did, by hundreds of MiB over
an 8K prompt on the H200: bench/results/h200/pool_growth_q8_stop41.log). Oracle: gc.collect() after the steps,
with the collector off while they ran, finds nothing (it counts what only it could free)."""

import collections
import gc

import pytest

from strata import models, policy
from strata.reference import golden
from tests.test_accel_engine import _devices, device_of
from tests.test_prompt_layer_major import CHUNK, _prompts


def _engines(m, dev):
    """(name, engine): a layer-major prompt's deferred blocks on the side stream and in place, chunk by chunk, and
    the default engine (prompt graphs, the whole cache)."""
    from strata.accel.engine import GpuEngine

    c = m.cfg
    for name, major, side in (("layer-major, side stream", True, True), ("layer-major, in place", True, False),
                              ("chunk by chunk", False, True)):
        e = GpuEngine(m, dev, n_ctx=3 * CHUNK + 8, expert_cache=c.n_expert, chunk=CHUNK,
                      config=policy.Config(cpu_share=0.0, prompt_graph=False, prompt_layer_major=major))
        e.side_blocks = side
        yield name, e
    yield "default", GpuEngine(m, dev, n_ctx=3 * CHUNK + 8)


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_steps_leave_no_cycles(kind, name):
    m = models.load(golden.model_path(name))
    prompt = _prompts(m.cfg.n_vocab)[0]
    with device_of(kind) as dev:
        for what, e in _engines(m, dev):
            e.prefill(prompt[:CHUNK])           # compiled, captured, pools grown: what a first run makes once
            e.reset()
            dev.synchronize()
            gc.collect()
            gc.disable()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                out = e.prefill(prompt)
                for _ in range(3):
                    out = e.decode([int(out[-1].argmax())])
                dev.synchronize()
                found = gc.collect()
                kinds = collections.Counter(type(o).__name__ for o in gc.garbage)
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
            assert found == 0, f"{what}: cycles the steps left: {kinds.most_common(8)}"
