"""A small vector-IR vocabulary for the block decoders (decode.py), and the decoder intrinsic factory.

A decoder turns one packed weight block into integer weights in a scratch array (int8 codes or int16
`scale·code` products, exact) plus a few integers in `aux`; the row kernels then take exact integer dot products
against the quantised activations and apply the type's float32 block formula. Everything here is integer
arithmetic on fixed-width vectors, so the result cannot depend on the vector width LLVM picks.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import config
from numba.extending import intrinsic

from strata.accel.cpu._llvm import _X86, I8, I16, I32, I64, byte_ptr, load_at, store_at, vec

# pshufb-based 16-entry lookups need AVX2 on the compile target; Numba targets the host unless told otherwise.
_AVX2 = False
if _X86 and not config.CPU_NAME and not config.CPU_FEATURES:
    import llvmlite.binding as _llvm

    _AVX2 = bool(_llvm.get_host_cpu_features().get("avx2", False))


class VB:
    """Vector builder over one block: `base` (i8*) is the block, `dst`/`aux` (i8*) the outputs; in a run over
    blocks (runs.py) `act` (i8*) is the activation block."""

    def __init__(self, builder: ir.IRBuilder, base, dst, aux, act=None):
        self.b, self.base, self.dst, self.aux, self.act = builder, base, dst, aux, act

    # --- memory ------------------------------------------------------------------------------------------------
    def ld(self, off: int, n: int, bits: int = 8):
        """<n x i{bits}> at byte `off` of the block (n == 1: a scalar)."""
        ty = ir.IntType(bits) if n == 1 else vec(ir.IntType(bits), n)
        return load_at(self.b, self.b.gep(self.base, [ir.Constant(I64, off)]), ty)

    def lda(self, off: int, n: int, bits: int = 8):
        """<n x i{bits}> at byte `off` of the activation block."""
        return load_at(self.b, self.b.gep(self.act, [ir.Constant(I64, off)]), vec(ir.IntType(bits), n))

    def ldd(self, off: int, n: int, bits: int):
        """<n x i{bits}> at byte `off` of dst (decoded scales)."""
        ty = ir.IntType(bits) if n == 1 else vec(ir.IntType(bits), n)
        return load_at(self.b, self.b.gep(self.dst, [ir.Constant(I64, off)]), ty)

    def put(self, where: str, byte_off: int, v):
        base = self.dst if where == "dst" else self.aux
        store_at(self.b, v, self.b.gep(base, [ir.Constant(I64, byte_off)]))

    def table(self, name: str, values: np.ndarray):
        """A read-only global array of integers (an i-quant grid) in this function's module."""
        mod = self.b.module
        ety = ir.IntType(values.dtype.itemsize * 8)
        try:
            return mod.get_global(name), ety
        except KeyError:
            aty = ir.ArrayType(ety, values.size)
            gv = ir.GlobalVariable(mod, aty, name)
            signed = values.reshape(-1).view(f"<i{values.dtype.itemsize}")  # LLVM constants are signed
            gv.initializer = ir.Constant(aty, [int(x) for x in signed])
            gv.global_constant = True
            gv.linkage = "internal"
            return gv, ety

    def tload(self, tab, idx):
        """tab[idx] for a scalar integer idx (any width)."""
        gv, ety = tab
        i = self.b.zext(idx, I64) if idx.type.width < 64 else idx
        return self.b.load(self.b.gep(gv, [ir.Constant(I64, 0), i]))

    # --- constants and shapes ----------------------------------------------------------------------------------
    @staticmethod
    def K(vals, bits: int = 8):
        return ir.Constant(vec(ir.IntType(bits), len(vals)), [int(v) for v in vals])

    def c(self, a, k):
        """k as a constant of a's type (splat for vectors); a value k passes through."""
        if isinstance(k, int):
            if isinstance(a.type, ir.VectorType):
                return ir.Constant(a.type, [k] * a.type.count)
            return ir.Constant(a.type, k)
        return k

    def shr(self, a, k):
        return self.b.lshr(a, self.c(a, k))

    def ashr(self, a, k):
        return self.b.ashr(a, self.c(a, k))

    def shl(self, a, k):
        return self.b.shl(a, self.c(a, k))

    def and_(self, a, k):
        return self.b.and_(a, self.c(a, k))

    def or_(self, a, k):
        return self.b.or_(a, self.c(a, k))

    def add(self, a, k):
        return self.b.add(a, self.c(a, k))

    def sub(self, a, k):
        return self.b.sub(a, self.c(a, k))

    def mul(self, a, k):
        return self.b.mul(a, self.c(a, k))

    def _ty(self, a, bits):
        t = ir.IntType(bits)
        return vec(t, a.type.count) if isinstance(a.type, ir.VectorType) else t

    def zx(self, a, bits):
        return self.b.zext(a, self._ty(a, bits))

    def sx(self, a, bits):
        return self.b.sext(a, self._ty(a, bits))

    def tr(self, a, bits):
        return self.b.trunc(a, self._ty(a, bits))

    def shuf(self, a, idx):
        return self.b.shuffle_vector(a, ir.Constant(a.type, None), ir.Constant(vec(I32, len(idx)), list(idx)))

    def cat(self, a, c):
        n = a.type.count + c.type.count
        return self.b.shuffle_vector(a, c, ir.Constant(vec(I32, n), list(range(n))))

    def bcast(self, s, n: int):
        v = self.b.insert_element(ir.Constant(vec(s.type, 1), None), s, ir.Constant(I32, 0))
        return self.shuf(v, [0] * n)

    def pack(self, scalars):
        """Scalars of one type -> a vector of them."""
        v = ir.Constant(vec(scalars[0].type, len(scalars)), None)
        for i, s in enumerate(scalars):
            v = self.b.insert_element(v, s, ir.Constant(I32, i))
        return v

    def bytes_of(self, v, n: int):
        """Reinterpret a vector (or scalar) as <n x i8>."""
        return self.b.bitcast(v, vec(I8, n))

    # --- lookups and signs ----------------------------------------------------------------------------------------
    def lut16(self, table, idx):
        """<32 x i8> of table[idx[j]] for indices 0..15 (pshufb on AVX2, a select tree elsewhere)."""
        if _AVX2:
            from numba.core import cgutils

            fnty = ir.FunctionType(vec(I8, 32), [vec(I8, 32), vec(I8, 32)])
            fn = cgutils.get_or_insert_function(self.b.module, fnty, "llvm.x86.avx2.pshuf.b")
            return self.b.call(fn, [self.K(list(table) * 2), idx])
        level = [self.K([t] * 32) for t in table]
        for bit in range(4):
            on = self.b.icmp_unsigned("!=", self.and_(idx, 1 << bit), self.K([0] * 32))
            level = [self.b.select(on, level[2 * i + 1], level[2 * i]) for i in range(len(level) // 2)]
        return level[0]

    # --- pairwise multiply-adds (exact: callers keep every i16 pair sum below 2^15) ----------------------------------
    def maddubs(self, u, sgn):
        """<2n x i8> unsigned u, signed s -> <n x i16>: u[2i]·s[2i] + u[2i+1]·s[2i+1] (vpmaddubsw on AVX2)."""
        n = u.type.count
        if _AVX2 and n == 32:
            from numba.core import cgutils

            fnty = ir.FunctionType(vec(I16, 16), [vec(I8, 32), vec(I8, 32)])
            fn = cgutils.get_or_insert_function(self.b.module, fnty, "llvm.x86.avx2.pmadd.ub.sw")
            return self.b.call(fn, [u, sgn])
        p = self.b.mul(self.zx(u, 16), self.sx(sgn, 16))
        return self.b.add(self.shuf(p, range(0, n, 2)), self.shuf(p, range(1, n, 2)))

    def maddwd(self, x, y):
        """<2n x i16> x, y -> <n x i32>: x[2i]·y[2i] + x[2i+1]·y[2i+1] (vpmaddwd on AVX2)."""
        n = x.type.count
        if _AVX2 and n == 16:
            from numba.core import cgutils

            fnty = ir.FunctionType(vec(I32, 8), [vec(I16, 16), vec(I16, 16)])
            fn = cgutils.get_or_insert_function(self.b.module, fnty, "llvm.x86.avx2.pmadd.wd")
            return self.b.call(fn, [x, y])
        p = self.b.mul(self.sx(x, 32), self.sx(y, 32))
        return self.b.add(self.shuf(p, range(0, n, 2)), self.shuf(p, range(1, n, 2)))

    def signed(self, g, sign_bytes):
        """g <32 x i8> with lane j negated where bit (j % 8) of sign_bytes[j // 8] is set (ggml's sign masks)."""
        rep = self.shuf(sign_bytes, [j // 8 for j in range(32)])
        neg = self.b.icmp_unsigned("!=", self.and_(rep, self.K([1 << (j % 8) for j in range(32)])),
                                   self.K([0] * 32))
        return self.b.select(neg, self.b.sub(self.K([0] * 32), g), g)


def decoder(build):
    """An intrinsic `dec(w, off, dst, aux)`: decode the block at byte `off` of `w` with `build(vb)`, which
    stores into dst/aux (scratch arrays the caller owns) through `vb.put`."""

    @intrinsic
    def dec(typingctx, w, off, dst, aux):
        def codegen(context, builder, sig, args):
            base = byte_ptr(context, builder, sig.args[0], args[0], args[1])
            d = byte_ptr(context, builder, sig.args[2], args[2], ir.Constant(I64, 0))
            x = byte_ptr(context, builder, sig.args[3], args[3], ir.Constant(I64, 0))
            build(VB(builder, base, d, x))
            return context.get_dummy_value()

        return types.void(w, types.int64, dst, aux), codegen

    dec.__name__ = build.__name__
    return dec


__all__ = ["VB", "decoder", "I8", "I16", "I32", "I64"]
