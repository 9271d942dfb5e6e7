"""The VRAM expert cache: blob-sized slots, residency, the prompt loan, and adaptive-tier moves (SPEC §7, §9).

One owner of residency (STYLE point 11): `slot_of[l, e]` is the slot holding expert e of layer l or -1. Copies
into slots run on the copy stream; an expert becomes resident only once its copy has landed.
"""

from __future__ import annotations

import numpy as np

from strata.accel.arena import Arena

SLOT_ALIGN = 256
# a refill's slots turn resident in batches, one event each, not one a slot: the prompt's end issues the refill of
# every lent slot (128-889 a prompt on the bench's models) on the engine thread, inside the prompt's time
REFILL_EVENT_EVERY = 32


def slot_bytes_for(max_blob: int) -> int:
    return -(-max_blob // SLOT_ALIGN) * SLOT_ALIGN


def refill_runs(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The copies of a lent region's refill: pairs (layer, expert) sorted, the i-th going to the region's i-th slot
    -> [(i, j)]: pairs i .. j-1 are one layer's neighbouring experts (one contiguous block of the arena), cut where
    an event's batch of REFILL_EVENT_EVERY slots ends. bench/share_sim.py gives the simulator this count."""
    out, i = [], 0
    while i < len(pairs):
        l, e0 = pairs[i]
        j = i + 1
        while j < len(pairs) and j % REFILL_EVENT_EVERY and pairs[j] == (l, e0 + j - i):
            j += 1
        out.append((i, j))
        i = j
    return out


def uniform_order(n_layer: int, n_expert: int) -> list[tuple[int, int]]:
    """Without a routing profile: expert i of every layer before expert i+1 of any, so layers share evenly."""
    return [(l, e) for e in range(n_expert) for l in range(n_layer)]


def by_layer(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The slots' order of a cache's residents (layer, expert): by layer, each layer's in the order given. A prompt
    borrows the cache's last slots (`lend`), so its loan takes the last layers' residents first: their copies go
    out during the layers before them (the guesses), while a prompt's first layers wait on the link with nothing
    to overlap, and keep theirs. On the H200, qwen3's quarter cache 1.08-1.13x at 250-900 tokens, 1.07x at 2K, with
    10-12% fewer bytes; flash-shape 1.01x (bench/residents_ab.py, bench/results/h200/ab_residents_stop39.log)."""
    return sorted(pairs, key=lambda p: p[0])


class ExpertCache:
    def __init__(self, dev, n_slots: int, slot_bytes: int, n_layer: int, n_expert: int):
        self.dev, self.n_slots, self.slot_bytes = dev, n_slots, slot_bytes
        self.buf = dev.empty((max(n_slots, 1), slot_bytes), np.uint8)     # [slots, slot_bytes]
        self.slot_of = np.full((n_layer, n_expert), -1, np.int32)          # residency
        self.owner: list[tuple[int, int] | None] = [None] * n_slots
        self.lent = 0                                                      # tail slots lent to the prompt path
        self._pending: list[tuple[object, int, int, int]] = []             # (event, slot, layer, expert)
        self.hits = self.lookups = 0
        self.version = 0                 # bumped at every change of slot_of (the decode graph mirrors it on the device)

    # --- predicates -------------------------------------------------------------------------------------
    def resident(self, layer: int) -> np.ndarray:
        return self.slot_of[layer] >= 0

    def n_resident(self) -> int:
        return int((self.slot_of >= 0).sum())

    def free(self) -> int:
        """Usable slots that hold no expert (nor one in flight)."""
        return self.owner[:self.usable].count(None)          # a slot in flight has its owner set already

    @property
    def usable(self) -> int:
        return self.n_slots - self.lent

    # --- actions ------------------------------------------------------------------------------------------
    def fill(self, order: list[tuple[int, int]], arena: Arena) -> int:
        """Initial residency: the first `usable` pairs of `order` (hottest first), in slots `by_layer`, copied and
        waited for."""
        n = 0
        for (l, e) in by_layer(order[:self.usable]):
            self._load(n, l, e, arena)
            self.slot_of[l, e] = n
            n += 1
        self.version += 1
        self.dev.copy.synchronize()
        return n

    def _load(self, slot: int, l: int, e: int, arena: Arena) -> None:
        self.dev.h2d_rows(self.buf, slot, arena.blob(l, e), self.dev.copy)
        self.owner[slot] = (l, e)

    def lend(self, k: int) -> object:
        """Lend the last k slots to the prompt path: their experts turn non-resident now. Returns the region
        (a flat uint8 device array) the prompt buffers are carved from."""
        assert 0 <= k <= self.n_slots and self.lent == 0, f"lend {k} of {self.n_slots} (already lent {self.lent})"
        self.slot_of[self.slot_of >= self.n_slots - k] = -1      # one pass, not a Python step a slot
        self.lent = k
        self.version += 1
        return self.buf[self.n_slots - k:].reshape(-1) if k else None

    def restore(self, arena: Arena, after_event) -> None:
        """Give the lent slots back and refill them with their experts once `after_event` (the prompt's last
        use of the region) has completed; they become resident when the copies land (see `poll`).

        The lent slots take their experts back sorted by (layer, expert), so neighbouring experts of a layer land
        in neighbouring slots and each run is one copy (Device.h2d_rows). Which slot holds an expert changes
        nothing else (slot_of is the one map). The residents sit `by_layer`, so a lent tail is a few layers' runs;
        in the uniform fill's own order it alternated layers, a copy a slot (~5 us of the engine thread's time
        each, 128-889 a prompt on the bench's models)."""
        self.dev.copy.wait(after_event)
        lo = self.n_slots - self.lent
        pairs = sorted(o for o in self.owner[lo:] if o is not None)
        self.owner[lo:] = [None] * self.lent
        for i, j in refill_runs(pairs):
            l, e0 = pairs[i]
            self.dev.h2d_rows(self.buf, lo + i, arena.run(l, e0, e0 + j - i), self.dev.copy)
            self.owner[lo + i:lo + j] = pairs[i:j]
            if j % REFILL_EVENT_EVERY == 0 or j == len(pairs):          # one event a batch of slots
                ev = self.dev.event(timing=False)
                ev.record(self.dev.copy)
                b0 = (j - 1) // REFILL_EVENT_EVERY * REFILL_EVENT_EVERY
                self._pending.extend((ev, lo + b, *pairs[b]) for b in range(b0, j))
        self.lent = 0

    def put(self, slot: int, layer: int, expert: int, arena: Arena) -> None:
        """Copy expert (layer, expert) into `slot` now, on the copy stream: the slot's owner turns non-resident and
        the newcomer resident at once, so the caller orders the copy after the old owner's readers and the new
        one's readers after the copy (a layer-major prompt's admissions, accel/layer_major.py)."""
        old = self.owner[slot]
        if old is not None and self.slot_of[old] == slot:
            self.slot_of[old] = -1
        self._load(slot, layer, expert, arena)
        self.slot_of[layer, expert] = slot
        self.version += 1

    def rehome(self, home: list, arena: Arena, after_event) -> int:
        """Give every usable slot whose owner is not home[s] its home expert back once `after_event` has completed
        (a layer-major prompt's end: the decode residency it started from); they become resident when the copies
        land (`poll`): one copy and one event a run of neighbouring slots taking a layer's neighbouring experts, at
        most REFILL_EVENT_EVERY. Returns the slots refilled."""
        moved = [s for s in range(min(len(home), self.usable)) if self.owner[s] != home[s]]
        if not moved:
            return 0
        self.dev.copy.wait(after_event)
        for s in moved:
            old = self.owner[s]
            if old is not None and self.slot_of[old] == s:
                self.slot_of[old] = -1
            self.owner[s] = None
        self.version += 1
        i = 0
        while i < len(moved):                            # runs of neighbouring slots taking neighbouring experts
            s0, j = moved[i], i + 1
            if home[s0] is None:
                i = j
                continue
            l, e0 = home[s0]
            while j < len(moved) and j - i < REFILL_EVENT_EVERY and moved[j] == s0 + j - i and \
                    home[moved[j]] == (l, e0 + j - i):
                j += 1
            self.dev.h2d_rows(self.buf, s0, arena.run(l, e0, e0 + j - i), self.dev.copy)
            ev = self.dev.event(timing=False)
            ev.record(self.dev.copy)
            for s in moved[i:j]:
                self.owner[s] = home[s]
                self._pending.append((ev, s, *home[s]))
            i = j
        return len(moved)

    def poll(self) -> int:
        """Mark experts whose copies have landed as resident; returns how many are still in flight. Each event is
        asked once: a refill's REFILL_EVENT_EVERY slots share one, and a query a slot was ~0.2 ms of host time at a
        prompt's start on the H200 (host_lines_start_q8_stop45.log; not the prompt's critical path there,
        start_ab_q8_stop50.log)."""
        still, landed = [], {}
        for ev, s, l, e in self._pending:
            done = landed.get(id(ev))           # the event lives in _pending meanwhile: its id is not reused
            if done is None:
                done = landed[id(ev)] = ev.query()
            if done:
                if self.owner[s] == (l, e):
                    self.slot_of[l, e] = s
                    self.version += 1
            else:
                still.append((ev, s, l, e))
        self._pending = still
        return len(still)

    def apply_moves(self, moves, arena: Arena, after_event) -> int:
        """Adaptive-tier moves (policy.tier.Move): evict at once, load the newcomer, resident when landed."""
        if not moves:
            return 0
        self.dev.copy.wait(after_event)
        pending = {s for _, s, _, _ in self._pending}
        free = [s for s in range(self.usable) if self.owner[s] is None and s not in pending]
        done = 0
        for m in moves:
            if m.victim is None:
                if not free:
                    continue
                s = free.pop()
            else:
                s = int(self.slot_of[m.layer, m.victim])
                if s < 0:
                    continue
                self.slot_of[m.layer, m.victim] = -1
                self.version += 1
            self.owner[s] = None
            self._load(s, m.layer, m.expert, arena)
            ev = self.dev.event(timing=False)
            ev.record(self.dev.copy)
            self._pending.append((ev, s, m.layer, m.expert))
            done += 1
        return done
