"""The arena's two ways to page-lock (Arena pin_after): filled in Device.host_buffer memory and locked after
(Device.pin), or allocated locked (Device.pinned) and filled. Oracle: the model's own blobs (Model.expert); on CUDA
the locked memory is the device's to read at its host address (the decode graph reads missed experts there) and
copies out of it asynchronously."""

import numpy as np
import pytest

from strata import models
from strata.accel.arena import Arena
from strata.reference import golden
from tests.test_accel_engine import _devices, device_of


def _blob(m, l, e):
    out = np.empty(m.expert_blob_bytes(l), np.uint8)
    m.expert(l, e).copy_into(out)
    return out


@pytest.mark.parametrize("kind", _devices())
def test_both_ways_hold_every_blob(kind, capsys):
    m = models.load(golden.model_path(golden.golden_models()[0]))
    c = m.cfg
    with device_of(kind) as dev:
        for pin_after in (True, False):
            a = Arena(m, dev, pin_after=pin_after, log=print)
            for l in range(c.n_layer):
                for e in range(c.n_expert):
                    assert np.array_equal(a.blob(l, e), _blob(m, l, e)), (pin_after, l, e)
            if kind == "cuda":
                rt = dev.cp.cuda.runtime
                for buf in a.layers:
                    att = rt.pointerGetAttributes(buf.ctypes.data)
                    assert att.devicePointer == buf.ctypes.data and att.type == 1, pin_after          # cudaMemoryTypeHost
                got = dev.empty(a.layers[-1].shape, np.uint8)
                dev.h2d(got, a.layers[-1], dev.copy)
                dev.copy.synchronize()
                assert np.array_equal(dev.tohost(got), a.layers[-1])
    assert "pinned in" in capsys.readouterr().out
