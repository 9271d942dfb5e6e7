"""The quant-type registry: one class per ggml type, registered by its ggml type id.

Every class works on packed blocks shaped ``(n_blocks, type_size)`` (uint8) and mirrors ggml's C code
(the function each class names). Shapes: B = blocks, Q = block_size weights, S = type_size bytes.
"""

from __future__ import annotations

import functools

import numpy as np

_REGISTRY: dict[int, type["QuantType"]] = {}


class UnsupportedQuantType(ValueError):
    """A ggml type id Strata cannot read (or one it knows but was asked to use where it cannot)."""


class QuantType:
    """Base of every ggml type. Subclasses declare ``qtype=`` (the ggml id) in the class statement.

    Class attributes a subclass sets:
      name          ggml's name ("Q4_K")
      block_size    weights per block (Q)
      type_size     bytes per block (S), written as field arithmetic, e.g. ``2 + 2 + 12 + 128``
      vec_dot_type  ggml id of the activation format its CPU dot product takes (SPEC §2)
    """

    qtype: int = -1
    name: str = ""
    block_size: int = 0
    type_size: int = 0
    vec_dot_type: int = -1
    weight: bool = True  # False for the activation-only formats (Q8_1, Q8_K): no vec_dot, no random_blocks

    def __init_subclass__(cls, qtype: int | None = None, **kw):
        super().__init_subclass__(**kw)
        if qtype is None:  # an abstract family base
            return
        assert (
            qtype not in _REGISTRY
        ), f"ggml type {qtype} registered twice ({_REGISTRY.get(qtype)} and {cls})"
        assert cls.block_size > 0 and cls.type_size > 0, f"{cls.__name__}: block geometry missing"
        cls.qtype = qtype
        _REGISTRY[qtype] = cls

    # --- the contract -------------------------------------------------------------------------------------
    @classmethod
    def dequantize(cls, blocks: np.ndarray) -> np.ndarray:
        """[B, S] uint8 -> [B, Q] float32, exactly ggml's ``dequantize_row_*``."""
        raise NotImplementedError

    @classmethod
    def quantize(cls, x: np.ndarray) -> np.ndarray:
        """[B, Q] float32 -> [B, S] uint8: ggml's reference quantiser where one is defined, else a valid one."""
        raise NotImplementedError

    @classmethod
    def random_blocks(cls, rng: np.random.Generator, n_blocks: int, scale: float) -> np.ndarray:
        """Random valid blocks [n_blocks, S] uint8 (finite scales, codes in range) whose dequantised
        weights have an RMS of roughly ``scale``. Fast (mostly raw random bytes), for synthetic models."""
        return cls._random(rng, int(n_blocks), float(scale) / _unit_rms(cls))

    @classmethod
    def _random(cls, rng: np.random.Generator, n_blocks: int, d: float) -> np.ndarray:
        """Random valid blocks whose super-scale holds ``d``; their RMS is proportional to ``d``."""
        raise NotImplementedError

    @classmethod
    def vec_dot(cls, w: np.ndarray, a: np.ndarray) -> np.ndarray:
        """q8-path dot products (docs/NUMERICS.md): w [N, B, S] uint8 weight rows, a [T, Ba, Sa] uint8
        activation rows already in ``vec_dot_type`` -> [T, N] float32. The class docstring gives the
        exact float32 block formula."""
        raise NotImplementedError

    @classmethod
    def row_bytes(cls, n: int) -> int:
        assert (
            n % cls.block_size == 0
        ), f"{cls.name}: row of {n} is not a whole number of {cls.block_size}-blocks"
        return n // cls.block_size * cls.type_size


@functools.cache
def _unit_rms(cls: type[QuantType]) -> float:
    """RMS of ``cls._random(..., d=1)`` blocks, measured once on a fixed sample (random_blocks divides by it)."""
    w = cls.dequantize(cls._random(np.random.default_rng(0), 512, 1.0)).astype(np.float64)
    return float(np.sqrt(np.mean(w * w)))


def get(qtype: int) -> type[QuantType]:
    try:
        return _REGISTRY[int(qtype)]
    except KeyError:
        raise UnsupportedQuantType(
            f"ggml type {type_name(qtype)} is not supported by Strata "
            f"(supported: {', '.join(c.name for c in registered())})"
        ) from None


def registered() -> list[type[QuantType]]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def type_name(qtype: int) -> str:
    """ggml's name for an id, known or not (for error messages)."""
    if int(qtype) in _REGISTRY:
        return _REGISTRY[int(qtype)].name
    try:
        import gguf

        return f"{gguf.GGMLQuantizationType(int(qtype)).name} (id {int(qtype)})"
    except Exception:
        return f"id {int(qtype)}"
