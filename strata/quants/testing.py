"""Bit-exact comparison with a report that points at the bad blocks (gguf-py tests/test_quants.py style).

Used by the quant tests and by anything that must match the reference to the bit (accel kernels).
"""

from __future__ import annotations

import numpy as np


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]) if a.dtype.kind == "f" else a


def diff_report(ours: np.ndarray, ref: np.ndarray, block: int, what: str = "", show: int = 3) -> str | None:
    """None when ``ours`` and ``ref`` hold the same bits; else a report naming the differing blocks of
    ``block`` consecutive values (last axis), the worst one with its values beside the oracle's, and the
    count of differing bits."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    if ours.shape != ref.shape or ours.dtype != ref.dtype:
        return f"{what}: shape/dtype {ours.shape} {ours.dtype} vs oracle {ref.shape} {ref.dtype}"
    bo, br = _bits(ours).reshape(-1), _bits(ref).reshape(-1)
    if np.array_equal(bo, br):
        return None
    block = max(1, min(block, bo.size))
    nblk = -(-bo.size // block)
    pad = nblk * block - bo.size
    x = np.bitwise_xor(bo, br).astype(np.uint64)
    nbits = np.unpackbits(x.view(np.uint8)).reshape(x.size, -1).sum(axis=1)
    per_block = np.concatenate([nbits, np.zeros(pad, nbits.dtype)]).reshape(nblk, block).sum(axis=1)
    bad = np.flatnonzero(per_block)
    fo, fr = ours.reshape(-1).astype(np.float64), ref.reshape(-1).astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs(fo - fr)
    blk_err = np.concatenate([np.nan_to_num(err, nan=np.inf), np.zeros(pad)]).reshape(nblk, block).max(axis=1)
    worst = int(bad[np.argmax(blk_err[bad])])
    lines = [
        f"{what}: {bad.size} of {nblk} blocks differ, {int(nbits.sum())} bits in {int((nbits > 0).sum())} "
        f"values; bad blocks {bad[:8].tolist()}{' ...' if bad.size > 8 else ''}; worst block {worst} "
        f"(max |diff| {blk_err[worst]:.6g})"
    ]
    s = slice(worst * block, min((worst + 1) * block, bo.size))
    idx = np.flatnonzero(nbits[s])[:show]
    for i in idx:
        j = s.start + i
        lines.append(f"  [{j}] ours {fo[j]!r} oracle {fr[j]!r} ({int(nbits[j])} bits differ)")
    return "\n".join(lines)


def assert_bits_equal(ours: np.ndarray, ref: np.ndarray, block: int = 32, what: str = "values") -> None:
    report = diff_report(ours, ref, block, what)
    assert report is None, report
