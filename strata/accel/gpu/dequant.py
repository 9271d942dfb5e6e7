"""GPU dequantisation: raw GGUF blocks -> fp16 weights, exactly (cuda/dequant.cuh states the contract).

The CUDA source (cuda/*.cu, *.cuh) is compiled by NVRTC through CuPy on the device, and the same header by
g++ on the host (`host_dequant`), so the arithmetic can be checked against strata.quants on a machine without
a GPU. Every weight is strata.quants' float32 value rounded to fp16 (nearest even); NaN comes out as 0x7E00.

Public API (Legend: G matrices in a launch, N rows, K row length, B = N·K / QK blocks):
  cuda_source() -> str                              the whole translation unit NVRTC compiles
  source(name) -> str                               any cuda/*.cu with its local includes inlined
  NVRTC_OPTIONS                                     options for cupy.RawModule
  KERNEL_NAME[qtype], MATRIX_KERNEL_NAME[qtype]     extern "C" kernel names
  load_module(cupy) -> RawModule                    compile (cached by CuPy)
  launch(module, qtype, ptrs_dev, n_ptrs, n_rows, k, out, stream)     out f16 [G >= n_ptrs, N, K]
  launch_matrix(module, qtype, src, n_rows, k, out, stream)           out f16 [N, K] (f32 [N, K]: the
                                                                      unrounded float32, embedding rows)
  host_dequant(raw, qtype, n_rows, k) -> f16 [N, K]; host_dequant_f32 (the float32 before rounding)
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import numpy as np

from strata import quants

CUDA_DIR = pathlib.Path(__file__).resolve().parent / "cuda"

# ggml id -> (C suffix, weights per thread): the suffixes of STRATA_TYPE / STRATA_KERNELS in cuda/*.
_TYPES: dict[int, tuple[str, int]] = {
    0: ("f32", 1), 1: ("f16", 1), 30: ("bf16", 1),
    2: ("q4_0", 32), 3: ("q4_1", 32), 6: ("q5_0", 32), 7: ("q5_1", 32), 8: ("q8_0", 32), 42: ("q2_0", 32),
    10: ("q2_k", 32), 11: ("q3_k", 32), 12: ("q4_k", 32), 13: ("q5_k", 32), 14: ("q6_k", 32),
    16: ("iq2_xxs", 32), 17: ("iq2_xs", 32), 22: ("iq2_s", 32), 18: ("iq3_xxs", 32), 21: ("iq3_s", 32),
    19: ("iq1_s", 32), 29: ("iq1_m", 32), 20: ("iq4_nl", 32), 23: ("iq4_xs", 32), 39: ("mxfp4", 32),
}
SUFFIX = {q: s for q, (s, _) in _TYPES.items()}
PART = {q: p for q, (_, p) in _TYPES.items()}
KERNEL_NAME = {q: f"dequant_rows_{s}" for q, s in SUFFIX.items()}
MATRIX_KERNEL_NAME = {q: f"dequant_{s}" for q, s in SUFFIX.items()}
# the block types of 32-weight parts: the quantised grouped GEMM's (cuda/gemm_q_kernels.cu STRATA_GEMM_Q lines)
GEMM_Q_TYPES = frozenset(q for q, p in PART.items() if p == 32)
MATRIX_F32_KERNEL_NAME = {q: f"dequant_f32_{s}" for q, s in SUFFIX.items()}
# types whose unrounded float32 the device gives exactly: NVRTC's -ftz flushes MXFP4's subnormal products (scale
# exponent e < 2), which only the fp16 rounding hides (dequant.cuh)
F32_EXACT = frozenset(q for q in SUFFIX if SUFFIX[q] != "mxfp4")

# CuPy appends -ftz=true to every NVRTC compile; fp16 results do not depend on it (dequant.cuh: the only
# float32 subnormals, MXFP4 with e < 2, round to a signed zero in fp16 with or without flushing).
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")
_THREADS = 256  # per CUDA block (dequant_kernels.cu DQ_THREADS: a pass stages 256 parts)
_MAX_GRID_X = 1 << 16  # the kernels loop (grid-stride) past this many CUDA blocks


def _check_type(qtype: int) -> type[quants.QuantType]:
    cls = quants.get(qtype)
    if int(qtype) not in _TYPES:
        raise quants.UnsupportedQuantType(f"no CUDA dequantiser for {cls.name}")
    return cls


# --- source -------------------------------------------------------------------------------------------------
_INCLUDE = re.compile(r'^#include "([^"]+)"\s*$', re.M)


def _flatten(name: str, seen: set[str]) -> str:
    """`name` with each local #include "..." replaced by that file (once each), #pragma once dropped."""
    if name in seen:
        return ""
    seen.add(name)
    text = (CUDA_DIR / name).read_text(encoding="utf-8").replace("#pragma once\n", "")
    return _INCLUDE.sub(lambda m: _flatten(m.group(1), seen), text)


