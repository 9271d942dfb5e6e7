"""Write GGUF v3 files, streaming tensor data so a 17 GB model never sits in RAM.

Declare metadata and tensors first (name, ggml shape, type), then `write(path, producer)`: the header goes out,
then each tensor's bytes in declaration order, each produced on demand (a callable returning uint8 chunks).
Format: llama.cpp `gguf.cpp` (`gguf_write_to_file`); checked against `gguf.GGUFReader` in the tests.
"""

from __future__ import annotations

import contextlib
import os
import struct
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from strata.gguf_file import DEFAULT_ALIGNMENT, GGUF_MAGIC, block_geometry

# GGUF value type ids (gguf.GGUFValueType)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q",
        I64: "<q", F64: "<d"}


def _string(s: str) -> bytes:
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _infer(value) -> int:
    if isinstance(value, bool):
        return BOOL
    if isinstance(value, int):
        return U32 if 0 <= value < 2**32 else I64
    if isinstance(value, float):
        return F32
    if isinstance(value, str):
        return STRING
    raise TypeError(f"cannot infer a GGUF type for {value!r}; pass vtype")


@dataclass
class _Tensor:
    name: str
    ne: tuple[int, ...]     # ggml order, innermost first
    qtype: int
    nbytes: int
    produce: Callable[[], Iterable[np.ndarray | bytes]]


class GGUFWriter:
    def __init__(self, arch: str, alignment: int = DEFAULT_ALIGNMENT):
        self.alignment = alignment
        self._kv: list[bytes] = []
        self._keys: set[str] = set()
        self._tensors: list[_Tensor] = []
        self.add("general.architecture", arch)
        if alignment != DEFAULT_ALIGNMENT:
            self.add("general.alignment", alignment, U32)

    def add(self, key: str, value, vtype: int | None = None, item_type: int | None = None) -> None:
        """One metadata key. Lists need `item_type` unless it can be inferred from their first item."""
        assert key not in self._keys, f"metadata key {key} added twice"
        self._keys.add(key)
        out = [_string(key)]
        if isinstance(value, (list, tuple, np.ndarray)):
            items = list(value.tolist() if isinstance(value, np.ndarray) else value)
            it = item_type if item_type is not None else (_infer(items[0]) if items else U32)
            out.append(struct.pack("<IIQ", ARRAY, it, len(items)))
            if it == STRING:
                out.extend(_string(s) for s in items)
            else:
                out.append(np.asarray(items, dtype=np.dtype(_FMT[it])).tobytes())
        else:
            vt = vtype if vtype is not None else _infer(value)
            out.append(struct.pack("<I", vt))
            out.append(_string(value) if vt == STRING else struct.pack(_FMT[vt], value))
        self._kv.append(b"".join(out))

    def add_tensor(self, name: str, ne: tuple[int, ...], qtype: int,
                   produce: Callable[[], Iterable[np.ndarray | bytes]]) -> None:
        """A tensor of ggml shape `ne` (innermost first) and type `qtype`; `produce()` yields its bytes."""
        assert all(t.name != name for t in self._tensors), f"tensor {name} added twice"
        q, s = block_geometry(qtype)
        assert ne[0] % q == 0, f"{name}: rows of {ne[0]} are not whole blocks of {q}"
        n = int(np.prod(ne, dtype=np.int64))
        self._tensors.append(_Tensor(name, tuple(int(d) for d in ne), qtype, n // q * s, produce))

    def add_array(self, name: str, data: np.ndarray, qtype: int, ne: tuple[int, ...] | None = None) -> None:
        """A tensor whose bytes are already in memory (numpy shape = ne reversed for typed data)."""
        ne = ne if ne is not None else tuple(reversed(data.shape))
        buf = np.ascontiguousarray(data)
        self.add_tensor(name, ne, qtype, lambda: [buf])

    def _pad(self, n: int) -> int:
        return -(-n // self.alignment) * self.alignment

    def write(self, path: str, progress: Callable[[int, int], None] | None = None) -> int:
        """Write the file; `progress(done_bytes, total_bytes)` is called as tensor data goes out. The bytes go to
        `path`.part, renamed to `path` once whole: a write that fails (a full disk, ^C) leaves no truncated GGUF and
        an existing file at `path` as it was."""
        part = os.fspath(path) + ".part"
        try:
            size = self._write(part, progress)
            os.replace(part, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.remove(part)
            raise
        return size

    def _write(self, path: str, progress: Callable[[int, int], None] | None) -> int:
        infos, off = [], 0
        for t in self._tensors:
            infos.append(_string(t.name) + struct.pack("<I", len(t.ne)) +
                         struct.pack(f"<{len(t.ne)}Q", *t.ne) + struct.pack("<IQ", t.qtype, off))
            off = self._pad(off + t.nbytes)
        total = off
        head = b"".join([GGUF_MAGIC, struct.pack("<IQQ", 3, len(self._tensors), len(self._kv)), *self._kv, *infos])
        with open(path, "wb") as f:
            f.write(head)
            f.write(b"\0" * (self._pad(len(head)) - len(head)))
            done = 0
            for t in self._tensors:
                wrote = 0
                for chunk in t.produce():
                    mv = memoryview(chunk if isinstance(chunk, bytes) else np.ascontiguousarray(chunk)).cast("B")
                    f.write(mv)
                    wrote += mv.nbytes
                    if progress:
                        progress(done + wrote, total)
                if wrote != t.nbytes:
                    raise ValueError(f"tensor {t.name}: produced {wrote} bytes, its shape and type need {t.nbytes}")
                pad = self._pad(t.nbytes) - t.nbytes
                f.write(b"\0" * pad)
                done += t.nbytes + pad
            size = f.tell()
        return size
