"""Write the ggml oracle fixtures for strata.quants (tests/test_quants_oracle.py reads them).

Calls ggml's own C library through ctypes; needs the llama.cpp build and sources of tools/build_llama_cpp.sh
and gcc. Uses only numpy + ctypes + libggml, never strata, so the fixtures are ggml's word. Run from anywhere:

    python golden/oracle/quants/make_oracle.py [--lib DIR] [--src LLAMA_CPP_SOURCE_DIR]

The shipped libggml-cpu compiles ggml-cpu/quants.c with -std=gnu11 -march=native, so GCC contracts a*b + c
into FMAs inside the generic dots. This script therefore also compiles that same quants.c with
-ffp-contract=off -mno-fma (a ~2 s gcc run) to get the generic C's arithmetic as written: ``dot_generic``.

Per weight type <NAME>.npz holds:
  x        [R, K] fp16-valued rows (stored as float16, exactly), quantised by ggml_quantize_chunk -> blocks
  blocks   [R, row_bytes] uint8, ggml's encoding (an all-ones importance matrix where ggml requires one)
  deq      [R, K] float32, ggml's to_float(blocks)
  xa       [T, K] float32 activation rows, a [T, act_row_bytes]: ggml's reference activation quantiser
  dot_cpu  [T, R] float32, the CPU backend's vec_dot (the SIMD kernel this machine's build selected)
  dot_generic [T, R] float32, ggml's portable ``ggml_vec_dot_*_generic`` C built without FMA contraction
  dot_generic_native [T, R] float32, the same functions from the shipped library (FMA-contracted)
  (both absent for float types)
act.npz holds rows and ggml's quantize_row_q8_0_ref / q8_1_ref / q8_K_ref outputs (+ the CPU from_float).
"""

from __future__ import annotations

import argparse
import ctypes as ct
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_LIB = ".llama-venv/lib/python3.11/site-packages/llama_cpp/lib"   # tools/build_llama_cpp.sh defaults
DEFAULT_SRC = ".llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp"

# ggml type ids (ggml.h enum ggml_type) and the generic dot's symbol suffix
TYPES = {
    "F32": 0,
    "F16": 1,
    "Q4_0": 2,
    "Q4_1": 3,
    "Q5_0": 6,
    "Q5_1": 7,
    "Q8_0": 8,
    "Q8_1": 9,
    "Q2_K": 10,
    "Q3_K": 11,
    "Q4_K": 12,
    "Q5_K": 13,
    "Q6_K": 14,
    "Q8_K": 15,
    "IQ2_XXS": 16,
    "IQ2_XS": 17,
    "IQ3_XXS": 18,
    "IQ1_S": 19,
    "IQ4_NL": 20,
    "IQ3_S": 21,
    "IQ2_S": 22,
    "IQ4_XS": 23,
    "IQ1_M": 29,
    "BF16": 30,
    "MXFP4": 39,
    "Q2_0": 42,
}
WEIGHTS = [
    "F32",
    "F16",
    "BF16",
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "IQ2_XXS",
    "IQ2_XS",
    "IQ2_S",
    "IQ3_XXS",
    "IQ3_S",
    "IQ1_S",
    "IQ1_M",
    "MXFP4",
    "Q2_0",
]
NAME_OF = {v: k for k, v in TYPES.items()}

TO_FLOAT = ct.CFUNCTYPE(None, ct.c_void_p, ct.c_void_p, ct.c_int64)
FROM_FLOAT = ct.CFUNCTYPE(None, ct.c_void_p, ct.c_void_p, ct.c_int64)
VEC_DOT = ct.CFUNCTYPE(
    None, ct.c_int, ct.c_void_p, ct.c_size_t, ct.c_void_p, ct.c_size_t, ct.c_void_p, ct.c_size_t, ct.c_int
)


class Traits(ct.Structure):  # struct ggml_type_traits (ggml.h)
    _fields_ = [
        ("type_name", ct.c_char_p),
        ("blck_size", ct.c_int64),
        ("blck_size_interleave", ct.c_int64),
        ("type_size", ct.c_size_t),
        ("is_quantized", ct.c_bool),
        ("to_float", ct.c_void_p),
        ("from_float_ref", ct.c_void_p),
    ]


class TraitsCpu(ct.Structure):  # struct ggml_type_traits_cpu (ggml-cpu.h)
    _fields_ = [
        ("from_float", ct.c_void_p),
        ("vec_dot", ct.c_void_p),
        ("vec_dot_type", ct.c_int),
        ("nrows", ct.c_int64),
    ]


