"""Loading models: configs read back as written, every tensor checked, specific errors for bad files."""

import subprocess
import sys

import numpy as np
import pytest

from strata import models, quants
from strata.gguf_file import GGUFFile
from strata.gguf_writer import GGUFWriter
from strata.models import (BadTensorShape, InconsistentConfig, MissingTensor, Routing, UnsupportedArchitecture)
from strata.synth.build import shape_config, synthesise
from strata.synth.presets import PRESETS

TINY = ["tiny-qwen3moe", "tiny-mixtral", "tiny-qwen2moe", "tiny-olmoe"]
ROUTING = {"qwen3moe": Routing.SOFTMAX_TOPK_RENORM, "llama": Routing.SOFTMAX_TOPK_RENORM,
           "qwen2moe": Routing.SOFTMAX_TOPK, "olmoe": Routing.SOFTMAX_TOPK}


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    out = {}
    for name in TINY:
        p = d / f"{name}.gguf"
        synthesise(PRESETS[name], str(p), seed=1)
        out[name] = p
    return out


@pytest.mark.parametrize("name", TINY)
def test_synthesised_model_loads_with_its_config(tiny_files, name):
    shape = PRESETS[name]
    with models.load(tiny_files[name]) as m:
        assert m.cfg == shape_config(shape)
        assert m.cfg.routing is ROUTING[shape.arch]
        assert m.expert_blob_bytes(0) == shape.expert_blob_bytes(0)
        for layer in range(shape.n_layer):
            s = m.expert(layer, 3)
            assert s.types == tuple(shape.type_of(r, layer) for r in ("exp_gate", "exp_up", "exp_down"))
            # zero copy: the slices are views of the file map
            assert not s.gate.flags.owndata and not s.down.flags.owndata
            blob = s.blob()
            assert blob.nbytes == shape.expert_blob_bytes(layer)
            g = m.view(f"blk.{layer}.ffn_gate_exps.weight")[3].reshape(-1).view(np.uint8)
            assert np.array_equal(blob[:g.nbytes], g)


def test_synthesis_is_deterministic(tmp_path):
    a, b, c = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "c.gguf"
    synthesise(PRESETS["tiny-olmoe"], str(a), seed=3)
    synthesise(PRESETS["tiny-olmoe"], str(b), seed=3)
    synthesise(PRESETS["tiny-olmoe"], str(c), seed=4)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


@pytest.mark.parametrize("name", TINY)
def test_tiny_presets_fit_in_2mb(tiny_files, name):
    assert tiny_files[name].stat().st_size <= 2_000_000


def test_synth_cli_then_load_prints_config(tmp_path):
    p = tmp_path / "m.gguf"
    r = subprocess.run([sys.executable, "-m", "strata.synth", "--preset", "tiny-qwen3moe", "--out", str(p)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", f"from strata import models; print(models.load({str(p)!r}).cfg)"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "MoEConfig(arch='qwen3moe'" in r.stdout and "n_expert=8" in r.stdout


def test_info_cli(tiny_files):
    r = subprocess.run([sys.executable, "-m", "strata", "info", str(tiny_files["tiny-qwen2moe"])],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "architecture  qwen2moe" in r.stdout and "IQ3_S" in r.stdout and "blob bytes" in r.stdout


def test_info_cli_error_exit(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"not a model at all")
    r = subprocess.run([sys.executable, "-m", "strata", "info", str(p)], capture_output=True, text=True)
    assert r.returncode != 0 and "not a GGUF file" in r.stderr


# --- errors: build small broken files by rewriting a good one through our writer ------------------------------
def _rewrite(src, dst, *, arch=None, drop=(), reshape=None, retype=None, meta=None):
    """Copy a GGUF, changing the architecture, dropping tensors, or changing a tensor's declared shape/type."""
    with GGUFFile(src) as f:
        w = GGUFWriter(arch or f.arch)
        for k, v in f.metadata.items():
            if k == "general.architecture":
                continue
            if arch and k.startswith(f.arch + "."):
                k = arch + k[len(f.arch):]
            v = (meta or {}).get(k, v)
            it = {5: 5, 6: 6}.get(f.metadata_types.get(k))
            if isinstance(v, list) and v and isinstance(v[0], int) and k.endswith("token_type"):
                w.add(k, v, item_type=5)
            elif isinstance(v, list) and v and isinstance(v[0], float):
                w.add(k, v, item_type=6)
            else:
                w.add(k, v, it if not isinstance(v, list) else None)
        for name, t in f.tensors.items():
            if name in drop:
                continue
            data = np.array(f.raw(name))
            ne, qt = t.ne, t.qtype
            if reshape and name in reshape:
                ne = reshape[name]
                q, s = quants.get(qt).block_size, quants.get(qt).type_size
                data = np.zeros(int(np.prod(ne)) // q * s, np.uint8)
            if retype and name in retype:
                qt = retype[name]
                q, s = quants.get(qt).block_size if qt != 34 else 256, quants.get(qt).type_size if qt != 34 else 54
                data = np.zeros(int(np.prod(ne)) // q * s, np.uint8)
            w.add_tensor(name, ne, qt, lambda d=data: [d])
        w.write(str(dst))


def test_unknown_architecture(tiny_files, tmp_path):
    p = tmp_path / "m.gguf"
    _rewrite(tiny_files["tiny-olmoe"], p, arch="gpt-oss-moe")
    with pytest.raises(UnsupportedArchitecture, match="'gpt-oss-moe' is not supported.*qwen3moe, llama, qwen2moe"):
        models.load(p)


def test_missing_tensor(tiny_files, tmp_path):
    p = tmp_path / "m.gguf"
    _rewrite(tiny_files["tiny-qwen3moe"], p, drop={"blk.1.attn_k_norm.weight"})
    with pytest.raises(MissingTensor, match=r"needs tensor blk\.1\.attn_k_norm\.weight"):
        models.load(p)


def test_misshaped_tensor(tiny_files, tmp_path):
    p = tmp_path / "m.gguf"
    _rewrite(tiny_files["tiny-qwen3moe"], p, reshape={"blk.0.attn_q.weight": (256, 128)})
    with pytest.raises(BadTensorShape, match=r"blk\.0\.attn_q\.weight has ggml shape \[256, 128\].*needs \[256, 256\]"):
        models.load(p)


def test_unsupported_quant_type_names_type_and_tensor(tiny_files, tmp_path):
    p = tmp_path / "m.gguf"
    _rewrite(tiny_files["tiny-qwen3moe"], p, retype={"blk.0.ffn_up_exps.weight": 34})   # TQ1_0
    with pytest.raises(quants.UnsupportedQuantType, match=r"blk\.0\.ffn_up_exps\.weight has ggml type TQ1_0"):
        models.load(p)


def test_inconsistent_hyperparameters(tiny_files, tmp_path):
    p = tmp_path / "m.gguf"
    _rewrite(tiny_files["tiny-qwen3moe"], p, meta={"qwen3moe.expert_used_count": 9})
    with pytest.raises(InconsistentConfig, match=r"expert_used_count \(9\) exceeds expert_count \(8\)"):
        models.load(p)
    _rewrite(tiny_files["tiny-qwen3moe"], p, meta={"qwen3moe.attention.head_count_kv": 3})
    with pytest.raises(InconsistentConfig, match="multiple of key/value heads"):
        models.load(p)


def test_dense_llama_is_refused(tiny_files, tmp_path):
    p = tmp_path / "m.gguf"
    _rewrite(tiny_files["tiny-mixtral"], p, meta={"llama.expert_count": 0})
    with pytest.raises(UnsupportedArchitecture, match="dense model"):
        models.load(p)
