"""A layer-major prompt's deferred MoE blocks issued on the device's side stream (moe_block._beside), beside the
compute stream's dense parts of the chunks after them. Oracle: the same engine with every deferred block on the
compute stream (side_blocks off): the same launches on the same inputs, so the same bits, every token's. On the
host twin the side stream is a thread of its own: a wait missing between it and the compute stream (the chunk's
rows read again before its block wrote them, a block in place before the side stream's last) gives other bits. The
compute stream waits for the oldest block once more than `side_pending` are in flight (what they keep is priced)."""

import numpy as np
import pytest

from strata import models
from strata.reference import golden
from tests.test_accel_engine import _devices, device_of, prefill_each
from tests.test_prompt_layer_major import _engine, _prompts, counting


def _most_pending(e) -> list:
    """The most blocks the compute stream has not waited for, over e's calls to _beside (a one-element list)."""
    fn, most = e._beside, [0]

    def beside(waiting):
        fn(waiting)
        most[0] = max(most[0], len(e._side_ends))

    e._beside = beside
    return most


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("name", golden.golden_models())
def test_side_stream_blocks_keep_the_bits(kind, name):
    m = models.load(golden.model_path(name))
    outs, beside = {}, {}
    for side in (False, True):
        with device_of(kind) as dev:
            e = _engine(m, dev, True)
            e.side_blocks = side
            n = counting(e, "_beside")
            e.side_pending = 1 if side else e.side_pending
            pending = _most_pending(e)
            outs[side] = prefill_each(e, _prompts(m.cfg.n_vocab), all_logits=True)
            beside[side] = n[0]
            assert pending[0] == (1 if side else 0)      # the bound holds (three chunks a layer would keep 3)
            assert not e._side_ends and dev.compute is not dev.side
            dev.synchronize()
            e.cache.poll()
            assert not e.cache._pending
    # three prompts of three chunks: every block but each prompt's last went to the side stream
    assert beside == {False: 0, True: 3 * (3 * m.cfg.n_layer - 1)}
    for i, (a, b) in enumerate(zip(outs[False], outs[True])):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"prompt {i}"