def build_generic_nofma(src: str, libdir: str, out_dir: str) -> str:
    """Compile ggml-cpu/quants.c (the generic dots) with IEEE operations exactly as written."""
    g = os.path.join(src, "ggml")
    out = os.path.join(out_dir, "libquants_generic_nofma.so")
    cmd = [
        "gcc",
        "-O2",
        "-fPIC",
        "-shared",
        "-std=gnu11",
        "-march=native",
        "-mno-fma",
        "-ffp-contract=off",
        "-D_GNU_SOURCE",
        "-DGGML_BACKEND_BUILD",
        "-DGGML_SHARED",
        f"-I{g}/include",
        f"-I{g}/src",
        f"-I{g}/src/ggml-cpu",
        f"{g}/src/ggml-cpu/quants.c",
        "-o",
        out,
        f"-L{libdir}",
        "-lggml-base",
    ]
    subprocess.run(cmd, check=True)
    return out


class Ggml:
    def __init__(self, libdir: str, generic_lib: str):
        mode = os.RTLD_GLOBAL | os.RTLD_NOW
        self.base = ct.CDLL(os.path.join(libdir, "libggml-base.so"), mode=mode)
        self.cpu = ct.CDLL(os.path.join(libdir, "libggml-cpu.so"), mode=mode)  # exports ggml_table_f32_f16
        self.nofma = ct.CDLL(generic_lib, mode=mode)
        self.base.ggml_get_type_traits.restype = ct.POINTER(Traits)
        self.base.ggml_get_type_traits.argtypes = [ct.c_int]
        self.cpu.ggml_get_type_traits_cpu.restype = ct.POINTER(TraitsCpu)
        self.cpu.ggml_get_type_traits_cpu.argtypes = [ct.c_int]
        self.base.ggml_quantize_chunk.restype = ct.c_size_t
        self.base.ggml_quantize_chunk.argtypes = [
            ct.c_int,
            ct.c_void_p,
            ct.c_void_p,
            ct.c_int64,
            ct.c_int64,
            ct.c_int64,
            ct.c_void_p,
        ]
        self.base.ggml_quantize_requires_imatrix.restype = ct.c_bool
        self.cpu.ggml_cpu_init()

    def traits(self, t):
        return self.base.ggml_get_type_traits(t).contents

    def row_bytes(self, t, k):
        tr = self.traits(t)
        return k // tr.blck_size * tr.type_size

    def quantize(self, t, x):
        x = np.ascontiguousarray(x, np.float32)
        r, k = x.shape
        out = np.zeros((r, self.row_bytes(t, k)), np.uint8)
        imat = np.ones(k, np.float32)
        need = self.base.ggml_quantize_requires_imatrix(t)
        n = self.base.ggml_quantize_chunk(
            t, x.ctypes.data, out.ctypes.data, 0, r, k, imat.ctypes.data if need else None
        )
        assert n == out.nbytes, (NAME_OF[t], n, out.nbytes)
        return out

    def to_float(self, t, blocks, k):
        out = np.zeros((blocks.shape[0], k), np.float32)
        if t == TYPES["F32"]:  # ggml has no to_float for F32: the bytes are the values
            return np.ascontiguousarray(blocks).view(np.float32).copy()
        fn = TO_FLOAT(self.traits(t).to_float)
        for i in range(blocks.shape[0]):
            row = np.ascontiguousarray(blocks[i])
            fn(row.ctypes.data, out[i].ctypes.data, k)
        return out

    def from_float(self, t, x, ref=True):
        """ggml's reference quantiser (from_float_ref; Q8_K has none there: quantize_row_q8_K_ref) or the CPU
        backend's from_float. The output buffer starts zeroed (Q8_K leaves bsums of zero blocks unwritten)."""
        x = np.ascontiguousarray(x, np.float32)
        out = np.zeros((x.shape[0], self.row_bytes(t, x.shape[1])), np.uint8)
        if not ref:
            fn = FROM_FLOAT(self.cpu.ggml_get_type_traits_cpu(t).contents.from_float)
        elif t == TYPES["Q8_K"]:
            fn = FROM_FLOAT(ct.cast(self.base.quantize_row_q8_K_ref, ct.c_void_p).value)
        else:
            fn = FROM_FLOAT(self.traits(t).from_float_ref)
        for i in range(x.shape[0]):
            fn(x[i].ctypes.data, out[i].ctypes.data, x.shape[1])
        return out

    def dot(self, fnptr, w, a, k):
        fn = VEC_DOT(fnptr)
        out = np.zeros((a.shape[0], w.shape[0]), np.float32)
        s = ct.c_float()
        for t in range(a.shape[0]):
            for n in range(w.shape[0]):
                wr, ar = np.ascontiguousarray(w[n]), np.ascontiguousarray(a[t])
                fn(k, ct.byref(s), 0, wr.ctypes.data, 0, ar.ctypes.data, 0, 1)
                out[t, n] = s.value
        return out

    @staticmethod
    def generic_dot(lib, name, act):
        sym = f"ggml_vec_dot_{name.lower()}_{act.lower().replace('q8_k', 'q8_K')}"
        sym = sym.replace("_k_q8", "_K_q8")
        for cand in (sym + "_generic", sym):  # a type with no SIMD kernel exports only the generic name
            if hasattr(lib, cand):
                return cand, ct.cast(getattr(lib, cand), ct.c_void_p).value
        raise KeyError(sym)


