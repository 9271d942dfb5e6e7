"""The CUDA dequantisers (strata/accel/gpu/cuda/dequant*.cuh) against strata.quants, bit for bit.

Oracle: `quants.get(t).dequantize(blocks)` (float32, ggml's dequantize_row_*), rounded to fp16 by numpy
(nearest even); NaN weights must come out as the canonical 0x7E00. The header runs on the CPU through g++
(`host_dequant`, skipped without g++), on the GPU through CuPy (`gpu` marker). Both the float32 stage and the
fp16 result are compared as bit patterns; a failure names the type, the case, the worst block and its bytes.
Legend: B blocks, Q weights per block.
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import numpy as np
import pytest

from strata import quants
from strata.accel.gpu import dequant as D
from strata.quants import _common as C
from strata.quants.testing import diff_report

WEIGHT_TYPES = [c for c in quants.registered() if c.weight]
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to build the host harness")

# fp16 fields that hold a scale, by type (byte offsets in a block; strata.quants docstrings)
_F16_FIELDS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_0": (0,), "IQ4_NL": (0,),
    "IQ4_XS": (0,), "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,),
}
# zeros, subnormals (smallest, largest), smallest normal, ±1, ±max, ±inf, NaNs (quiet, negative, signalling)
_SPECIAL_F16 = np.array([0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x1400, 0x3C00, 0xBC00, 0x7BFF,
                         0xFBFF, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01], np.uint16)
_E8M0 = np.array([0, 1, 2, 3, 100, 127, 128, 129, 200, 253, 254, 255], np.uint8)  # incl. the subnormal 2^-128


# --- oracle and comparison ----------------------------------------------------------------------------------
def _oracle(cls, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """blocks [B, S] -> (float32 [B, Q], fp16 bits [B, Q] with every NaN as 0x7E00)."""
    with np.errstate(all="ignore"):  # inf·0, overflow to inf in the fp16 cast: the cases under test
        r32 = cls.dequantize(blocks)
        r16 = r32.astype(np.float16).view(np.uint16).copy()
    r16[np.isnan(r32)] = 0x7E00
    return r32, r16


def _check(cls, case: str, blocks: np.ndarray, got16: np.ndarray, got32: np.ndarray | None = None) -> None:
    """got16 fp16 [B·Q] (and got32 float32 [B·Q], the pre-rounding stage) equal the oracle's bits; the report
    (strata.quants.testing) names the worst block, and the bytes of the first bad block follow."""
    r32, r16 = _oracle(cls, blocks)
    g16 = np.asarray(got16).reshape(r16.shape).view(np.uint16)
    stages = [("f16", g16.view(np.float16), r16.view(np.float16))]
    if got32 is not None:
        g32 = got32.reshape(r32.shape).copy()
        both_nan = np.isnan(g32) & np.isnan(r32)  # NaN bits differ between machines: "NaN" is the exact part
        g32[both_nan] = r32[both_nan]
        stages.insert(0, ("f32", g32, r32))
    for stage, ours, ref in stages:
        report = diff_report(ours, ref, cls.block_size, f"{cls.name} [{case}] {stage}")
        if report is not None:
            uint = f"u{ours.itemsize}"
            bad = int(np.flatnonzero((ours.view(uint) != ref.view(uint)).any(axis=1))[0])
            pytest.fail(f"{report}\n  first bad block {bad} bytes {blocks[bad].tobytes().hex()}")


# --- test inputs --------------------------------------------------------------------------------------------
def _set_f16(blocks: np.ndarray, off: int, bits: np.ndarray) -> None:
    blocks[:, off : off + 2] = np.asarray(bits, np.uint16).reshape(-1, 1).view(np.uint8)


def _with_scales(cls, base: np.ndarray) -> np.ndarray:
    """Copies of `base` blocks [b, S] with each scale field set to every special value (pairs where a block
    has two fields): [b · n_specials(^2), S]."""
    if cls.name == "MXFP4":
        out = np.repeat(base, len(_E8M0), axis=0)
        out[:, 0] = np.tile(_E8M0, len(base))
        return out
    if cls.name == "IQ1_M":  # d's fp16 bits are the top nibbles of the four u16 sc at byte 48
        out = np.repeat(base, len(_SPECIAL_F16), axis=0)
        bits = np.tile(_SPECIAL_F16, len(base)).astype(np.uint16)
        sc = C.field(out, 48, 4, np.uint16) & 0x0FFF
        sc |= ((bits[:, None] >> np.array([0, 4, 8, 12], np.uint16)) & 0xF) << 12
        out[:, 48:56] = sc.view(np.uint8)
        return out
    fields = _F16_FIELDS[cls.name]
    grids = np.meshgrid(*([_SPECIAL_F16] * len(fields)), indexing="ij")
    combos = np.stack([g.reshape(-1) for g in grids], axis=1)  # [n^f, f]
    out = np.repeat(base, len(combos), axis=0)
    for i, off in enumerate(fields):
        _set_f16(out, off, np.tile(combos[:, i], len(base)))
    return out


def _f32_edges() -> np.ndarray:
    """float32 values around every fp16 rounding boundary: midpoints between consecutive finite halves (and
    their float32 neighbours), the overflow threshold 65520, subnormal/zero edges, NaNs, random patterns."""
    h = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)  # every finite half >= 0
    nxt = np.append(h[1:], 65536.0)  # the next half up (65536 stands in for the overflow point)
    mid = ((h + nxt) / 2).astype(np.float32)  # exact in float32
    b = mid.view(np.uint32)
    near = np.concatenate([b, b - 1, b + 1]).view(np.float32)
    special = np.array([0x00000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x33000000, 0x33000001, 0x32FFFFFF,
                        0x477FEFFF, 0x477FF000, 0x7F7FFFFF, 0x7F800000, 0x7FC00000, 0x7F800001, 0x7FFFFFFF],
                       np.uint32).view(np.float32)
    rnd = np.random.default_rng(7).integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
    rnd = rnd.view(np.float32)
    x = np.concatenate([near, special, rnd])
    return np.concatenate([x, -x])


def _cases(cls, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Named block arrays [B, S] of one type: random valid, raw random bytes, encodings, zero, extremes."""
    s = cls.type_size
    if cls.block_size == 1:  # F32, F16, BF16: the block is the value
        if cls.name == "F32":
            x = _f32_edges()
        else:  # every 16-bit pattern
            x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
            return {"all 16-bit patterns": x.view(np.uint8).reshape(-1, 2)}
        return {"fp16 rounding edges": x.view(np.uint8).reshape(-1, 4)}
    n = max(1024 // cls.block_size, 8)  # blocks per case (4 to 32 k weights)
    x = rng.standard_normal((n, cls.block_size)).astype(np.float32)
    x[:, 3] *= 40  # an outlier per block, as in real weights
    cases = {
        "random_blocks 0.02": cls.random_blocks(rng, n, 0.02),
        "random_blocks 1": cls.random_blocks(rng, n, 1.0),
        "raw random bytes": C.random_bytes(rng, 4 * n, s),  # every scale pattern: subnormal, inf, NaN
        "quantize(gaussian)": cls.quantize(x),
        "all zero": np.zeros((4, s), np.uint8),
    }
    base = np.stack([np.full(s, 0xFF, np.uint8), np.full(s, 0x80, np.uint8), np.full(s, 0x55, np.uint8),
                     np.zeros(s, np.uint8), C.random_bytes(rng, 1, s)[0]])  # max codes, sign bits, mixed
    cases["special scales"] = _with_scales(cls, base)
    return cases


# --- host (g++) tests ---------------------------------------------------------------------------------------
@needs_gxx
@pytest.mark.parametrize("cls", WEIGHT_TYPES, ids=lambda c: c.name)
def test_host_header_matches_numpy(cls):
    rng = np.random.default_rng(1000 + cls.qtype)
    for case, blocks in _cases(cls, rng).items():
        blocks = np.ascontiguousarray(blocks)
        k = cls.block_size
        got32 = D.host_dequant_f32(blocks, cls.qtype, len(blocks), k)
        got16 = D.host_dequant(blocks, cls.qtype, len(blocks), k)
        _check(cls, case, blocks, got16, got32)


@needs_gxx
def test_host_known_answers():
    # Q4_0, d = 0.5 (0x3800), every qs byte 0x0F: weights 0..15 = (15 - 8)·0.5 = 3.5,
    # weights 16..31 = (0 - 8)·0.5 = -4.0
    blk = np.array([0x00, 0x38] + [0x0F] * 16, np.uint8)
    want = np.array([3.5] * 16 + [-4.0] * 16, np.float16)
    assert np.array_equal(D.host_dequant(blk, 2, 1, 32), want[None])
    # F32 -> fp16 rounding: 1 + 2^-11 is a tie -> even 1.0 (0x3C00); 1 + 3·2^-11 -> 0x3C02; 65519.996 -> max
    # half 0x7BFF, 65520 -> inf; 2^-25 is a tie -> +0; just above it -> the smallest subnormal 0x0001
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, np.nextafter(np.float32(65520), 0), 65520, 2**-25,
                  np.nextafter(np.float32(2**-25), 1), -(2**-25)], np.float32)
    got = D.host_dequant(x.view(np.uint8), 0, 1, len(x)).view(np.uint16)[0]
    assert [hex(v) for v in got] == ["0x3c00", "0x3c02", "0x7bff", "0x7c00", "0x0", "0x1", "0x8000"]


