"""The arena: every routed expert blob in pinned host RAM, laid out [layer][expert] (SPEC §1, §7).

Streamed experts are DMA'd from here (only pinned memory copies asynchronously), the CPU pool reads its experts
here, and the expert cache is filled from here. Each layer is one pinned buffer [E, blob_bytes(layer)]; a blob is
the raw GGUF bytes [gate | up | down], never re-encoded.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from strata.models import Model

PROGRESS_BYTES = 256 << 20   # a load of more bytes shows its progress (the arena's bar, the dense upload's)
HEADROOM = 1 << 30           # host RAM left to everything else beside the arena: pinned pages never swap out


class RamShortfall(RuntimeError):
    pass


def available_ram() -> int | None:
    """Bytes the system can give without swapping (MemAvailable, /proc/meminfo); None where it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class Arena:
    def __init__(self, model: Model, dev, log=None, threads: int = 4, available: int | None = None,
                 pin_after: bool = True):
        """`available`: the host RAM to plan against (default: available_ram()). An arena that does not fit it with
        HEADROOM to spare is a RamShortfall before anything is pinned: pinning past it would push the system
        into swap or the OOM killer, minutes into a load. `pin_after`: each layer filled in `Device.host_buffer`
        memory and page-locked once filled (`Device.pin`); off: allocated page-locked (`Device.pinned`), then
        filled (bench/arena_pin.py measures both)."""
        cfg = model.cfg
        self.n_layer, self.n_expert = cfg.n_layer, cfg.n_expert
        self.blob_bytes = [model.expert_blob_bytes(l) for l in range(cfg.n_layer)]
        self.types = [model.expert(l, 0).types for l in range(cfg.n_layer)]
        self.total_bytes = self.bytes_of(model)
        avail = available_ram() if available is None else available
        if avail is not None and self.total_bytes + HEADROOM > avail:
            gib = 2**30
            raise RamShortfall(
                f"the arena pins every routed expert in host RAM: {self.total_bytes / gib:.2f} GiB, with "
                f"{HEADROOM / gib:.0f} GiB left to the rest of the system, and {avail / gib:.2f} GiB are available: "
                f"{(self.total_bytes + HEADROOM - avail) / gib:.2f} GiB short (close other programs, or take a "
                f"smaller quant of the model)")
        self.layers: list[np.ndarray] = []
        steps = 2 if pin_after else 1                                    # filled, then pinned
        t0, done, lock, last = time.monotonic(), [0], threading.Lock(), [0.0]
        show = log is not None and self.total_bytes > PROGRESS_BYTES     # a progress bar only where it is long

        def tick(n):
            with lock:
                done[0] += n
                now = time.monotonic()
                total = steps * self.total_bytes
                if show and (now - last[0] > 0.5 or done[0] == total):
                    last[0] = now
                    what = "filling and pinning" if pin_after else "pinning"
                    print(f"\rarena: {what} {self.total_bytes / 2**30:.2f} GiB "
                          f"({100 * done[0] / max(1, total):3.0f}%, "
                          f"{done[0] / steps / max(now - t0, 1e-9) / 2**30:.1f} GiB/s)", end="", file=sys.stderr,
                          flush=True)

        def fill(buf, l, e0, e1):
            for e in range(e0, e1):
                model.expert(l, e).copy_into(buf[e])
            tick((e1 - e0) * buf.shape[1])

        def pin(buf):
            dev.pin(buf)
            tick(buf.nbytes)

        with ThreadPoolExecutor(max_workers=threads) as ex:   # numpy copies release the GIL
            futs = []
            for l, b in enumerate(self.blob_bytes):
                buf = (dev.host_buffer if pin_after else dev.pinned)(b * cfg.n_expert)
                self.layers.append(buf.reshape(cfg.n_expert, b))
                step = max(1, (64 << 20) // b)
                futs += [ex.submit(fill, self.layers[-1], l, e0, min(cfg.n_expert, e0 + step))
                         for e0 in range(0, cfg.n_expert, step)]
            for f in futs:
                f.result()
            if pin_after:               # once every page is touched: the lock takes them as they are
                for f in [ex.submit(pin, buf) for buf in self.layers]:
                    f.result()
        if show:
            print(file=sys.stderr)
        if log:
            log(f"arena: {cfg.n_layer * cfg.n_expert:,} experts, {self.total_bytes / 2**30:.2f} GiB pinned in "
                f"{time.monotonic() - t0:.1f} s")

    @staticmethod
    def bytes_of(model: Model) -> int:
        """What an arena of `model` pins: every routed expert's blob."""
        return sum(model.expert_blob_bytes(l) for l in range(model.cfg.n_layer)) * model.cfg.n_expert

    def blob(self, layer: int, e: int) -> np.ndarray:
        return self.layers[layer][e]

    def run(self, layer: int, e0: int, e1: int) -> np.ndarray:
        """Experts e0 .. e1-1 of a layer: [e1 - e0, blob_bytes], one contiguous pinned block (one copy)."""
        return self.layers[layer][e0:e1]

    @property
    def max_blob_bytes(self) -> int:
        return max(self.blob_bytes)
