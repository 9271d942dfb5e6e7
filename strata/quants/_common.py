"""Small helpers shared by the quant families: field access, C rounding, exact integer block dots.

Legend: B blocks, S bytes per block, T activation rows, N weight rows, G weights per integer group.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def as_blocks(cls, blocks: np.ndarray) -> np.ndarray:
    """Check a ``[B, S]`` uint8 block array for ``cls`` and return it C-contiguous."""
    blocks = np.asarray(blocks)
    if blocks.dtype != np.uint8 or blocks.ndim != 2 or blocks.shape[1] != cls.type_size:
        raise ValueError(
            f"{cls.name}: expected uint8 blocks [B, {cls.type_size}], got {blocks.dtype} {blocks.shape}"
        )
    return np.ascontiguousarray(blocks)


def field(blocks: np.ndarray, off: int, n: int, dtype=np.uint8) -> np.ndarray:
    """``n`` little-endian values of ``dtype`` at byte offset ``off`` of each block: [B, n]."""
    size = np.dtype(dtype).itemsize
    return np.ascontiguousarray(blocks[:, off : off + n * size]).view(dtype)


def f16(blocks: np.ndarray, off: int) -> np.ndarray:
    """The fp16 at byte ``off`` of each block, widened exactly to float32: [B]."""
    return field(blocks, off, 1, np.float16)[:, 0].astype(F32)


def put_f16(blocks: np.ndarray, off: int, values: np.ndarray) -> None:
    """Store float values as fp16 (round to nearest even, like ``GGML_FP32_TO_FP16``; too large -> inf)."""
    with np.errstate(over="ignore"):
        blocks[:, off : off + 2] = np.asarray(values, F32).astype(np.float16).reshape(-1, 1).view(np.uint8)


def fill_f16(blocks: np.ndarray, off: int, d: float) -> None:
    """Set the fp16 at byte ``off`` of every block to ``d`` (refused if fp16 cannot hold it)."""
    blocks[:, off : off + 2] = np.frombuffer(f16_scale(d).tobytes(), np.uint8)


def to_f16(x: np.ndarray) -> np.ndarray:
    """float32 -> nearest fp16 -> float32 (the value a ggml_half field will hold)."""
    return np.asarray(x, F32).astype(np.float16).astype(F32)


def roundf(x: np.ndarray) -> np.ndarray:
    """C ``roundf``: nearest integer, halves away from zero (float32 in, float32 out).

    ``a - floor(a)`` is exact in float32, so the half test is exact (unlike ``trunc(x + 0.5)``).
    """
    x = np.asarray(x, F32)
    a = np.abs(x)
    fl = np.floor(a)
    return np.copysign(fl + (a - fl >= F32(0.5)).astype(F32), x)


def nearest_int(x: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int`` (ggml-quants.c): round half to even via a float32 add; int32 out."""
    return np.rint(np.asarray(x, F32)).astype(np.int32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., n] bytes -> [..., 2n] 4-bit codes: low nibbles first, then high nibbles (ggml's usual order)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def bits_le(x: np.ndarray, n: int) -> np.ndarray:
    """[..., m] unsigned ints -> [..., m, n] their low ``n`` bits, least significant first (0/1 uint8)."""
    sh = np.arange(n, dtype=x.dtype)
    return ((x[..., None] >> sh) & 1).astype(np.uint8)


def int_dot(wq: np.ndarray, aq: np.ndarray) -> np.ndarray:
    """Exact integer dot per group: wq [N, B, G] int, aq [T, B, G] int -> [T, N, B] int64.

    Integer ``einsum`` (its own C loops, no BLAS): int32 accumulation when the bound max|w|·max|a|·G allows
    it (always, for ggml's formats), else int64. Integer sums are exact in any order.
    """
    assert wq.shape[1:] == aq.shape[1:], f"group shapes differ: {wq.shape} vs {aq.shape}"
    bound = int(np.abs(wq).max(initial=0)) * int(np.abs(aq).max(initial=0)) * wq.shape[2]
    dt = np.int32 if bound < 2**31 else np.int64
    w = np.ascontiguousarray(wq.transpose(1, 0, 2), dtype=dt)  # [B, N, G]
    a = np.ascontiguousarray(aq.transpose(1, 0, 2), dtype=dt)  # [B, T, G]
    return np.einsum("btg,bng->tnb", a, w).astype(np.int64)  # [T, N, B]


def sum_blocks(bv: np.ndarray) -> np.ndarray:
    """Σ_b bv[t, n, b] in float32, b = 0, 1, ... in order, starting from +0.0 (docs/NUMERICS.md)."""
    assert bv.dtype == F32, bv.dtype
    acc = np.zeros(bv.shape[:2], F32)
    for b in range(bv.shape[2]):
        acc = acc + bv[:, :, b]
    return acc


def i2f(x: np.ndarray) -> np.ndarray:
    """C's implicit int -> float conversion (round to nearest even)."""
    return np.asarray(x).astype(F32)


def dot_operands(cls, w: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, int, int]:
    """Check vec_dot's operands and flatten them to block arrays.

    w [N, B, S] uint8 rows of ``cls``, a [T, Ba, Sa] uint8 rows of ``cls.vec_dot_type`` covering the same K.
    Returns (w blocks [N*B, S], a blocks [T*Ba, Sa], N, B, T).
    """
    from strata.quants.base import get

    act = get(cls.vec_dot_type)
    w, a = np.asarray(w), np.asarray(a)
    if w.dtype != np.uint8 or w.ndim != 3 or w.shape[2] != cls.type_size:
        raise ValueError(
            f"{cls.name}.vec_dot: weights must be uint8 [N, B, {cls.type_size}], got {w.dtype} {w.shape}"
        )
    if a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != act.type_size:
        raise ValueError(
            f"{cls.name}.vec_dot: activations must be {act.name} uint8 [T, Ba, {act.type_size}], "
            f"got {a.dtype} {a.shape}"
        )
    if w.shape[1] * cls.block_size != a.shape[1] * act.block_size:
        raise ValueError(
            f"{cls.name}.vec_dot: weight rows hold {w.shape[1] * cls.block_size} values, "
            f"activation rows {a.shape[1] * act.block_size}"
        )
    n, b, _ = w.shape
    t = a.shape[0]
    return w.reshape(n * b, -1), a.reshape(-1, act.type_size), n, b, t


def random_bytes(rng: np.random.Generator, n_blocks: int, size: int) -> np.ndarray:
    """[n_blocks, size] uniformly random bytes, drawn as uint32 words (the fastest Generator path)."""
    n = n_blocks * size
    words = rng.integers(0, 0xFFFFFFFF, size=(n + 3) // 4, dtype=np.uint32, endpoint=True)
    return words.view(np.uint8)[:n].reshape(n_blocks, size)


def random_d_at_0(cls, rng: np.random.Generator, n_blocks: int, d: float) -> np.ndarray:
    """Random code bytes with one fp16 scale `d` in bytes 0-1: the random_blocks of every type laid out as
    `{ggml_half d; codes}`."""
    blocks = random_bytes(rng, n_blocks, cls.type_size)
    fill_f16(blocks, 0, d)
    return blocks


def f16_scale(d: float) -> np.float16:
    """A super-scale for random blocks as fp16, refusing values fp16 cannot hold."""
    with np.errstate(over="ignore"):
        h = np.float16(d)
    if not np.isfinite(h):
        raise ValueError(f"scale {d:g} does not fit an fp16 block scale")
    return h
