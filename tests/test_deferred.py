"""accel/deferred.py's DeferredBlock and Lazy, alone: the ops recorded on a block run after it, in their order,
on the values of the Lazy arguments; an op that reads a Lazy before the block has run fails with a clear error."""

import pytest

from strata.accel.deferred import DeferredBlock, Lazy


def test_recorded_ops_run_after_the_block_in_order_on_its_values():
    ran = []

    def issue():
        ran.append("block")
        return 10

    b = DeferredBlock(issue)
    s = b.then(lambda x, y: ran.append("add") or x + y, 5, b.out)          # x + block
    d = b.then(lambda x: ran.append("copy") or 2 * x, s)                  # then a copy of that
    assert isinstance(s, Lazy) and s.block is b and ran == [] and s.value is None
    b.resolve()
    assert ran == ["block", "add", "copy"]
    assert (b.out.value, s.value, d.value) == (10, 15, 30)


def test_an_op_that_reads_a_lazy_fails_clearly():
    b = DeferredBlock(lambda: 0)
    with pytest.raises(TypeError, match="deferred MoE block's output.*read .shape"):
        b.out.shape
