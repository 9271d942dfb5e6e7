"""The header parser and the writer, each checked against the gguf package's reader (the format's own code)."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from strata.gguf_file import BadTensorError, GGUFError, GGUFFile, NotGGUFError, TruncatedGGUFError
from strata.gguf_writer import GGUFWriter


def _write(path, n_vocab=300, extra=None):
    w = GGUFWriter("qwen3moe")
    w.add("qwen3moe.block_count", 2, 4)
    w.add("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)
    w.add("tokenizer.ggml.tokens", [f"tok{i}-é" for i in range(n_vocab)])
    w.add("tokenizer.ggml.token_type", [1] * n_vocab, item_type=5)
    w.add("tokenizer.ggml.scores", [float(i) for i in range(n_vocab)], item_type=6)
    w.add("some.bool", True)
    w.add("some.neg", -5, 5)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((8, 64)).astype(np.float32)                   # numpy [rows, cols] = ggml ne (64, 8)
    h = rng.standard_normal((3, 4, 32)).astype(np.float16)
    q = rng.integers(0, 255, (16, 2 * 34), dtype=np.uint8)                # 16 rows of 64 Q8_0 weights
    q[:, 0:2] = q[:, 34:36] = 0                                           # keep fp16 scales finite (zero)
    w.add_array("a.weight", a, 0)
    w.add_array("h.weight", h, 1)
    w.add_array("q.weight", q, 8, ne=(64, 16))
    for k, v in (extra or {}).items():
        w.add(k, v)
    w.write(str(path))
    return a, h, q


def test_roundtrip_matches_gguf_reader(tmp_path):
    p = tmp_path / "m.gguf"
    a, h, q = _write(p)
    r = gguf.GGUFReader(str(p))
    with GGUFFile(p) as f:
        assert f.version == 3 and f.arch == "qwen3moe"
        for name, fld in r.fields.items():
            if name.startswith("GGUF."):
                continue
            v = fld.contents()
            ours = f.metadata[name]
            if isinstance(v, float):
                assert np.float32(ours) == np.float32(v), name
            else:
                assert ours == v, name
        assert f.data_offset == r.data_offset
        for t in r.tensors:
            mine = f.tensors[t.name]
            assert mine.offset == t.data_offset and mine.qtype == int(t.tensor_type)
            assert list(mine.ne) == [int(x) for x in t.shape]
            assert np.array_equal(f.view(t.name), np.asarray(t.data)), t.name
        assert np.array_equal(f.view("a.weight"), a) and np.array_equal(f.view("h.weight"), h)
        assert np.array_equal(f.view("q.weight"), q)
        assert f.raw("q.weight").base is not None  # a view of the file map, not a copy


def test_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"PK\x03\x04 this is a zip file")
    with pytest.raises(NotGGUFError, match="not a GGUF file.*PK"):
        GGUFFile(p)


def test_empty_file(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"")
    with pytest.raises(NotGGUFError):
        GGUFFile(p)


@pytest.mark.parametrize("keep", [10, 200, 2000])
def test_truncated_header(tmp_path, keep):
    p = tmp_path / "m.gguf"
    _write(p)
    p.write_bytes(p.read_bytes()[:keep])
    with pytest.raises(TruncatedGGUFError, match="truncated"):
        GGUFFile(p)


def test_truncated_data(tmp_path):
    p = tmp_path / "m.gguf"
    _write(p)
    b = p.read_bytes()
    p.write_bytes(b[:-100])
    with pytest.raises(TruncatedGGUFError, match=r"tensor .* needs bytes"):
        GGUFFile(p)


def test_unknown_type_id(tmp_path):
    p = tmp_path / "m.gguf"
    _write(p)
    b = bytearray(p.read_bytes())
    # the tensor infos end with (type u32, offset u64): patch q.weight's type 8 to 99
    i = b.index(b"q.weight")
    j = i + len(b"q.weight") + 4 + 2 * 8
    assert int.from_bytes(b[j:j + 4], "little") == 8
    b[j:j + 4] = (99).to_bytes(4, "little")
    p.write_bytes(bytes(b))
    with pytest.raises(BadTensorError, match="unknown ggml type id 99"):
        GGUFFile(p)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFError, match="no such file"):
        GGUFFile(tmp_path / "nope.gguf")


def test_a_write_that_fails_leaves_the_old_file_and_no_part(tmp_path):
    """GGUFWriter.write goes to PATH.part and renames it when whole: a producer that fails half way (a full disk,
    ^C) leaves an existing file at PATH untouched and no .part behind; a whole write replaces it."""
    p = tmp_path / "m.gguf"
    _write(p)
    before = p.read_bytes()

    def failing():
        yield np.zeros(256, np.uint8)
        raise OSError(28, "No space left on device")
    w = GGUFWriter("qwen3moe")
    w.add("qwen3moe.block_count", 1, 4)
    w.add_tensor("x.weight", (64, 16), 0, failing)
    with pytest.raises(OSError, match="No space left"):
        w.write(str(p))
    assert p.read_bytes() == before and sorted(f.name for f in tmp_path.iterdir()) == ["m.gguf"]
    w = GGUFWriter("qwen3moe")
    w.add("qwen3moe.block_count", 1, 4)
    w.add_array("x.weight", np.ones((16, 64), np.float32), 0)
    w.write(str(p))
    with GGUFFile(p) as f:
        assert list(f.tensors) == ["x.weight"]
    assert sorted(f.name for f in tmp_path.iterdir()) == ["m.gguf"]


def test_a_directory_is_named_as_one(tmp_path):
    with pytest.raises(GGUFError, match="is a directory, not a GGUF file"):
        GGUFFile(tmp_path)


def test_an_unreadable_file_is_named_as_one(tmp_path, monkeypatch):
    """(As root, chmod 000 still reads: the refusal is injected where the file opens.)"""
    from strata import gguf_file

    def refuse(*a, **kw):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(gguf_file, "open", refuse, raising=False)
    with pytest.raises(GGUFError, match="m.gguf: permission denied"):
        GGUFFile(tmp_path / "m.gguf")


def test_large_vocabulary_parses_like_gguf_reader(tmp_path):
    """151,936 tokens (Qwen's vocabulary size): same strings as GGUFReader (speed: bench/open_gguf.py)."""
    p = tmp_path / "v.gguf"
    _write(p, n_vocab=151_936)
    with GGUFFile(p) as f:
        toks = f.metadata["tokenizer.ggml.tokens"]
        assert len(toks) == 151_936 and toks[151_935] == "tok151935-é"
        assert f.metadata["tokenizer.ggml.scores"][7] == 7.0