@needs_gxx
def test_host_dequant_checks_its_input():
    with pytest.raises(ValueError, match=r"Q4_K \[2, 256\] needs 288 uint8 bytes"):
        D.host_dequant(np.zeros(144, np.uint8), 12, 2, 256)
    with pytest.raises(quants.UnsupportedQuantType):
        D.host_dequant(np.zeros(36, np.uint8), 9, 1, 32)  # Q8_1 is an activation format


# --- the sources ------------------------------------------------------------------------------------------
def test_every_weight_type_has_a_kernel():
    assert set(D.SUFFIX) == {c.qtype for c in WEIGHT_TYPES}
    src = D.cuda_source()
    for q, s in D.SUFFIX.items():
        assert f"STRATA_KERNELS({s})" in src, f"dequant_kernels.cu has no kernels for {quants.type_name(q)}"
    assert "#include \"" not in src, "cuda_source() must inline every local header (NVRTC has no files)"


def test_block_geometry_matches_the_registry():
    """STRATA_TYPE(nm, QK, SIZE, PART) lines == strata.quants' block_size, type_size and dequant.PART."""
    pattern = r"^STRATA_TYPE\((\w+), (\d+), ([\d +*]+), (\d+)\)$"
    found = {m[0]: m[1:] for m in re.findall(pattern, D.header_source(), re.M)}
    assert set(found) == set(D.SUFFIX.values())
    for q, s in D.SUFFIX.items():
        cls = quants.get(q)
        qk, size, part = int(found[s][0]), eval(found[s][1]), int(found[s][2])  # noqa: S307 (digits and +, *)
        assert (qk, size, part) == (cls.block_size, cls.type_size, D.PART[q]), f"{cls.name}: {found[s]}"
        assert qk % part == 0 and (part == 1 or part % 8 == 0), f"{cls.name}: PART {part} breaks store_part"


