"""One-token block runs: n consecutive weight blocks of a row against one Q8_K activation row, in registers.

    run(w, o, a, ao, dy, b, acc) -> float32
      w, o   the row's block at byte o (then o + bs, o + 2·bs, ...)
      a, ao  the activation block matching it (292 bytes each: f32 d | qs[256] | bsums[16])
      dy, b  dy[b + i] is activation block b + i's scale (loops.act_scales)
      acc    the row's running float32 sum; each block's value is added to it in block order

A block body (`VB` -> exact i32 vectors and the byte offsets of its fp16 scales) gives the integer sums; the
horizontal reductions of all n blocks share one pairwise-add tree (integer sums are exact, so the grouping
cannot change them); each block's float32 value is then formed with the same IEEE operations as rows.blk_mins /
rows.blk_single (one vector lane per block), and the values are added to acc one by one in block order
(docs/NUMERICS.md). This keeps the accumulator out of memory and amortises the horizontal reductions, which
dominated a one-token K-quant block. IQ2_XS makes its sign bytes and multipliers in vectors (no ksigns loads).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from strata.accel.cpu._llvm import F32T, I16, I32, I64, _half_to_float, _F16C, byte_ptr, load_at, store_at, vec
from strata.accel.cpu._vec import VB
from strata.accel.cpu import _vec
from strata.accel.cpu import decode as D
from strata.accel.cpu.decode import _scales_k4

ACT_BYTES = 292  # block_q8_K


def _shuf(b: ir.IRBuilder, x, y, idx):
    idx = list(idx)
    return b.shuffle_vector(x, y, ir.Constant(vec(I32, len(idx)), idx))


def _pair_sums(b: ir.IRBuilder, x, y):
    """<8 x i32> x, y -> x's adjacent pair sums, then y's, inside each 128-bit half (vphaddd)."""
    ev, od = [0, 2, 8, 10, 4, 6, 12, 14], [1, 3, 9, 11, 5, 7, 13, 15]
    return b.add(_shuf(b, x, y, ev), _shuf(b, x, y, od))


def hsums(b: ir.IRBuilder, vs):
    """Horizontal sums of m <8 x i32> vectors (m = 1, 2, 4, 8) -> one <m x i32> of them in order: up to two
    levels of pair sums (then each input owns one lane per 128-bit half), the halves added, then pairs inside."""
    level, depth = list(vs), 0
    while len(level) > 1 and depth < 2:
        level = [_pair_sums(b, level[2 * i], level[2 * i + 1]) for i in range(len(level) // 2)]
        depth += 1
    out = []
    for v in level:
        v = b.add(_shuf(b, v, v, range(4)), _shuf(b, v, v, range(4, 8)))
        for _ in range(2 - depth):
            k = v.type.count
            v = b.add(_shuf(b, v, v, range(0, k, 2)), _shuf(b, v, v, range(1, k, 2)))
        out.append(v)
    return out[0] if len(out) == 1 else _shuf(b, out[0], out[1], range(8))


def _f16s(b: ir.IRBuilder, ptrs):
    """The fp16 values at the given byte pointers -> <m x float> (vcvtph2ps with F16C; exact)."""
    hs = [load_at(b, p, I16) for p in ptrs]
    if _F16C:
        v = ir.Constant(vec(I16, len(hs)), None)
        for i, h in enumerate(hs):
            v = b.insert_element(v, h, ir.Constant(I32, i))
        return b.fpext(b.bitcast(v, vec(ir.HalfType(), len(hs))), vec(F32T, len(hs)))
    v = ir.Constant(vec(F32T, len(hs)), None)
    for i, h in enumerate(hs):
        v = b.insert_element(v, _half_to_float(b, b.zext(h, I32)), ir.Constant(I32, i))
    return v


def _values(builder, body, bs: int, n: int, tail, wp, ap, dp):
    """<n x float>: the values of n blocks at wp (activations at ap, their scales at dp), the scalar formula's
    own IEEE operations lane by lane (lane i = block i)."""
    gep = lambda p, k: builder.gep(p, [ir.Constant(I64, k)])  # noqa: E731
    vecs, halves = [], []
    for i in range(n):
        vs, hs = body(VB(builder, gep(wp, bs * i), None, None, gep(ap, ACT_BYTES * i)))
        vecs += vs
        halves += [gep(wp, bs * i + h) for h in hs]
    per, m = len(vecs) // n, len(vecs)
    pad = 1 << (m - 1).bit_length()   # the reduction tree takes a power of two: pad with zeros
    sums = hsums(builder, vecs + [ir.Constant(vecs[0].type, [0] * 8)] * (pad - m))
    if pad != m:
        sums = _shuf(builder, sums, sums, range(m))
    # lane j = per·i + k: block i's k-th integer sum and fp16 scale
    fs = builder.sitofp(sums, vec(F32T, m))
    dyv = load_at(builder, dp, vec(F32T, n), align=4)
    dyv = _shuf(builder, dyv, dyv, [j // per for j in range(m)])
    x = builder.fmul(builder.fmul(_f16s(builder, halves), dyv), fs)
    if per == 2:
        x = builder.fsub(_shuf(builder, x, x, range(0, m, 2)), _shuf(builder, x, x, range(1, m, 2)))
    elif tail is not None:
        x = builder.fmul(x, ir.Constant(vec(F32T, n), [tail] * n))
    return x


def _add_in_order(builder, s, x, n: int):
    for i in range(n):   # block values in block order
        s = builder.fadd(s, builder.extract_element(x, ir.Constant(I32, i)))
    return s


def one_token(name: str, emit):
    """A run intrinsic `blocks(w, o, a, ao, dy, bi, acc) -> float32`: emit(builder, wp, ap, dp, acc) gets i8
    pointers to the weight block at o, the activation block at ao and dy[bi] (bytes), and returns the new sum."""

    @intrinsic
    def blocks(typingctx, w, o, a, ao, dy, bi, acc):
        def codegen(context, builder, sig, args):
            wp = byte_ptr(context, builder, sig.args[0], args[0], args[1])
            ap = byte_ptr(context, builder, sig.args[2], args[2], args[3])
            dp = byte_ptr(context, builder, sig.args[4], args[4], builder.mul(args[5], ir.Constant(I64, 4)))
            return emit(builder, wp, ap, dp, args[6])

        return types.float32(w, types.int64, a, types.int64, dy, types.int64, types.float32), codegen

    blocks.__name__ = name
    return blocks


def run(body, bs: int, n: int, tail: float | None = None):
    """The intrinsic for n consecutive blocks of bs bytes. body(v) -> (vecs, halves): one or two <8 x i32>
    exact integer vectors and the block-relative offsets of as many fp16 scales; the block value is
    (h0·dy)·f(s0) − (h1·dy)·f(s1) for two, (h0·dy)·f(s0) [· tail] for one."""
    return one_token(f"{body.__name__}_x{n}", lambda builder, wp, ap, dp, acc: _add_in_order(
        builder, acc, _values(builder, body, bs, n, tail, wp, ap, dp), n))


def run_tokens(body, bs: int, n: int, T: int, tail: float | None = None):
    """`run` for T tokens at once: blocks(w, o, a, ao, arow, dy, bi, nb, accs) adds the n blocks' values for
    token t (activations at ao + t·arow, scales at dy[bi + t·nb]) to accs[t], in block order. Every token's
    code is emitted before any store, so LLVM shares each weight load and unpack across the T tokens."""

    @intrinsic
    def blocks(typingctx, w, o, a, ao, arow, dy, bi, nb, accs):
        def codegen(context, builder, sig, args):
            wp = byte_ptr(context, builder, sig.args[0], args[0], args[1])
            accp = byte_ptr(context, builder, sig.args[8], args[8], ir.Constant(I64, 0))
            sums = []
            for t in range(T):
                k = ir.Constant(I64, t)
                ap = byte_ptr(context, builder, sig.args[2], args[2], builder.add(args[3], builder.mul(args[4], k)))
                di = builder.add(args[6], builder.mul(args[7], k))
                dp = byte_ptr(context, builder, sig.args[5], args[5], builder.mul(di, ir.Constant(I64, 4)))
                acc = load_at(builder, builder.gep(accp, [ir.Constant(I64, 4 * t)]), F32T, align=4)
                sums.append(_add_in_order(builder, acc, _values(builder, body, bs, n, tail, wp, ap, dp), n))
            for t, s in enumerate(sums):
                store_at(builder, s, builder.gep(accp, [ir.Constant(I64, 4 * t)]), align=4)
            return context.get_dummy_value()

        return types.void(w, types.int64, a, types.int64, types.int64, dy, types.int64, types.int64, accs), codegen

    blocks.__name__ = f"{body.__name__}_x{n}_t{T}"
    return blocks


# --- block bodies ----------------------------------------------------------------------------------------------
def _q45k(v: VB, qs_off: int, qh_off: int | None):
    """Q4_K / Q5_K: Σ sc_s·code·a per half-group (pmaddubsw, then pmaddwd by the scale) and Σ m_j·bsums."""
    sc, m = _scales_k4(v)
    qh = v.ld(qh_off, 32) if qh_off is not None else None
    acc = None
    for g in range(4):
        q = v.ld(qs_off + 32 * g, 32)
        for h, c in enumerate((v.and_(q, 15), v.shr(q, 4))):
            if qh is not None:
                c = v.or_(c, v.shl(v.and_(v.shr(qh, 2 * g + h), 1), 4))
            t = v.maddwd(v.maddubs(c, v.lda(4 + 64 * g + 32 * h, 32)), v.shuf(sc, [2 * g + h] * 16))
            acc = t if acc is None else v.b.add(acc, t)
    mins = v.maddwd(v.lda(260, 16, 16), v.zx(v.shuf(m, [j // 2 for j in range(16)]), 16))
    return [acc, mins], [0, 2]


def q4_k(v: VB):
    return _q45k(v, 16, None)


def q5_k(v: VB):
    return _q45k(v, 48, 16)




def q6_k(v: VB):
    """Q6_K: Σ sc_s·(q + 32)·a (q + 32 unsigned for pmaddubsw) − 32·Σ sc_s·bsums_s, one exact i32 vector."""
    sc = v.sx(v.ld(192, 16), 16)
    acc = None
    for n in range(2):
        ql = (v.ld(64 * n, 32), v.ld(64 * n + 32, 32))
        qh = v.ld(128 + 32 * n, 32)
        for k in range(4):
            low4 = v.and_(ql[k % 2], 15) if k < 2 else v.shr(ql[k % 2], 4)
            q = v.or_(low4, v.shl(v.and_(v.shr(qh, 2 * k), 3), 4))
            s = v.shuf(sc, [8 * n + 2 * k] * 8 + [8 * n + 2 * k + 1] * 8)
            t = v.maddwd(v.maddubs(q, v.lda(4 + 128 * n + 32 * k, 32)), s)
            acc = t if acc is None else v.b.add(acc, t)
    return [v.sub(acc, v.shl(v.maddwd(v.lda(260, 16, 16), sc), 5))], [208]


def _grid(chunks):
    """A grid i-quant (decode.py's 32-weight chunks): signs onto the activations, pmaddubsw with the grid bytes,
    pmaddwd by the odd multipliers."""
    def body(v: VB):
        acc = None
        for ib, rows, signs, (m0, m1) in chunks(v):
            sa = v.signed(v.lda(4 + 32 * ib, 32), signs)
            t = v.maddwd(v.maddubs(v.bytes_of(v.pack(rows), 32), sa), v.cat(v.bcast(m0, 8), v.bcast(m1, 8)))
            acc = t if acc is None else v.b.add(acc, t)
        return [acc], [0]

    body.__name__ = chunks.__name__.strip("_")
    return body


def iq2_xs(v: VB):
    """IQ2_XS with its sign bytes and multipliers made in vectors: ksigns[s] = s | parity(s) << 7 for the 7-bit
    s = qs >> 9; the odd multipliers 2·nibble + 1 of the 16 sub-blocks as one <16 x i16>."""
    grid = v.table("iq2xs", D._GRIDS["iq2xs"])
    s7 = v.shr(v.ld(2, 32, 16), 9)
    p = v.b.xor(s7, v.shr(s7, 4))
    p = v.b.xor(p, v.shr(p, 2))
    p = v.b.xor(p, v.shr(p, 1))
    sb = v.tr(v.or_(s7, v.shl(v.and_(p, 1), 7)), 8)   # <32 x i8>: the sign byte of each 8 weights
    sc = v.shuf(v.ld(66, 8), [j // 2 for j in range(16)])
    mult = v.add(v.shl(v.zx(v.and_(v.shr(sc, v.K([4 * (j % 2) for j in range(16)])), 15), 16), 1), 1)
    acc = None
    for i in range(8):
        rows = [v.tload(grid, v.and_(v.ld(2 + 2 * (4 * i + l), 1, 16), 511)) for l in range(4)]
        sa = _signed(v, v.lda(4 + 32 * i, 32), v.shuf(sb, range(4 * i, 4 * i + 4)))
        t = v.maddwd(v.maddubs(v.bytes_of(v.pack(rows), 32), sa), v.shuf(mult, [2 * i] * 8 + [2 * i + 1] * 8))
        acc = t if acc is None else v.b.add(acc, t)
    return [acc], [0]


def _signed(v: VB, a, sign_bytes):
    """a <32 x i8> with lane j negated where bit (j % 8) of sign_bytes[j // 8] is set (vpsignb on AVX2)."""
    if not _vec._AVX2:
        return v.signed(a, sign_bytes)
    from numba.core import cgutils

    rep = v.shuf(sign_bytes, [j // 8 for j in range(32)])
    bit = v.K([1 << (j % 8) for j in range(32)])
    neg = v.b.sext(v.b.icmp_unsigned("==", v.b.and_(rep, bit), bit), vec(ir.IntType(8), 32))   # −1 or 0
    fnty = ir.FunctionType(vec(ir.IntType(8), 32), [vec(ir.IntType(8), 32)] * 2)
    fn = cgutils.get_or_insert_function(v.b.module, fnty, "llvm.x86.avx2.psign.b")
    return v.b.call(fn, [a, v.or_(neg, 1)])


def _runs(body, bs, tail=None):
    return tuple(run(body, bs, n, tail) for n in (4, 3, 2, 1))


def _runs8(body, bs):
    return tuple(run_tokens(body, bs, n, 8) for n in (4, 3, 2, 1))


q4_k_x4, q4_k_x3, q4_k_x2, q4_k_x1 = _runs(q4_k, 144)
q5_k_x4, q5_k_x3, q5_k_x2, q5_k_x1 = _runs(q5_k, 176)
q6_k_x4, q6_k_x3, q6_k_x2, q6_k_x1 = _runs(q6_k, 210)
# eight tokens (a full MAXT job: most of a prompt's expert and dense work)
q4_k_x4_t8, q4_k_x3_t8, q4_k_x2_t8, q4_k_x1_t8 = _runs8(q4_k, 144)
q5_k_x4_t8, q5_k_x3_t8, q5_k_x2_t8, q5_k_x1_t8 = _runs8(q5_k, 176)
q6_k_x4_t8, q6_k_x3_t8, q6_k_x2_t8, q6_k_x1_t8 = _runs8(q6_k, 210)
iq2_xxs_x4, iq2_xxs_x3, iq2_xxs_x2, iq2_xxs_x1 = _runs(_grid(D._iq2_xxs), 66, 0.125)
iq2_xs_x4, iq2_xs_x3, iq2_xs_x2, iq2_xs_x1 = _runs(iq2_xs, 74, 0.125)
# IQ2_XS for 2..8 tokens, two blocks a call (flash-shape's gate and up: the prefill share's CPU experts)
iq2_xs_x2_t8, iq2_xs_x1_t8 = (run_tokens(iq2_xs, 74, n, 8, 0.125) for n in (2, 1))
iq2_xs_x2_t4, iq2_xs_x1_t4 = (run_tokens(iq2_xs, 74, n, 4, 0.125) for n in (2, 1))
iq2_xs_x2_t2, iq2_xs_x1_t2 = (run_tokens(iq2_xs, 74, n, 2, 0.125) for n in (2, 1))
iq2_s_x4, iq2_s_x3, iq2_s_x2, iq2_s_x1 = _runs(_grid(D._iq2_s), 82, 0.125)
iq3_xxs_x4, iq3_xxs_x3, iq3_xxs_x2, iq3_xxs_x1 = _runs(_grid(D._iq3_xxs), 98, 0.25)
iq3_s_x4, iq3_s_x3, iq3_s_x2, iq3_s_x1 = _runs(_grid(D._iq3_s), 110)
