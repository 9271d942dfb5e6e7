"""Write strata-tiny's GGUFs from a training run's final.pt, through our own writer (`strata.gguf_writer`).

    python tools/export_tiny.py --ckpt CKPT_DIR/final.pt [--out-dir strata/data]

Two files: `strata-tiny.Q8_0.gguf` (every 2-D weight Q8_0, exactly ggml-encodable: our Q8_0 encoder is ggml's
`quantize_row_q8_0_ref`) and `strata-tiny.Q4_K.gguf` (llama.cpp's Q4_K_M-like mix where rows allow it: Q4_K
embedding, attention and expert gate/up, Q6_K output and attn_v; the expert down rows are F = 64 long, not a
multiple of QK_K = 256, so they stay Q8_0). Norms and routers are F32 in both.
Needs torch only to read final.pt.
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tools")]

import numpy as np  # noqa: E402

from strata import quants  # noqa: E402
from strata.gguf_writer import GGUFWriter  # noqa: E402
from strata.models import arch_module  # noqa: E402
from strata.synth.build import TOKENIZER_KEY_TYPES, arch_metadata, role_of, shape_config  # noqa: E402
from strata.synth.presets import GGML, ModelShape  # noqa: E402

NAME = "strata-tiny"
EOT = "<|endoftext|>"
PROMPT_FORMAT = (
    "plain text continuation, no chat template: the prompt is the start of a Python source file "
    "(or any Python code); files were separated by <|endoftext|> in training; no BOS token"
)
# role -> ggml type; norms and routers are F32 (role_of's "norm" and "router")
MIXES = {
    "Q8_0": dict(
        embd="Q8_0",
        output="Q8_0",
        attn_q="Q8_0",
        attn_k="Q8_0",
        attn_v="Q8_0",
        attn_output="Q8_0",
        exp_gate="Q8_0",
        exp_up="Q8_0",
        exp_down="Q8_0",
    ),
    "Q4_K": dict(
        embd="Q4_K",
        output="Q6_K",
        attn_q="Q4_K",
        attn_k="Q4_K",
        attn_v="Q6_K",
        attn_output="Q4_K",
        exp_gate="Q4_K",
        exp_up="Q4_K",
        exp_down="Q8_0",
    ),
}
FILE_TYPE = {"Q8_0": 7, "Q4_K": 15}  # llama_ftype: MOSTLY_Q8_0, MOSTLY_Q4_K_M


def model_shape(cfg: dict, mix: str) -> ModelShape:
    return ModelShape(
        "qwen3moe",
        cfg["n_layer"],
        cfg["n_embd"],
        cfg["n_head"],
        cfg["n_head_kv"],
        cfg["head_dim"],
        cfg["n_expert"],
        cfg["n_expert_used"],
        cfg["n_ff_exp"],
        cfg["n_vocab"],
        n_ctx=cfg["n_ctx"],
        rope_base=cfg["rope_base"],
        rms_eps=cfg["rms_eps"],
        types={k: GGML[v] for k, v in MIXES[mix].items()},
    )


def tokenizer_keys(tokens: list[str], types: list[int], merges: list[str]) -> dict:
    from strata.synth.bpe import tokenizer_metadata

    return tokenizer_metadata(tokens, types, merges, "qwen2", bos=None, eos=EOT, eot=EOT, chat_template=None)


def encode(x: np.ndarray, qtype: int) -> np.ndarray:
    """float32 weights (numpy shape) -> the bytes ggml stores: typed F32, or [rows, row_bytes] uint8."""
    x = np.ascontiguousarray(x, np.float32)
    if qtype == GGML["F32"]:
        return x
    q = quants.get(qtype)
    rows = x.reshape(-1, x.shape[-1])
    return q.quantize(rows.reshape(-1, q.block_size)).reshape(rows.shape[0], -1)


def write_gguf(
    path: str, weights: dict[str, np.ndarray], cfg: dict, tok: dict, mix: str, record: dict
) -> int:
    shape = model_shape(cfg, mix)
    mcfg = shape_config(shape)
    w = GGUFWriter("qwen3moe")
    w.add("general.name", NAME)
    w.add(
        "general.description",
        "strata-tiny: a small qwen3moe trained on CPython standard-library sources "
        "(PSF licence) to be Strata's bundled default model; see MODEL_CARD.md",
    )
    w.add("general.license", "MIT")
    w.add("general.file_type", FILE_TYPE[mix], 4)
    w.add("general.quantization_version", 2, 4)
    arch_metadata(w, shape, mcfg)
    for k, v in tok.items():
        w.add(k, v, *TOKENIZER_KEY_TYPES.get(k, (None, None)))
    w.add("strata.prompt_format", PROMPT_FORMAT)
    w.add(
        "strata.train.corpus",
        f"CPython {record['python']} Lib/*.py, {len(record['train_files'])} files "
        f"(sha256 of all {len(record['train_files']) + len(record['heldout_files'])}: "
        f"{record['corpus_sha256']})",
    )
    w.add("strata.train.heldout_files", list(record["heldout_files"]))
    w.add("strata.train.steps", int(record["steps"]), 4)
    w.add("strata.train.tokens_seen", int(record["tokens_seen"]), 4)
    req, _ = arch_module("qwen3moe").tensor_specs(mcfg)
    for name, ne in req.items():
        role, layer = role_of(name)
        qt = GGML["F32"] if role in ("norm", "router") else shape.type_of(role, layer)
        x = weights[name]
        assert tuple(reversed(x.shape)) == tuple(ne), f"{name}: weights {x.shape}, the file needs ne {ne}"
        data = encode(x, qt)
        w.add_tensor(name, tuple(ne), qt, lambda d=data: [d])
    return w.write(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ckpt", required=True, help="final.pt from tools/train_tiny.py")
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "strata", "data"))
    ap.add_argument("--mix", action="append", choices=sorted(MIXES), help="only these (default: all)")
    a = ap.parse_args(argv)
    import torch

    ck = torch.load(a.ckpt, weights_only=False)
    weights = {k: v.double().numpy().astype(np.float32) for k, v in ck["weights"].items()}
    tok = tokenizer_keys(ck["tokens"], ck["types"], ck["merges"])
    for mix in a.mix or sorted(MIXES):
        path = os.path.join(a.out_dir, f"{NAME}.{mix}.gguf")
        size = write_gguf(path, weights, ck["config"], tok, mix, ck["record"])
        print(f"export: wrote {path} ({size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
