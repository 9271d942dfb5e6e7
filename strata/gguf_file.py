"""Open a GGUF file: our own header parser over one read-only memory map, zero-copy tensor views.

`gguf.GGUFReader` builds a numpy array per metadata string and takes ~8 s on a 151,936-token vocabulary
(notes/tooling.md §1.1); this parser reads the same header in a fraction of that and is checked against
GGUFReader in the tests. Format: llama.cpp `gguf.cpp` / gguf-py `gguf_reader.py` (version 2 and 3, little-endian).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

import numpy as np

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types (gguf.GGUFValueType)
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NP = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
       12: "<f8"}
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")

# ggml types whose tensors come out typed (numpy shape = ggml ne reversed); all others come out as bytes.
_TYPED = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64, 28: np.float64}
Q2_0_ID = 42  # the original's Q2_0 (SPEC §1); not in gguf 0.19's enum


class GGUFError(ValueError):
    """Base of every error raised while opening or reading a GGUF file."""


class NotGGUFError(GGUFError):
    pass


class TruncatedGGUFError(GGUFError):
    pass


class BadTensorError(GGUFError):
    """A tensor's type, size or placement is impossible (unknown type id, overlap, wrong layout)."""


def block_geometry(qtype: int) -> tuple[int, int]:
    """(weights per block, bytes per block) of a ggml type id, from gguf's table plus Q2_0."""
    if qtype == Q2_0_ID:
        return 64, 18
    import gguf

    try:
        return gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(qtype)]
    except (ValueError, KeyError):
        raise BadTensorError(f"unknown ggml type id {qtype}") from None


def type_name(qtype: int) -> str:
    if qtype == Q2_0_ID:
        return "Q2_0"
    import gguf

    try:
        return gguf.GGMLQuantizationType(qtype).name
    except ValueError:
        return f"type{qtype}"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    qtype: int                  # ggml type id
    ne: tuple[int, ...]         # ggml order: innermost (row length) first
    offset: int                 # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy order (ne reversed): rows last-but-one, row length last."""
        return tuple(reversed(self.ne))

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        return type_name(self.qtype)

    @property
    def row_bytes(self) -> int:
        q, s = block_geometry(self.qtype)
        return self.ne[0] // q * s


