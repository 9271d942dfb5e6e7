"""Numba intrinsics the CPU kernels need and Numba lacks: raw loads at byte offsets, bit casts, exact integer
vector dot products, atomics, a cycle counter, a spin hint, and arrays over raw addresses.

Why intrinsics: Numba types int32·int32 as int64, so a plain `s += w[j] * a[j]` loop never becomes the
vpmaddwd-style code a q8 dot needs, and its wraparound index checks block vectorisation. These functions emit
LLVM IR with explicit vector types instead; LLVM lowers them for the host CPU (AVX2, AVX-512, NEON). Integer
sums are exact, so the vector width never changes a result.

Offsets are in BYTES from the start of an array's data, whatever its dtype (the kernels walk packed blocks).
"""

from __future__ import annotations

import platform

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

I8, I16, I32, I64 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32T = ir.FloatType()
_X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "x86")


def vec(t: ir.Type, n: int) -> ir.VectorType:
    return ir.VectorType(t, n)


def byte_ptr(context, builder, arrty, arr, off):
    """i8* to byte `off` of an array's data."""
    a = context.make_array(arrty)(context, builder, arr)
    p = builder.bitcast(a.data, I8.as_pointer())
    return builder.gep(p, [off])


def load_at(builder, p, ty, align=1):
    return builder.load(builder.bitcast(p, ty.as_pointer()), align=align)


def store_at(builder, v, p, align=1):
    builder.store(v, builder.bitcast(p, v.type.as_pointer()), align=align)


def reduce_add(builder, v):
    n, w = v.type.count, v.type.element.width
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v.type.element, [v.type]),
                                        f"llvm.vector.reduce.add.v{n}i{w}")
    return builder.call(fn, [v])


# --- scalar loads (little-endian, unaligned) -------------------------------------------------------------------
def _scalar_load(name, ity, nbty, signed):
    @intrinsic
    def load(typingctx, arr, off):
        if not isinstance(arr, types.Array):
            return None

        def codegen(context, builder, sig, args):
            v = load_at(builder, byte_ptr(context, builder, sig.args[0], args[0], args[1]), ity)
            if ity is F32T or ity.width == 64:
                return v
            return builder.sext(v, I64) if signed else builder.zext(v, I64)

        return nbty(arr, types.int64), codegen

    load.__name__ = name
    return load


ld_u8 = _scalar_load("ld_u8", I8, types.int64, False)
ld_i8 = _scalar_load("ld_i8", I8, types.int64, True)
ld_u16 = _scalar_load("ld_u16", I16, types.int64, False)
ld_i16 = _scalar_load("ld_i16", I16, types.int64, True)
ld_u32 = _scalar_load("ld_u32", I32, types.int64, False)
ld_i64 = _scalar_load("ld_i64", I64, types.int64, True)
ld_f32 = _scalar_load("ld_f32", F32T, types.float32, False)


@intrinsic
def st_u8(typingctx, arr, off, val):
    def codegen(context, builder, sig, args):
        store_at(builder, builder.trunc(args[2], I8), byte_ptr(context, builder, sig.args[0], args[0], args[1]))
        return context.get_dummy_value()

    return types.void(arr, types.int64, types.int64), codegen


@intrinsic
def st_u16(typingctx, arr, off, val):
    def codegen(context, builder, sig, args):
        store_at(builder, builder.trunc(args[2], I16), byte_ptr(context, builder, sig.args[0], args[0], args[1]))
        return context.get_dummy_value()

    return types.void(arr, types.int64, types.int64), codegen