def source(name: str) -> str:
    """A .cu file of cuda/ with its local headers inlined (NVRTC has no files to include)."""
    return _flatten(name, set())


@functools.cache
def cuda_source() -> str:
    """dequant_kernels.cu with its headers inlined: one string, no local includes (NVRTC has no files)."""
    return _flatten("dequant_kernels.cu", set())


def header_source() -> str:
    """dequant.cuh with its headers inlined (what the host harness compiles)."""
    return _flatten("dequant.cuh", set())


# --- CuPy ---------------------------------------------------------------------------------------------------
def load_module(cupy):
    """A cupy.RawModule of every dequant kernel (NVRTC; CuPy caches the cubin by source hash)."""
    return cupy.RawModule(code=cuda_source(), options=NVRTC_OPTIONS)


def _grid_x(n_blocks: int, qtype: int) -> int:
    parts = n_blocks * (quants.get(qtype).block_size // PART[qtype])
    return max(1, min(_MAX_GRID_X, -(-parts // _THREADS)))


def _check_out(out, shape: tuple[int, ...], qtype: int, what: str) -> None:
    if str(out.dtype) != "float16" or not out.flags.c_contiguous:
        raise ValueError(f"{what}: out must be a C-contiguous float16 array, got {out.dtype} {out.shape}")
    if tuple(out.shape) != shape:
        raise ValueError(f"{what}: out must have shape {shape}, got {tuple(out.shape)}")
    if PART[qtype] % 8 == 0 and out.data.ptr % 16:
        raise ValueError(f"{what}: out must be 16-byte aligned (the kernel stores 8 halves at a time)")


def launch(module, qtype: int, ptrs_dev, n_ptrs: int, n_rows: int, k: int, out, stream) -> None:
    """out[g] f16 [n_rows, k] <- the n_rows·k weights of type `qtype` at device address ptrs_dev[g], for
    g < n_ptrs.

    ptrs_dev: cupy uint64 [>= n_ptrs] of device addresses (each matrix contiguous); out: cupy f16 [G, N, K]
    with G >= n_ptrs (rows g >= n_ptrs untouched). Asynchronous on `stream`.
    """
    cls = _check_type(qtype)
    n_ptrs, n_rows, k = int(n_ptrs), int(n_rows), int(k)
    row_blocks = cls.row_bytes(k) // cls.type_size
    if not 0 < n_ptrs <= 65535:
        raise ValueError(f"dequant launch: n_ptrs must be in 1..65535 (grid y), got {n_ptrs}")
    if str(ptrs_dev.dtype) != "uint64" or ptrs_dev.ndim != 1 or ptrs_dev.shape[0] < n_ptrs:
        raise ValueError(f"dequant launch: ptrs_dev must be uint64 [>= {n_ptrs}], "
                         f"got {ptrs_dev.dtype} {ptrs_dev.shape}")
    if n_rows <= 0 or n_rows * row_blocks >= 2**31:
        raise ValueError(f"dequant launch: {n_rows} rows of {row_blocks} blocks do not fit the kernel's "
                         "int32 sizes")
    if out.ndim != 3 or out.shape[0] < n_ptrs:
        raise ValueError(f"dequant launch: out must be [G >= {n_ptrs}, {n_rows}, {k}], "
                         f"got {tuple(out.shape)}")
    _check_out(out, (out.shape[0], n_rows, k), qtype, "dequant launch")
    fn = module.get_function(KERNEL_NAME[int(qtype)])
    grid = (_grid_x(n_rows * row_blocks, qtype), n_ptrs)
    args = (ptrs_dev, np.int32(n_ptrs), np.int32(n_rows), np.int32(row_blocks), out)
    fn(grid, (_THREADS,), args, stream=stream)


def launch_matrix(module, qtype: int, src, n_rows: int, k: int, out, stream) -> None:
    """out f16 [n_rows, k] <- one matrix of type `qtype` at `src` (a cupy uint8 array, or a device address as
    an int); out f32 [n_rows, k] takes the float32 values unrounded. Asynchronous on `stream`."""
    cls = _check_type(qtype)
    n_blocks = int(n_rows) * cls.row_bytes(int(k)) // cls.type_size
    f32 = str(out.dtype) == "float32"
    if f32:
        if not out.flags.c_contiguous or tuple(out.shape) != (int(n_rows), int(k)):
            raise ValueError(f"dequant launch_matrix: out must be a C-contiguous [{n_rows}, {k}], "
                             f"got {out.dtype} {tuple(out.shape)}")
    else:
        _check_out(out, (int(n_rows), int(k)), qtype, "dequant launch_matrix")
    if isinstance(src, int):
        src = np.uint64(src)
    elif str(src.dtype) != "uint8" or src.size != n_blocks * cls.type_size or not src.flags.c_contiguous:
        raise ValueError(f"dequant launch_matrix: src must be {n_blocks * cls.type_size} contiguous uint8 "
                         f"bytes ({cls.name} [{n_rows}, {k}]), got {src.dtype} {src.shape}")
    fn = module.get_function((MATRIX_F32_KERNEL_NAME if f32 else MATRIX_KERNEL_NAME)[int(qtype)])
    fn((_grid_x(n_blocks, qtype),), (_THREADS,), (src, np.int64(n_blocks), out), stream=stream)


# --- host twin: the same header compiled by g++ ------------------------------------------------------------
_CXXFLAGS = ("-O2", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-Wall")


def _harness_source() -> str:
    cases = "\n".join(f"    case {q}: return run({s}_t::QK, dq_{s}, src, {s}_t::SIZE, n_blocks, half, out);"
                      for q, s in sorted(SUFFIX.items()))
    return f"""{header_source()}
// host harness (strata/accel/gpu/dequant.py): whole blocks through dq_<type>, then f32_to_f16_bits
static int run(int qk, void (*dq)(const uint8_t*, float*), const uint8_t* src, int size, long long n_blocks,
               int half, void* out) {{
    float buf[256];
    for (long long i = 0; i < n_blocks; ++i) {{
        dq(src + i * size, buf);
        for (int j = 0; j < qk; ++j) {{
            if (half) ((uint16_t*)out)[i * qk + j] = f32_to_f16_bits(buf[j]);
            else ((float*)out)[i * qk + j] = buf[j];
        }}
    }}
    return 0;
}}

extern "C" int strata_dequant(int qtype, const uint8_t* src, long long n_blocks, int half, void* out) {{
    switch (qtype) {{
{cases}
    default: return -1;
    }}
}}
"""


@functools.cache
def _host_lib() -> ctypes.CDLL:
    cxx = shutil.which("g++")
    if cxx is None:
        raise RuntimeError("host_dequant needs g++ on PATH to compile cuda/dequant.cuh")
    src = _harness_source()
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\0".join([src, version, *_CXXFLAGS]).encode()).hexdigest()[:20]
    lib = pathlib.Path(tempfile.gettempdir()) / f"strata-dequant-{key}" / "libdequant.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
            cpp, so = pathlib.Path(tmp) / "harness.cpp", pathlib.Path(tmp) / "lib.so"
            cpp.write_text(src, encoding="utf-8")
            r = subprocess.run([cxx, *_CXXFLAGS, str(cpp), "-o", str(so)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"g++ failed to compile the dequant harness:\n{r.stderr[-4000:]}")
            os.replace(so, lib)  # atomic: a concurrent build of the same key writes the same bytes
    dll = ctypes.CDLL(str(lib))
    c = ctypes
    dll.strata_dequant.argtypes = [c.c_int, c.c_void_p, c.c_longlong, c.c_int, c.c_void_p]
    dll.strata_dequant.restype = ctypes.c_int
    return dll


def _host_run(raw, qtype: int, n_rows: int, k: int, half: bool) -> np.ndarray:
    cls = _check_type(qtype)
    raw = np.ascontiguousarray(np.frombuffer(raw, np.uint8) if isinstance(raw, (bytes, bytearray, memoryview))
                               else np.asarray(raw)).reshape(-1)
    nbytes = int(n_rows) * cls.row_bytes(int(k))
    if raw.dtype != np.uint8 or raw.size != nbytes:
        raise ValueError(f"{cls.name} [{n_rows}, {k}] needs {nbytes} uint8 bytes, "
                         f"got {raw.dtype} x {raw.size}")
    out = np.empty((int(n_rows), int(k)), np.float16 if half else np.float32)
    n_blocks = nbytes // cls.type_size
    rc = _host_lib().strata_dequant(int(qtype), raw.ctypes.data, n_blocks, int(half), out.ctypes.data)
    assert rc == 0, f"harness has no case for {cls.name}"
    return out


def host_dequant(raw, qtype: int, n_rows: int, k: int) -> np.ndarray:
    """f16 [n_rows, k] from raw bytes through the g++ build of cuda/dequant.cuh (the kernels' arithmetic)."""
    return _host_run(raw, qtype, n_rows, k, True)


def host_dequant_f32(raw, qtype: int, n_rows: int, k: int) -> np.ndarray:
    """float32 [n_rows, k]: the values dequant.cuh computes before rounding to fp16."""
    return _host_run(raw, qtype, n_rows, k, False)
