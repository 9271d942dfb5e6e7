"""One-token runs of 32-weight blocks against Q8_0 activations (34 bytes: fp16 d | qs[32]), in registers.

    run(w, o, a, ao, dy, b, acc) -> float32
      w, o   the row's block at byte o (then o + bs, ...); a, ao the matching activation block (34 bytes each)
      dy, b  dy[b + i] is activation block b + i's scale (loops.act_scales); acc the row's running float32 sum

Each block gives signed int8 codes; Σ code·a is exact as pmaddubsw(|code|, a·sign(code)) then pmaddwd by ones
(|code| <= 128 and |a| <= 127: every i16 pair sum stays below 2^15). The n blocks' horizontal sums share one
reduction tree (runs.hsums; integer sums are exact in any grouping); each block's float32 value is then formed
with the same IEEE operations, in the same order, as rows.blk_q8_0 / blk_q4_0 / blk_d_sumi, and added to acc in
block order (docs/NUMERICS.md). Legend: n blocks per run (8, 4, 2, 1).
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from strata.accel.cpu import _vec
from strata.accel.cpu._llvm import F32T, I8, I64, load_at, vec
from strata.accel.cpu._vec import VB
from strata.accel.cpu.decode import _KV_IQ4NL, _nib
from strata.accel.cpu.runs import _add_in_order, _f16s, hsums, one_token

ACT_BYTES = 34  # block_q8_0


def _sdot(v: VB, codes, act):
    """Σ code·a over 32 signed bytes each -> <8 x i32> (exact)."""
    b = v.b
    v32 = vec(I8, 32)
    absf = cgutils.get_or_insert_function(b.module, ir.FunctionType(v32, [v32, ir.IntType(1)]), "llvm.abs.v32i8")
    mag = b.call(absf, [codes, ir.Constant(ir.IntType(1), 0)])          # |−128| wraps to 128: unsigned below
    if _vec._AVX2:
        sgn = cgutils.get_or_insert_function(b.module, ir.FunctionType(v32, [v32, v32]), "llvm.x86.avx2.psign.b")
        sa = b.call(sgn, [act, codes])                                    # a·sign(code) (0 where code is 0)
    else:
        zero = v.K([0] * 32)
        neg = b.icmp_signed("<", codes, zero)
        sa = b.select(neg, b.sub(zero, act), b.select(b.icmp_signed("==", codes, zero), zero, act))
    return v.maddwd(v.maddubs(mag, sa), v.K([1] * 16, 16))


def q8_0(v: VB):  # d | qs[32]
    return v.ld(2, 32)


def q4_0(v: VB):  # d | qs[16]: nibble − 8
    return v.sub(_nib(v, v.ld(2, 16)), 8)


def iq4_nl(v: VB):  # d | qs[16]: the non-linear table
    return v.lut16(_KV_IQ4NL, _nib(v, v.ld(2, 16)))


def run(codes, bs: int, n: int, formula: str):
    """The intrinsic for n blocks of bs bytes whose fp16 scale dx is at byte 0. formula: "q8_0" f(sumi)·(dx·dy),
    "q4_0" (f(sumi)·dx)·dy, "d_sumi" (dx·dy)·f(sumi) — rows.py's per-block expressions, operand for operand."""

    def emit(builder, wp, ap, dp, acc):
        gep = lambda p, k: builder.gep(p, [ir.Constant(I64, k)])  # noqa: E731
        vecs = []
        for i in range(n):
            v = VB(builder, gep(wp, bs * i), None, None, gep(ap, ACT_BYTES * i))
            vecs.append(_sdot(v, codes(v), v.lda(2, 32)))
        sums = hsums(builder, vecs)                                   # <n x i32>, block i in lane i
        fs = builder.sitofp(sums, vec(F32T, n))
        dx = _f16s(builder, [gep(wp, bs * i) for i in range(n)])
        dyv = load_at(builder, dp, vec(F32T, n), align=4)
        if formula == "q8_0":
            x = builder.fmul(fs, builder.fmul(dx, dyv))
        elif formula == "q4_0":
            x = builder.fmul(builder.fmul(fs, dx), dyv)
        else:
            x = builder.fmul(builder.fmul(dx, dyv), fs)
        return _add_in_order(builder, acc, x, n)

    return one_token(f"{codes.__name__}_x{n}", emit)


def _runs(codes, bs, formula):
    return tuple(run(codes, bs, n, formula) for n in (8, 4, 2, 1))


q8_0_x8, q8_0_x4, q8_0_x2, q8_0_x1 = _runs(q8_0, 34, "q8_0")
q4_0_x8, q4_0_x4, q4_0_x2, q4_0_x1 = _runs(q4_0, 18, "q4_0")
iq4_nl_x8, iq4_nl_x4, iq4_nl_x2, iq4_nl_x1 = _runs(iq4_nl, 18, "d_sumi")