@intrinsic
def bits_f32(typingctx, x):
    """int (low 32 bits) -> float32 with those bits."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.trunc(args[0], I32), F32T)

    return types.float32(types.int64), codegen


@intrinsic
def f32_bits(typingctx, x):
    """float32 -> its 32 bits as a non-negative int64."""
    def codegen(context, builder, sig, args):
        return builder.zext(builder.bitcast(args[0], I32), I64)

    return types.int64(types.float32), codegen


# --- float conversions (integer bit work, exact, branch-free) ------------------------------------------------------
def _half_to_float(builder, h32):
    """IEEE half bits (i32, 0..65535) -> float: normals and inf/NaN by moving bits, subnormals as m·2^-24."""
    c = lambda v: ir.Constant(I32, v)  # noqa: E731
    sign = builder.shl(builder.and_(h32, c(0x8000)), c(16))
    e = builder.and_(builder.lshr(h32, c(10)), c(0x1F))
    m13 = builder.shl(builder.and_(h32, c(0x3FF)), c(13))
    normal = builder.or_(builder.or_(sign, builder.shl(builder.add(e, c(112)), c(23))), m13)
    special = builder.or_(builder.or_(sign, c(0x7F800000)), m13)
    sub = builder.fmul(builder.sitofp(builder.and_(h32, c(0x3FF)), F32T), ir.Constant(F32T, 2.0**-24))
    sub = builder.or_(builder.bitcast(sub, I32), sign)
    bits = builder.select(builder.icmp_unsigned("==", e, c(0)), sub,
                          builder.select(builder.icmp_unsigned("==", e, c(31)), special, normal))
    return builder.bitcast(bits, F32T)


def _f16c() -> bool:
    """F16C on the compile target (Numba targets the host unless NUMBA_CPU_NAME/FEATURES say otherwise)."""
    from numba.core import config

    if not _X86 or config.CPU_NAME or config.CPU_FEATURES:
        return False
    import llvmlite.binding as llvm

    return bool(llvm.get_host_cpu_features().get("f16c", False))


_F16C = _f16c()


@intrinsic
def f16_at(typingctx, arr, off):
    """The fp16 at byte `off` of an array, widened exactly to float32 (vcvtph2ps with F16C: the same value; a
    signalling-NaN scale comes out quiet, which no result can show, since every use multiplies it)."""
    def codegen(context, builder, sig, args):
        h = load_at(builder, byte_ptr(context, builder, sig.args[0], args[0], args[1]), I16)
        if _F16C:
            return builder.fpext(builder.bitcast(h, ir.HalfType()), F32T)
        return _half_to_float(builder, builder.zext(h, I32))

    return types.float32(arr, types.int64), codegen


@intrinsic
def half_to_f32(typingctx, h):
    """Half bits held in an integer -> float32 (exact)."""
    def codegen(context, builder, sig, args):
        return _half_to_float(builder, builder.trunc(args[0], I32))

    return types.float32(types.int64), codegen


@intrinsic
def e8m0_half(typingctx, e):
    """``ggml_e8m0_to_fp32_half``: 2^(e − 128) as float32 bits (e < 2 gives the subnormals 2^-128, 2^-127)."""
    def codegen(context, builder, sig, args):
        e32 = builder.trunc(args[0], I32)
        small = builder.shl(ir.Constant(I32, 0x00200000), e32)
        big = builder.shl(builder.sub(e32, ir.Constant(I32, 1)), ir.Constant(I32, 23))
        return builder.bitcast(builder.select(builder.icmp_unsigned("<", e32, ir.Constant(I32, 2)), small, big), F32T)

    return types.float32(types.int64), codegen


# --- exact integer dot products over n lanes -------------------------------------------------------------------
def _dot(n: int, wbits: int, abits: int):
    """Σ_j w[j]·a[j] over n lanes of signed wbits/abits integers at byte offsets -> int64 (exact)."""

    @intrinsic
    def dot(typingctx, w, wo, a, ao):
        def codegen(context, builder, sig, args):
            x = load_at(builder, byte_ptr(context, builder, sig.args[0], args[0], args[1]), vec(ir.IntType(wbits), n))
            y = load_at(builder, byte_ptr(context, builder, sig.args[2], args[2], args[3]), vec(ir.IntType(abits), n))
            x32 = builder.sext(x, vec(I32, n)) if wbits < 32 else x
            y32 = builder.sext(y, vec(I32, n)) if abits < 32 else y
            return builder.sext(reduce_add(builder, builder.mul(x32, y32)), I64)

        return types.int64(w, types.int64, a, types.int64), codegen

    dot.__name__ = f"dot_i{wbits}_i{abits}_{n}"
    return dot


dot_i8_i8_32 = _dot(32, 8, 8)        # codes · Q8_0/Q8_1 quants (|sum| < 2^20)
dot_i16_i8_256 = _dot(256, 16, 8)    # weff (scale·code, |.| <= 4096) · Q8_K quants (|sum| < 2^28)
dot_i32_i16_16 = _dot(16, 32, 16)    # mins/signs · Q8_K bsums


# --- atomics on int64 arrays (element index, not bytes) ----------------------------------------------------------
def _elem_ptr(context, builder, arrty, arr, idx):
    a = context.make_array(arrty)(context, builder, arr)
    return builder.gep(a.data, [idx])


@intrinsic
def atomic_add(typingctx, arr, idx, val):
    """arr[idx] += val (seq_cst); returns the old value."""
    def codegen(context, builder, sig, args):
        return builder.atomic_rmw("add", _elem_ptr(context, builder, sig.args[0], args[0], args[1]), args[2],
                                  "seq_cst")

    return types.int64(arr, types.intp, types.int64), codegen


@intrinsic
def atomic_cas(typingctx, arr, idx, old, new):
    """If arr[idx] == old: arr[idx] = new and True (seq_cst); else False."""
    def codegen(context, builder, sig, args):
        res = builder.cmpxchg(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), args[2], args[3],
                              "seq_cst", "seq_cst")
        return builder.extract_value(res, 1)

    return types.boolean(arr, types.intp, types.int64, types.int64), codegen


@intrinsic
def atomic_load(typingctx, arr, idx):
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_elem_ptr(context, builder, sig.args[0], args[0], args[1]), "seq_cst", 8)

    return types.int64(arr, types.intp), codegen


@intrinsic
def atomic_store(typingctx, arr, idx, val):
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _elem_ptr(context, builder, sig.args[0], args[0], args[1]), "seq_cst", 8)
        return context.get_dummy_value()

    return types.void(arr, types.intp, types.int64), codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle/tick counter (rdtsc on x86); the pool calibrates ticks per second once."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(I64, []), "llvm.readcyclecounter")
        return builder.call(fn, [])

    return types.int64(), codegen


@intrinsic
def prefetch(typingctx, arr, off, n):
    """Prefetch the 64-byte lines of bytes off..off+n of an array (clamped to it) into the caches: a row of
    weights ahead of the one being read, which the hardware streamers do not fetch across a 4 KiB page."""
    def codegen(context, builder, sig, args):
        arrty = sig.args[0]
        a = context.make_array(arrty)(context, builder, args[0])
        size = builder.mul(a.nitems, ir.Constant(I64, context.get_abi_sizeof(context.get_data_type(arrty.dtype))))
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]), "llvm.prefetch.p0")
        start = args[1]
        end = builder.add(args[1], args[2])
        lim = builder.select(builder.icmp_signed("<", end, size), end, size)
        with cgutils.for_range_slice(builder, start, lim, ir.Constant(I64, 64), intp=I64) as (off, _):
            builder.call(fn, [byte_ptr(context, builder, arrty, args[0], off), ir.Constant(I32, 0),
                              ir.Constant(I32, 3), ir.Constant(I32, 1)])
        return context.get_dummy_value()

    return types.void(arr, types.int64, types.int64), codegen


@intrinsic
def spin_pause(typingctx):
    """x86 `pause` in spin loops (kinder to a sibling hyperthread); nothing elsewhere."""
    def codegen(context, builder, sig, args):
        if _X86:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def addr_ptr(typingctx, addr):
    """An integer address -> void* (for numba.carray over memory the pool's caller keeps alive)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(types.int64), codegen


# the C signature of the row kernels' entry points (entry.py):
# (qt, w*, w_bytes, row_bytes, r0, r1, a*, a_bytes, a_row_bytes, T, out*, out_len, out_stride, ws*, ws_bytes)
_KPTR = (1, 6, 10, 13)


@intrinsic
def call_rows(typingctx, fn, qt, w, wn, wrow, r0, r1, a, an, arow, t, out, on, ostride, ws, wsn):
    """Call a row kernel through its C function pointer `fn` (all arguments int64; buffers as addresses).
    The scheduler calls the kernels this way rather than linking them, so compiling it does not re-optimise
    every kernel (Numba re-optimises linked code at each level of calls between compiled functions)."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t if i in _KPTR else I64 for i in range(15)])
        fp = builder.inttoptr(args[0], fnty.as_pointer())
        call_args = [builder.inttoptr(v, cgutils.voidptr_t) if i in _KPTR else v for i, v in enumerate(args[1:])]
        builder.call(fp, call_args)
        return context.get_dummy_value()

    return types.void(*([types.int64] * 16)), codegen


@intrinsic
def call_sleep(typingctx, fn, us):
    """Call `int usleep(unsigned)` through its C function pointer `fn` (an address from ctypes): a worker's doze
    that never returns to Python, so waking from it needs no GIL (the pool's ctl holds the address)."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(I32, [I32])
        builder.call(builder.inttoptr(args[0], fnty.as_pointer()), [builder.trunc(args[1], I32)])
        return context.get_dummy_value()

    return types.void(types.int64, types.int64), codegen


def usleep_address() -> int:
    """libc's usleep, for call_sleep; 0 where it cannot be found (the pool then parks without dozing)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        return int(ctypes.cast(libc.usleep, ctypes.c_void_p).value or 0)
    except (OSError, AttributeError):
        return 0


@intrinsic
def data_addr(typingctx, arr):
    """An array's data address, inside Numba code."""
    def codegen(context, builder, sig, args):
        return builder.ptrtoint(context.make_array(sig.args[0])(context, builder, args[0]).data, I64)

    return types.int64(arr), codegen


def address(a: np.ndarray) -> int:
    """The data address of an array (the pool passes job buffers to its workers this way)."""
    return a.__array_interface__["data"][0]
