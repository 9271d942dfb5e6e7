"""The staging ring and the two streaming walks' queue (SPEC §3).

A ring slot holds one blob. `copied[i]` is recorded on the copy stream after a blob lands in slot i; `used[i]` on
the compute stream once the kernels that read slot i are enqueued. A copy into slot i waits for `used[i]`;
compute on slot i waits for `copied[i]`. Entry k of a walk's queue goes to slot k mod R and is issued once entry
k - R was consumed. In the stream-all walk an issuer thread issues entries ahead while the engine thread blocks
in routing syncs, so the next layer's experts stream during this layer's attention.
"""

from __future__ import annotations

import threading

import numpy as np

from strata.accel.gpu.kernels import BlobRef


class Ring:
    def __init__(self, dev, buf):
        self.dev, self.buf = dev, buf                              # buf: device uint8 [R, slot_bytes]
        self.n = buf.shape[0]
        self.copied = [dev.event() for _ in range(self.n)]
        self.used = [None] * self.n          # the event that frees slot i (one event may free a whole group)
        self._waited = None                  # the last `used` event the copy stream waits for (skip repeats)
        self.bytes_in = 0
        self.copies = 0

    def issue(self, i: int, blob: np.ndarray) -> None:
        """Copy `blob` (pinned) into slot i once its last reader is done."""
        used = self.used[i]
        if used is not None and used is not self._waited:
            self.dev.copy.wait(used)
            self._waited = used
        self.dev.h2d(self.buf[i, :blob.nbytes], blob, self.dev.copy)
        self.copied[i].record(self.dev.copy)
        self.bytes_in += blob.nbytes
        self.copies += 1

    def acquire(self, slots: list[int]) -> list[BlobRef]:
        """Make later compute wait for the copies into `slots`, issued in this order: the copy stream runs in
        order, so waiting for the last one covers them all."""
        self.dev.compute.wait(self.copied[slots[-1]])
        return [BlobRef(self.buf, i) for i in slots]

    def release(self, slots: list[int]) -> None:
        """The kernels that read `slots` are enqueued: one event frees them all."""
        ev = self.dev.event()
        ev.record(self.dev.compute)
        for i in slots:
            self.used[i] = ev


class Walk:
    """One chunk's queue of (layer, expert) entries through a ring, issued by the engine thread (routed-only)
    or by an issuer thread (stream-all). `consume(k)` marks entry k done and records its slot's `used`; entries
    may be consumed out of order (an unrouted entry inside a group's span), and `consumed` is the watermark:
    every entry below it is done, which is what issuing entry k + R needs."""

    def __init__(self, ring: Ring, arena, entries: list[tuple[int, int]], threaded: bool):
        self.ring, self.arena, self.entries = ring, arena, entries
        self.index = {le: k for k, le in enumerate(entries)}
        self.issued = 0           # entries [0, issued) have their copy enqueued and `copied` recorded
        self.consumed = 0         # watermark: entries [0, consumed) are all done
        self._done = np.zeros(len(entries) + 1, bool)
        self._cv = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self.thread = None
        if threaded:
            self.thread = threading.Thread(target=self._issuer, name="stream-all issuer", daemon=True)
            self.thread.start()

    def slot(self, k: int) -> int:
        return k % self.ring.n

    def _issue_one(self, k: int) -> None:
        l, e = self.entries[k]
        self.ring.issue(self.slot(k), self.arena.blob(l, e))

    def _issuer(self):
        try:
            self.ring.dev.bind_thread()
            for k in range(len(self.entries)):
                with self._cv:
                    while not self._stop and self.consumed <= k - self.ring.n:
                        self._cv.wait()
                    if self._stop:
                        return
                self._issue_one(k)
                with self._cv:
                    self.issued = k + 1
                    self._cv.notify_all()
        except BaseException as e:  # noqa: BLE001 - re-raised in the engine thread
            with self._cv:
                self._error = e
                self._cv.notify_all()

    def ensure_issued(self, k: int) -> None:
        """Block until entry k's copy is enqueued (issuing inline when there is no issuer thread)."""
        if self.thread is None:
            while self.issued <= k:
                assert self.issued - self.ring.n < self.consumed, "routed-only walk: ring overrun"
                self._issue_one(self.issued)
                self.issued += 1
            return
        with self._cv:
            while self.issued <= k and self._error is None:
                self._cv.wait()
            if self._error is not None:
                raise RuntimeError(f"stream-all issuer failed: {self._error!r}") from self._error

    def prefetch(self) -> None:
        """Routed-only walk: keep up to R transfers in flight ahead of compute (SPEC §3)."""
        if self.thread is None:
            while self.issued < len(self.entries) and self.issued < self.consumed + self.ring.n:
                self._issue_one(self.issued)
                self.issued += 1

    def consume(self, ks: list[int]) -> None:
        """Entries `ks` have their readers enqueued (or were not routed): free their slots for entries k + R."""
        assert not self._done[ks].any(), f"an entry of {ks} consumed twice"
        self.ring.release([self.slot(k) for k in ks])
        with self._cv:
            self._done[ks] = True
            while self._done[self.consumed]:
                self.consumed += 1
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self.thread is not None:
            self.thread.join()
