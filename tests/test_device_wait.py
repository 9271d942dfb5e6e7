"""Device.wait_words: a stream waits for a host word that another thread sets (the CPU pool's count of finished
tiles) without blocking the caller, and work after the wait sees what that thread wrote before the word. The
GPU engine's shared layers rely on it: the compute stream, not the engine thread, waits for the CPU's rows."""

import threading
import time

import numpy as np
import pytest


def _device(kind):
    if kind == "host":
        from strata.accel.device.host import HostDevice

        return HostDevice()
    pytest.importorskip("cupy")
    from strata.accel.device.cuda import CudaDevice

    return CudaDevice()


@pytest.mark.parametrize("kind", ["host", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_stream_waits_for_a_host_word_and_then_sees_the_writes_before_it(kind):
    dev = _device(kind)
    stream = dev.copy                  # the host twin's copy stream has a thread: the caller must not block
    words = np.zeros(64, np.int64)
    dev.map_words(words)
    handle = dev.map_words(words)      # again: a second engine on the same pool maps the same words
    rows = dev.pinned(1 << 20)
    rows[:] = 0
    out = dev.zeros((1 << 20,), np.uint8)
    done = dev.event()
    for rnd in range(1, 4):            # the word keeps counting: each round waits for a larger value
        t0 = time.perf_counter()
        dev.wait_words(handle, 8, 3 * rnd, stream)
        dev.h2d(out, rows, stream)
        done.record(stream)
        issued = time.perf_counter() - t0
        assert issued < 0.05, f"wait_words blocked the caller for {issued * 1e3:.1f} ms"
        time.sleep(0.02)
        assert not done.query(), "the stream ran past a word that had not reached its value"

        def writer(r=rnd):
            rows[:] = r                # the payload first, then the count, as the pool's last tile does
            for _ in range(3):
                words[8] += 1

        th = threading.Thread(target=writer)
        th.start()
        th.join()
        done.synchronize()
        got = dev.tohost(out) if kind == "cuda" else out
        assert (got == rnd).all()
    dev.close()
