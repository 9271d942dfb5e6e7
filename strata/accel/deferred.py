"""A prompt chunk's MoE block issued after the next chunk's dense part (ours; layer_major.run's chunks).

Layer by layer, chunk j+1's dense part (its attention reads the keys chunks 0..j wrote in this layer's dense parts)
does not read chunk j's MoE block, nor does the block read it. So the block of chunk j can wait: its routing goes
to the host and its sync event is recorded, the model code goes on, and the block (the routing sync, the host's
row layout and tables, the launches) runs when chunk j+1 reaches its own block, with chunk j+1's dense part already
queued: the GPU computes that while the host lays chunk j out, where it idled before.

The model code meets the block's output as a `Lazy` value: the ops that take it (the residual adds, DeviceOps.add)
are recorded on the block and run, in their order, once it is issued; the layer-major loop records its copy into
the residual stream likewise. The arithmetic is the same launches on the same inputs, in another issue order: the
same bits.
"""

from __future__ import annotations


class Lazy:
    """An array a deferred block computes: its output, or an op recorded on it (`value` once the block ran)."""

    __slots__ = ("block", "value")

    def __init__(self, block: "DeferredBlock"):
        self.block, self.value = block, None

    def __getattr__(self, name):     # an op that reads the array (shape, flags, ...) before the block has run
        raise TypeError(f"a deferred MoE block's output reached an op that cannot wait for it (it read .{name}): "
                        "only DeviceOps.add records itself on the block (strata/accel/deferred.py)")


class DeferredBlock:
    """One chunk's MoE block, waiting: issue() runs it (routing sync onward) and returns its output [T, D]. `key`:
    the chunk's first position (what the compute stream waits for before it reads the chunk's rows again, where
    the block runs on the side stream)."""

    def __init__(self, issue, key: int = 0):
        self._issue, self.key = issue, key
        self.out = Lazy(self)
        self._ops: list[tuple[Lazy, object, tuple]] | None = []
        self.reads = None

    def then(self, fn, *args) -> Lazy:
        """Record fn(*args) (Lazy args: their values) to run after the block; its result as a Lazy."""
        assert self._ops is not None, "an op recorded on a deferred block that has run: it would never run"
        node = Lazy(self)
        self._ops.append((node, fn, args))
        return node

    def resolve(self) -> None:
        """Run the block and the ops recorded on it, then let go of them: the block and its Lazy values refer to
        each other, and a cycle frees its arrays (the block's inputs, outputs, temporaries) only when Python's
        cyclic collector happens to run: on the GPU they stay in the memory pool's use meanwhile, past what the
        memory plan prices (tests/test_no_cycles.py)."""
        issue, ops = self._issue, self._ops
        self._issue = self._ops = None
        out, self.out = self.out, None
        out.value = issue()
        for node, fn, args in ops:
            node.value = fn(*(a.value if isinstance(a, Lazy) else a for a in args))
        # what the block and its ops read that others made (its inputs, the residual): alive while the block is,
        # which the side stream's join keeps until the compute stream has waited for it (moe_block._beside). Not the
        # Lazy values: the block made them on its own stream, whose later allocations come after its reads
        self.reads = (issue, [a for _, _, args in ops for a in args if not isinstance(a, Lazy)])