def weight_rows(rng, k):
    """Four fp16-valued rows: Gaussian, small Gaussian, mostly zero, Gaussian with one huge value."""
    x = rng.standard_normal((4, k)).astype(np.float32)
    x[1] *= 0.01
    x[2, 8:] = 0
    x[3, 5] = 100.0
    return x.astype(np.float16).astype(np.float32)


def act_rows(rng, k):
    """Three activation rows: Gaussian, all zero, Gaussian with one huge value."""
    x = rng.standard_normal((3, k)).astype(np.float32)
    x[1] = 0
    x[2, 7] = 250.0
    return x


def make_weight(g: Ggml, name: str, out_dir: str) -> str:
    t = TYPES[name]
    rng = np.random.default_rng(1234 + t)
    k = 512
    x = weight_rows(rng, k)
    blocks = g.quantize(t, x)
    deq = g.to_float(t, blocks, k)
    tc = g.cpu.ggml_get_type_traits_cpu(t).contents
    act_t = tc.vec_dot_type
    xa = act_rows(rng, k)
    a = g.from_float(act_t, xa, ref=(act_t not in (0, 1, 30)))  # float types: the CPU conversion
    res = dict(
        x=x.astype(np.float16),
        blocks=blocks,
        deq=deq,
        xa=xa,
        a=a,
        act_type=np.int32(act_t),
        dot_cpu=g.dot(tc.vec_dot, blocks, a, k),
    )
    note = ""
    if name not in ("F32", "F16", "BF16"):
        sym, ptr = g.generic_dot(g.nofma, name, NAME_OF[act_t])
        res["dot_generic"] = g.dot(ptr, blocks, a, k)
        res["dot_generic_native"] = g.dot(g.generic_dot(g.cpu, name, NAME_OF[act_t])[1], blocks, a, k)
        note = sym
    rel = float(np.sqrt(np.mean((deq - x) ** 2) / np.mean(x**2)))
    res["ggml_rel_rmse"] = np.float64(rel)
    np.savez_compressed(os.path.join(out_dir, f"{name}.npz"), **res)
    return f"{name:8s} act {NAME_OF[act_t]:5s} rel_rmse(ggml encoder) {rel:.4f} {note}"


def make_act(g: Ggml, out_dir: str) -> None:
    rng = np.random.default_rng(77)
    x = rng.standard_normal((6, 512)).astype(np.float32)
    x[1] = 0
    x[2, :8] = [127, 2.5, -2.5, 0.5, -0.5, 1.5, 3.5, -127]  # ties: roundf (Q8_0/1) vs nearest-even (Q8_K)
    x[3, 3] = 1e4
    x[4, 0], x[4, 1] = -50.0, 50.0  # equal |max| in one Q8_K block: the first wins
    x[5] *= 1e-3
    res = {"x": x}
    for name in ("Q8_0", "Q8_1", "Q8_K"):
        res[f"{name}_ref"] = g.from_float(TYPES[name], x, ref=True)
        res[f"{name}_cpu"] = g.from_float(TYPES[name], x, ref=False)
    np.savez_compressed(os.path.join(out_dir, "act.npz"), **res)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", default=DEFAULT_LIB, help="folder holding libggml-base.so and libggml-cpu.so")
    p.add_argument("--src", default=DEFAULT_SRC, help="llama.cpp source tree of the same version")
    p.add_argument("--out", default=HERE)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        g = Ggml(args.lib, build_generic_nofma(args.src, args.lib, tmp))
        run(g, args)


def cpu_model() -> str:
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or "cpu"
    model = next(
        (ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), "?"
    )
    flags = next((ln.split(":", 1)[1].split() for ln in info.splitlines() if ln.startswith("flags")), [])
    return f"{model} ({' '.join(f for f in ('avx2', 'fma', 'f16c', 'avx512f', 'avx512vnni') if f in flags)})"


def run(g, args):
    make_act(g, args.out)
    lines = [make_weight(g, n, args.out) for n in WEIGHTS]
    with open(os.path.join(args.out, "PROVENANCE.txt"), "w") as f:
        f.write(
            f"made by make_oracle.py with {args.lib} (llama-cpp-python 0.3.36 sdist, CPU build, "
            f"GGML_NATIVE=ON) on {platform.machine()}, {cpu_model()}\n"
        )
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