def test_generated_tables_are_current():
    import importlib.util

    path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "gen_iq_tables.py"
    spec = importlib.util.spec_from_file_location("gen_iq_tables", path)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (D.CUDA_DIR / "iq_tables.cuh").read_text() == gen.render(), "run tools/gen_iq_tables.py"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc (CUDA toolkit)")
def test_nvcc_compiles_the_nvrtc_source(tmp_path):
    """The exact string NVRTC gets, compiled to PTX for sm_90 with nvcc's default --fmad=true: every kernel is
    there and no float multiply-add was fused (fmul/fadd are __fmul_rn/__fadd_rn)."""
    cu = tmp_path / "dequant.cu"
    cu.write_text(D.cuda_source())
    r = subprocess.run(["nvcc", "-arch=sm_90", "-std=c++17", "--ptx", str(cu), "-o", str(tmp_path / "d.ptx")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    assert "warning" not in r.stderr, r.stderr[-4000:]
    ptx = (tmp_path / "d.ptx").read_text()
    entries = set(re.findall(r"\.entry (\w+)\(", ptx))
    assert entries == (set(D.KERNEL_NAME.values()) | set(D.MATRIX_KERNEL_NAME.values())
                       | set(D.MATRIX_F32_KERNEL_NAME.values()))
    assert "fma.rn.f32" not in ptx, "a float32 multiply-add was contracted into an FMA"


# --- GPU (run on a CUDA machine) ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_kernels_match_numpy():
    """Every type: the batched kernel over blobs at odd byte offsets, and the single-matrix kernel."""
    import cupy as cp

    module = D.load_module(cp)
    stream = cp.cuda.Stream(non_blocking=True)
    for cls in WEIGHT_TYPES:
        rng = np.random.default_rng(2000 + cls.qtype)
        for case, blocks in _cases(cls, rng).items():
            k = 256 if len(blocks) * cls.block_size % 256 == 0 and cls.block_size <= 256 else cls.block_size
            n_rows = len(blocks) * cls.block_size // k
            raw = np.ascontiguousarray(blocks).reshape(-1)
            g_n = 3  # three copies at offsets 1, 1 + (len + 37), ...: unaligned blobs
            offs = [1 + g * (raw.size + 37) for g in range(g_n)]
            host = np.zeros(offs[-1] + raw.size, np.uint8)
            for o in offs:
                host[o : o + raw.size] = raw
            buf = cp.asarray(host)
            ptrs = cp.asarray(np.array([buf.data.ptr + o for o in offs], np.uint64))
            out = cp.full((g_n + 1, n_rows, k), np.float16(7.0), cp.float16)
            D.launch(module, cls.qtype, ptrs, g_n, n_rows, k, out, stream)
            one = cp.empty((n_rows, k), cp.float16)
            D.launch_matrix(module, cls.qtype, buf[offs[1] : offs[1] + raw.size], n_rows, k, one, stream)
            one32 = cp.full((n_rows, k), np.float32(7.0), cp.float32)     # the unrounded float32 (embedding rows)
            D.launch_matrix(module, cls.qtype, buf[offs[1] : offs[1] + raw.size], n_rows, k, one32, stream)
            stream.synchronize()
            got = out.get()
            for g in range(g_n):
                _check(cls, f"{case}, launch g={g}", blocks, got[g])
            assert (got[g_n] == 7.0).all(), f"{cls.name}: the kernel wrote past n_ptrs"
            _check(cls, f"{case}, launch_matrix", blocks, one.get(),
                   one32.get() if cls.qtype in D.F32_EXACT else None)


@pytest.mark.gpu
def test_cuda_q4_k_expert_speed():
    """A Q4_K expert matrix 768 x 2048 (and 8 of them in one launch): print the time; one must be < 100 us."""
    import cupy as cp

    module = D.load_module(cp)
    stream = cp.cuda.Stream(non_blocking=True)
    cls = quants.get(12)
    n, k, g_n = 768, 2048, 8
    blocks = cls.random_blocks(np.random.default_rng(5), g_n * n * k // 256, 0.02)
    buf = cp.asarray(blocks.reshape(-1))
    blob = n * cls.row_bytes(k)
    ptrs = cp.asarray(np.array([buf.data.ptr + g * blob for g in range(g_n)], np.uint64))
    out = cp.empty((g_n, n, k), cp.float16)
    times = {}
    for m in (1, g_n):
        for _ in range(3):
            D.launch(module, 12, ptrs, m, n, k, out, stream)
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        reps = 100
        for _ in range(reps):
            D.launch(module, 12, ptrs, m, n, k, out, stream)
        e1.record(stream)
        e1.synchronize()
        times[m] = cp.cuda.get_elapsed_time(e0, e1) * 1000 / reps
    print(f"Q4_K {n}x{k} dequant: 1 expert {times[1]:.1f} us, {g_n} experts {times[g_n]:.1f} us")
    _check(cls, "speed run", blocks[: n * k // 256], out[0].get())
    assert times[1] < 100, f"one Q4_K expert took {times[1]:.1f} us"
