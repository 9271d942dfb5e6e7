"""accel/deferred.py's DeferredBlock and Lazy, alone: the ops recorded on a block run after it, in their order,
on the values of the Lazy arguments; an op that reads a Lazy before the block has run fails with a clear error, as
does one recorded after; a block that has run is no reference cycle (its arrays free when dropped)."""

import gc

import numpy as np
import pytest

from strata.accel.deferred import DeferredBlock, Lazy


def test_recorded_ops_run_after_the_block_in_order_on_its_values():
    ran = []

    def issue():
        ran.append("block")
        return 10

    b = DeferredBlock(issue)
    out = b.out
    s = b.then(lambda x, y: ran.append("add") or x + y, 5, b.out)          # x + block
    d = b.then(lambda x: ran.append("copy") or 2 * x, s)                  # then a copy of that
    assert isinstance(s, Lazy) and s.block is b and ran == [] and s.value is None
    b.resolve()
    assert ran == ["block", "add", "copy"]
    assert (out.value, s.value, d.value) == (10, 15, 30)


def test_an_op_that_reads_a_lazy_fails_clearly():
    b = DeferredBlock(lambda: 0)
    with pytest.raises(TypeError, match="deferred MoE block's output.*read .shape"):
        b.out.shape


def test_an_op_recorded_after_the_block_ran_fails():
    b = DeferredBlock(lambda: 0)
    b.resolve()
    with pytest.raises(AssertionError, match="has run: it would never run"):
        b.then(lambda x: x, 1)


def test_a_block_that_ran_is_no_cycle():
    """The block and its Lazy values refer to each other until it runs; after, dropping them frees their arrays at
    once, not when the cyclic collector next runs (on the GPU: the memory pool grows by what cycles keep)."""
    def run() -> float:
        x = np.ones(1 << 16)
        b = DeferredBlock(lambda: x * 2)
        s = b.then(lambda u, v: u + v, x, b.out)
        b.resolve()
        return s.value[0]                    # b, s and x dropped on return

    gc.collect()
    gc.disable()
    try:
        assert run() == 3.0
        assert gc.collect() == 0
    finally:
        gc.enable()
