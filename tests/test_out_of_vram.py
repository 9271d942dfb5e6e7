"""Out of device memory inside a step (something else took VRAM after the engine planned): the engine says so as a
VramShortfall with the plan's figures, which `generate` prints as one error line, and loses nothing: the step's
cleanup has run, so the next prompt and decode steps give a fresh engine's bits. The error is injected: the device's
`empty` raises its own out-of-memory type (CuPy's on CUDA) partway through the step."""

import numpy as np
import pytest

from strata import models
from strata.accel.memplan import VramShortfall
from strata.reference import golden
from tests.test_accel_engine import _devices, device_of
from tests.test_prompt_layer_major import _engine, _prompts


def _oom_after(dev, n: int) -> list:
    """dev.empty raises dev.OutOfMemory on its n-th call from now; returns the call counter (a one-element list)."""
    empty, calls = dev.empty, [0]

    class Injected(dev.OutOfMemory):       # CuPy's takes (size, total): built as the MemoryError it derives from
        def __init__(self, msg):
            MemoryError.__init__(self, msg)

    def failing(shape, dtype):
        calls[0] += 1
        if calls[0] == n:
            raise Injected(f"injected: out of memory allocating {int(np.prod(shape))} items")
        return empty(shape, dtype)

    dev.empty = failing
    return calls


@pytest.mark.parametrize("kind", _devices())
@pytest.mark.parametrize("major", [True, False], ids=["layer-major", "chunk-by-chunk"])
def test_out_of_vram_in_a_step_is_a_clear_error_and_loses_nothing(kind, major):
    m = models.load(golden.model_path(golden.golden_models()[0]))
    p = _prompts(m.cfg.n_vocab)[1][:-4]           # three chunks, and room for the decode steps
    with device_of(kind) as dev:
        fresh = _engine(m, dev, major)
        want = [fresh.prefill(p)]
        assert (fresh.stats.chunks[-1][1] == "layer-major") == major
        want += [fresh.decode([t])[-1] for t in (5, 6)]
        e = _engine(m, dev, major)
        home = list(e.cache.owner)
        empty = dev.empty
        calls = _oom_after(dev, 40)
        with pytest.raises(VramShortfall, match=r"out of VRAM in a prompt \(injected.*the plan left .* MiB are free"):
            e.prefill(p)
        assert calls[0] == 40, "the prompt allocated too little for the injected error"
        dev.empty = empty
        dev.synchronize()
        e.cache.poll()
        assert e.cache.owner == home
        e.reset()
        e.prefill(p)
        _oom_after(dev, 1)
        with pytest.raises(VramShortfall, match=r"out of VRAM in a decode step"):
            e.decode([5])
        dev.empty = empty
        e.reset()
        got = [e.prefill(p)] + [e.decode([t])[-1] for t in (5, 6)]
    for i, (a, b) in enumerate(zip(want, got)):
        assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), f"output {i}"
