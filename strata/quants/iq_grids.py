"""Lookup tables of the i-quants, as integer numpy arrays (read-only).

The grids are ggml's ``iq2xxs_grid``, ``iq2xs_grid``, ``iq2s_grid``, ``iq3xxs_grid``, ``iq3s_grid`` and
``iq1s_grid`` (ggml-common.h), each uint64/uint32 entry unpacked to its bytes. They are taken at import from
the gguf package, which stores them compactly (``gguf.quants.IQ2_XXS.grid_hex`` …); tests check sample
entries against values transcribed from ggml-common.h.
"""

from __future__ import annotations

import gguf.quants as _gq
import numpy as np


def _grid(qcls, dtype) -> np.ndarray:
    qcls.init_grid()  # gguf decodes grid_hex into a float32 table of shape (1, 1, *grid_shape)
    g = np.asarray(qcls.grid).reshape(qcls.grid_shape)
    out = g.astype(dtype)
    assert np.array_equal(out.astype(np.float32), g), f"{qcls.__name__} grid is not integral"
    out.flags.writeable = False
    return out


def _ro(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


IQ2XXS_GRID = _grid(_gq.IQ2_XXS, np.uint8)  # [256, 8], values 8, 25, 43
IQ2XS_GRID = _grid(_gq.IQ2_XS, np.uint8)  # [512, 8]
IQ2S_GRID = _grid(_gq.IQ2_S, np.uint8)  # [1024, 8]
IQ3XXS_GRID = _grid(_gq.IQ3_XXS, np.uint8)  # [256, 4], values 4, 12, ..., 62
IQ3S_GRID = _grid(_gq.IQ3_S, np.uint8)  # [512, 4], values 1, 3, ..., 15
IQ1S_GRID = _grid(_gq.IQ1_S, np.int8)  # [2048, 8], values -1, 0, 1

# ksigns_iq2xs: 7 stored sign bits plus an 8th that makes the count of minus signs even
KSIGNS = _ro(np.array([i | ((bin(i).count("1") & 1) << 7) for i in range(128)], np.uint8))

KVALUES_IQ4NL = _ro(
    np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
)
KVALUES_MXFP4 = _ro(np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8))  # 2·E2M1

IQ1S_DELTA = np.float32(0.125)  # IQ1S_DELTA == IQ1M_DELTA in ggml-common.h