class _Cursor:
    __slots__ = ("buf", "pos", "path")

    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def need(self, n: int, what: str):
        if self.pos + n > len(self.buf):
            raise TruncatedGGUFError(f"{self.path}: truncated GGUF: the header ends inside {what} "
                                     f"(byte {self.pos} + {n} > file size {len(self.buf)})")

    def scalar(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:  # some vocabularies hold raw bytes; keep them recoverable
            return raw.decode("utf-8", "surrogateescape")

    def strings(self, count: int, what: str) -> list[str]:
        # the hot loop of opening a 150k-token vocabulary: keep it to one unpack, one slice, one decode
        buf, pos, out, size = self.buf, self.pos, [], len(self.buf)
        unpack, app = _U64.unpack_from, out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                self.need(8, what)
            n = unpack(buf, pos)[0]
            pos += 8
            if pos + n > size:
                self.pos = pos
                self.need(n, what)
            raw = buf[pos:pos + n]
            pos += n
            try:
                app(raw.decode("utf-8"))
            except UnicodeDecodeError:
                app(raw.decode("utf-8", "surrogateescape"))
        self.pos = pos
        return out

    def value(self, vtype: int, what: str):
        if vtype in _SCALAR:
            return self.scalar(_SCALAR[vtype], what)
        if vtype == _STRING:
            return self.string(what)
        if vtype == _ARRAY:
            itype = self.scalar("<I", what)
            count = self.scalar("<Q", what)
            if itype == _STRING:
                return self.strings(count, what)
            if itype in _NP:
                dt = np.dtype(_NP[itype])
                self.need(count * dt.itemsize, what)
                arr = np.frombuffer(self.buf, dt, count, self.pos)
                self.pos += count * dt.itemsize
                return [bool(x) for x in arr] if itype == 7 else arr.tolist()
            if itype == _ARRAY:
                return [self.value(_ARRAY, what) for _ in range(count)]
            raise GGUFError(f"{self.path}: unknown array item type {itype} in {what}")
        raise GGUFError(f"{self.path}: unknown metadata value type {vtype} in {what}")


class GGUFFile:
    """A GGUF file opened read-only: `metadata` (key -> Python value), `tensors` (name -> TensorInfo) and
    zero-copy views of tensor data. Use as a context manager or call close()."""

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        try:
            self._fd = open(self.path, "rb")
        except FileNotFoundError:
            raise GGUFError(f"{self.path}: no such file") from None
        except IsADirectoryError:
            raise GGUFError(f"{self.path} is a directory, not a GGUF file") from None
        except PermissionError:
            raise GGUFError(f"{self.path}: permission denied (the file cannot be read)") from None
        size = os.fstat(self._fd.fileno()).st_size
        if size < 4:
            self._fd.close()
            raise NotGGUFError(f"{self.path} is not a GGUF file: it holds {size} bytes")
        self._map = mmap.mmap(self._fd.fileno(), 0, access=mmap.ACCESS_READ)
        self.file_size = size
        try:
            self._parse()
        except Exception:
            self.close()
            raise

    # ---------------------------------------------------------------------------------------------------
    def _parse(self):
        buf = self._map   # slicing an mmap gives bytes; struct and numpy read it in place
        if buf[:4] != GGUF_MAGIC:
            raise NotGGUFError(f"{self.path} is not a GGUF file: it starts with {buf[:4]!r}, "
                               f"a GGUF file starts with {GGUF_MAGIC!r}")
        cur = _Cursor(buf, self.path)
        cur.pos = 4
        self.version = cur.scalar("<I", "the version")
        if self.version not in (2, 3):
            raise GGUFError(f"{self.path}: GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors = cur.scalar("<Q", "the tensor count")
        n_kv = cur.scalar("<Q", "the metadata count")
        if n_tensors > 10_000_000 or n_kv > 10_000_000:
            raise GGUFError(f"{self.path}: implausible header ({n_tensors} tensors, {n_kv} keys): corrupt file?")
        meta: dict[str, object] = {}
        meta_types: dict[str, int] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key #{i}")
            vtype = cur.scalar("<I", f"the type of {key}")
            meta[key] = cur.value(vtype, f"metadata value {key}")
            meta_types[key] = vtype
        self.metadata = meta
        self.metadata_types = meta_types
        self.alignment = int(meta.get("general.alignment", DEFAULT_ALIGNMENT))
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise GGUFError(f"{self.path}: general.alignment {self.alignment} is not a power of two")
        infos = []
        for i in range(n_tensors):
            name = cur.string(f"tensor info #{i}")
            n_dims = cur.scalar("<I", f"tensor {name}")
            if n_dims > 4:
                raise BadTensorError(f"{self.path}: tensor {name} has {n_dims} dimensions (GGUF allows 4)")
            ne = tuple(cur.scalar("<Q", f"tensor {name}") for _ in range(n_dims))
            qtype = cur.scalar("<I", f"tensor {name}")
            off = cur.scalar("<Q", f"tensor {name}")
            infos.append((name, ne, qtype, off))
        data_start = -(-cur.pos // self.alignment) * self.alignment
        self.data_offset = data_start
        tensors: dict[str, TensorInfo] = {}
        for name, ne, qtype, off in infos:
            q, s = block_geometry(qtype)
            if ne and ne[0] % q:
                raise BadTensorError(f"{self.path}: tensor {name} rows of {ne[0]} are not a whole number of "
                                     f"{type_name(qtype)} blocks of {q}")
            n = 1
            for d in ne:
                n *= d
            t = TensorInfo(name, qtype, ne, data_start + off, n // q * s)
            if name in tensors:
                raise BadTensorError(f"{self.path}: tensor {name} appears twice")
            tensors[name] = t
        self._check_placement(tensors)
        self.tensors = tensors

    def _check_placement(self, tensors: dict[str, TensorInfo]):
        ordered = sorted(tensors.values(), key=lambda t: t.offset)
        for a, b in zip(ordered, ordered[1:]):
            if a.offset + a.nbytes > b.offset:
                hint = (" (ggml id 42 is Q2_0 here, 64 weights in 18 bytes; some forks use 42 for another "
                        "layout)") if a.qtype == Q2_0_ID else ""
                raise BadTensorError(f"{self.path}: tensor {a.name} ({a.type_name}, {a.nbytes} bytes) overlaps "
                                     f"tensor {b.name} at byte {b.offset}{hint}")
        if ordered:
            last = ordered[-1]
            end = last.offset + last.nbytes
            if end > self.file_size:
                raise TruncatedGGUFError(f"{self.path}: truncated GGUF: tensor {last.name} needs bytes "
                                         f"{last.offset}..{end} but the file has {self.file_size} bytes")

    # ---------------------------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        a = self.metadata.get("general.architecture")
        if not isinstance(a, str):
            raise GGUFError(f"{self.path}: no general.architecture key")
        return a

    def info(self, name: str) -> TensorInfo:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name}") from None

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as a read-only uint8 view of the file map (no copy)."""
        t = self.info(name)
        return np.frombuffer(self._map, np.uint8, t.nbytes, t.offset)

    def view(self, name: str) -> np.ndarray:
        """Typed view for F32/F16/int types (numpy shape), else uint8 [..., rows, row_bytes] (no copy)."""
        t = self.info(name)
        raw = self.raw(name)
        if t.qtype in _TYPED:
            return raw.view(_TYPED[t.qtype]).reshape(t.shape)
        return raw.reshape(t.shape[:-1] + (t.row_bytes,))

    def close(self):
        m, self._map = getattr(self, "_map", None), None
        if m is not None:
            try:
                m.close()
            except BufferError:  # views still alive: the map closes when they are collected
                pass
        fd = getattr(self, "_fd", None)
        if fd is not None:
            fd.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
