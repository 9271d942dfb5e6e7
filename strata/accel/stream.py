"""The staging ring and the two streaming walks' queue (SPEC §3).

A ring slot holds one blob. `copied[i]` is recorded on the copy stream after a blob lands in slot i; `used[i]` on
the compute stream once the kernels that read slot i are enqueued. A copy into slot i waits for `used[i]`;
compute on slot i waits for `copied[i]`. Entry k of a walk's queue goes to slot k mod R and is issued once entry
k - R was consumed. The engine thread issues every copy between its launches: an issuer thread of its own (stop 18
and before) had to win the GIL from the launching thread, and lost to inline issuing on the H200 (same rounds,
bench/results/h200/issuer_ab_stop19.log: flash-shape 8K stream-all 537.7 -> 486.8 ms, 2K 179.5 -> 169.4).
"""

from __future__ import annotations

import numpy as np

from strata.policy import IssueOrder


class Ring:
    def __init__(self, dev, buf, after=None):
        self.dev, self.buf = dev, buf                              # buf: device uint8 [R, slot_bytes]
        self.n = buf.shape[0]
        # the event that frees slot i (one event may free a whole group); `after`: the previous chunk's end, whose
        # last groups read these slots and which the host did not wait for
        self.used = [after] * self.n
        self._waited = None                  # the last `used` event the copy stream waits for (skip repeats)
        self.cursor = 0                      # the slot after the last one a walk took: the next walk starts there
        self.held = [False] * self.n         # slot i holds a blob whose readers are not enqueued yet
        self.bytes_in = 0
        self.copies = 0                      # experts copied
        self.transfers = 0                   # copy calls (a run of neighbouring experts is one)

    def forget_holds(self) -> None:
        """A step that raised left entries unconsumed: nothing will read their blobs now (the decode ring outlives
        its steps; a prompt's ring is made a chunk)."""
        self.held = [False] * self.n

    def copy_run(self, s0: int, blobs: np.ndarray, record: bool = True):
        """Copy m consecutive blobs (pinned [m, blob]) into slots s0 .. s0+m-1 once their last readers are
        done, in one copy call (Device.h2d_rows; pitched where a slot is wider than a blob). Returns the event
        recorded after the copy (None when `record` is off: a later copy's event covers this one, the copy stream
        being in order)."""
        m, nb = blobs.shape
        if any(self.held[s0:s0 + m]):        # two walks overlap (a guessed one must stay in the free slots)
            raise RuntimeError(f"ring: a copy into slots {s0}..{s0 + m - 1}, one still held for its readers")
        self.held[s0:s0 + m] = [True] * m
        for i in range(s0, s0 + m):
            used = self.used[i]
            if used is not None and used is not self._waited:
                self.dev.copy.wait(used)
                self._waited = used
        self.dev.h2d_rows(self.buf, s0, blobs, self.dev.copy)     # one copy call for the run
        self.transfers += 1
        ev = None
        if record:
            ev = self.dev.event(timing=False)
            ev.record(self.dev.copy)
        self.bytes_in += blobs.nbytes
        self.copies += m
        return ev

    def release(self, slots: list[int], ev=None) -> None:
        """The kernels that read `slots` are enqueued: one event frees them all (`ev`: one recorded after them
        already, on the compute stream; a pre-sync group's, presync.py)."""
        if ev is None:
            ev = self.dev.event(timing=False)
            ev.record(self.dev.compute)
        for i in slots:
            self.used[i] = ev
            self.held[i] = False


class Walk:
    """One chunk's queue of (layer, expert) entries through a ring. The engine thread issues the copies between
    its launches, in the order and runs of policy.IssueOrder (entry k once the entries below k - R were consumed;
    neighbouring experts in neighbouring slots in one copy): `prefetch` issues all that may go, `consume(ks)`
    marks entries done and releases their slots."""

    def __init__(self, ring: Ring, arena, entries: list[tuple[int, int]], group: int | None = None):
        self.ring, self.arena, self.entries = ring, arena, list(entries)
        # entry k -> slot (base + k) mod R: a walk starts at the slot after the last walk's, whose last group's
        # slots (held longest) its first copies would otherwise wait for
        self.base = ring.cursor
        ring.cursor = (self.base + len(self.entries)) % ring.n
        self.order = IssueOrder(self.entries, ring.n, self.base)
        # the routed-only walk computes entries in groups of `group` in queue order: only a copy that carries a
        # group's last entry needs an event (a CUDA event per copy run was a tenth of a short prompt's host time)
        self.group = group
        self._copied: list = [None] * len(entries)   # the event after the copy that carried entry k

    def slot(self, k: int) -> int:
        return (self.base + k) % self.ring.n

    def extend(self, entries: list[tuple[int, int]]) -> None:
        """Append entries (a guessed walk takes, after the routing sync, the routed experts it did not guess). The
        walk must be the ring's newest."""
        assert self.ring.cursor == (self.base + len(self.entries)) % self.ring.n, "a walk after this one took slots"
        self.entries += entries
        self._copied += [None] * len(entries)
        self.order.grew()
        self.ring.cursor = (self.base + len(self.entries)) % self.ring.n

    def _issue(self, k0: int, k1: int) -> None:
        """Copy entries [k0, k1) (one layer's neighbouring experts, neighbouring slots) in one run."""
        l, e0 = self.entries[k0]
        g = self.group
        ends = g is None or k1 // g > k0 // g or k1 == len(self.entries)      # carries a group's last entry
        ev = self.ring.copy_run(self.slot(k0), self.arena.run(l, e0, e0 + k1 - k0), record=ends)
        for k in range(k0, k1):
            self._copied[k] = ev
            if self.order.done(k):           # consumed before its copy (stream-all's unrouted): nothing will read it
                self.ring.held[self.slot(k)] = False

    def ensure_issued(self, k: int) -> None:
        """Issue up to entry k (its slot's entry R before must have been consumed)."""
        for k0, k1 in self.order.up_to(k):
            self._issue(k0, k1)

    def prefetch(self) -> None:
        """Issue every entry whose slot is free: up to R transfers in flight ahead of compute (SPEC §3). In the
        stream-all walk the engine calls it after each group and at a layer's end, so the next layer's experts
        stream during its attention while the engine waits in the routing sync."""
        for k0, k1 in self.order.prefetch():
            self._issue(k0, k1)

    def slots(self, ks: list[int]) -> np.ndarray:
        """The ring slots entries `ks` land in (fixed by the entry index, so known before they are issued)."""
        return (np.asarray(ks, np.int64) + self.base) % self.ring.n

    def acquire(self, ks: list[int]) -> None:
        """Make later compute wait for entries `ks` (issued, in order): copies land in order, so the event of
        the copy that carried the last one covers them all."""
        ev = self._copied[ks[-1]]
        assert ev is not None, f"entries {ks} end no group of {self.group}"
        self.ring.dev.compute.wait(ev)

    def consume(self, ks: list[int], ev=None) -> None:
        """Entries `ks` have their readers enqueued (or were not routed): free their slots for entries k + R (once
        `ev` completes, where given: an event recorded after those readers)."""
        self.order.consume(ks)
        self.ring.release([self.slot(k) for k in ks], ev)
