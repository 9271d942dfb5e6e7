"""Write the llama.cpp oracle (tests/test_oracles.py reads it): llama.cpp's tokens, logits and greedy tokens
for the golden models (quantised, mixed types) and the converter's F32 models of golden/oracle/transformers/.

Run on demand, from the repository root (about 5 seconds):

    python golden/oracle/llama_cpp/make_oracle.py --llama-python VENV/bin/python

The llama.cpp part runs in the interpreter given by --llama-python (llama-cpp-python 0.3.36 built from its
source distribution, CPU); this interpreter only adds Strata's own tokenization next to llama.cpp's, for the
record (the test recomputes it). Per model M, M.npz holds, for every golden prompt i:
  ids_i              [T] int32    llama.cpp's tokens (`Llama.tokenize(text, add_bos=True, special=True)`)
  ours_ids_i         [T] int32    strata.tokenizer's, when this file was written
  greedy_<kv>_i      [32] int32   llama.cpp's greedy continuation (argmax, first index on ties)
  gap_<kv>_i         [32] float32 llama.cpp's top-1 minus top-2 logit at each greedy step
and for the first N_LOGITS prompts:
  logits_<kv>_i      [T, V] float32  llama.cpp's logits at every prompt position
with <kv> = f16 (llama.cpp's default KV cache) and f32 (`type_k = type_v = GGML_TYPE_F32`). llama.cpp runs
with one thread, no flash attention, its default weight repacking; PROVENANCE.txt records the build and the
machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.dirname(os.path.dirname(HERE))
MODELS = {
    f"tiny-{a}": os.path.join(GOLDEN, f"tiny-{a}.gguf") for a in ("qwen3moe", "mixtral", "qwen2moe", "olmoe")
}
MODELS |= {
    f"hf-{a}": os.path.join(GOLDEN, "oracle", "transformers", f"hf-{a}.f32.gguf")
    for a in ("qwen3moe", "mixtral", "qwen2moe", "olmoe")
}
KV = {"f16": None, "f32": 0}  # None: llama.cpp's default (F16); 0 = GGML_TYPE_F32
N_LOGITS = 2  # prompts whose logits are stored (float32; ~3 MB in all)
N_CTX = 256


def worker(job: str) -> None:
    """In the llama-cpp-python interpreter: run every model, write raw arrays to job's `out` npz."""
    import llama_cpp
    from llama_cpp import Llama

    with open(job) as f:
        spec = json.load(f)
    out = {}
    for name, path in spec["models"].items():
        for kv, t in KV.items():
            m = Llama(
                model_path=path,
                n_ctx=N_CTX,
                logits_all=True,
                verbose=False,
                type_k=t,
                type_v=t,
                n_threads=1,
                n_threads_batch=1,
                flash_attn=False,
            )
            for i, text in enumerate(spec["prompts"]):
                ids = m.tokenize(text.encode("utf-8"), add_bos=True, special=True)
                out[f"{name}/ids_{i}"] = np.asarray(ids, np.int32)
                m.reset()
                m.eval(ids)
                if i < N_LOGITS:
                    out[f"{name}/logits_{kv}_{i}"] = np.array(m.scores[: len(ids)], np.float32)
                greedy, gaps = [], []
                for _ in range(spec["n_greedy"]):
                    row = np.array(m.scores[m.n_tokens - 1], np.float32)
                    tok = int(np.argmax(row))
                    s = np.sort(row)
                    greedy.append(tok)
                    gaps.append(s[-1] - s[-2])
                    m.eval([tok])
                out[f"{name}/greedy_{kv}_{i}"] = np.asarray(greedy, np.int32)
                out[f"{name}/gap_{kv}_{i}"] = np.asarray(gaps, np.float32)
            del m
    out["llama_cpp_python"] = np.array(llama_cpp.__version__)
    np.savez(spec["out"], **out)


def provenance(version: str) -> str:
    flags = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            words = set(f.read().split())
        flags = " ".join(x for x in ("avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni") if x in words)
    return (
        f"made by golden/oracle/llama_cpp/make_oracle.py with llama-cpp-python {version} (sdist, CPU build, "
        f"GGML_NATIVE=ON; vendored llama.cpp 0c1e57098bba43ac29e6e3b677cdceebdd22334f)\n"
        f"machine: {platform.machine()}, {platform.processor() or 'x86_64'} with {flags}\n"
        f"settings: n_ctx {N_CTX}, n_threads 1, n_batch 512 (each prompt in one batch), flash_attn off, "
        f"default weight repacking (CPU_REPACK), KV cache f16 (default) and f32\n"
        f"models: {', '.join(MODELS)}\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-python", required=True, help="VENV/bin/python of tools/build_llama_cpp.sh")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker)
        return
    sys.path.insert(0, os.path.dirname(GOLDEN))
    from strata import models
    from strata.tokenizer import Tokenizer

    with open(os.path.join(GOLDEN, "prompts.json")) as f:
        d = json.load(f)
    prompts, n_greedy = d["prompts"], int(d["n_greedy"])
    with tempfile.TemporaryDirectory() as tmp:
        job = os.path.join(tmp, "job.json")
        with open(job, "w") as f:
            json.dump(
                {
                    "models": MODELS,
                    "prompts": prompts,
                    "n_greedy": n_greedy,
                    "out": os.path.join(tmp, "out.npz"),
                },
                f,
            )
        subprocess.run([a.llama_python, os.path.abspath(__file__), "--worker", job], check=True)
        with np.load(os.path.join(tmp, "out.npz")) as z:
            raw = {k: z[k] for k in z.files}
    for name, path in MODELS.items():
        res = {k.split("/", 1)[1]: v for k, v in raw.items() if k.startswith(name + "/")}
        with models.load(path) as m:
            tok = Tokenizer.from_metadata(m.metadata)
            for i, text in enumerate(prompts):
                res[f"ours_ids_{i}"] = np.asarray(tok.encode(text), np.int32)
        np.savez_compressed(os.path.join(HERE, f"{name}.npz"), **res)
        same = all(np.array_equal(res[f"ids_{i}"], res[f"ours_ids_{i}"]) for i in range(len(prompts)))
        print(
            f"{name:14s} {os.path.getsize(os.path.join(HERE, name + '.npz')) / 1024:5.0f} KiB, "
            f"tokenization {'identical' if same else 'DIFFERS'}"
        )
    with open(os.path.join(HERE, "PROVENANCE.txt"), "w") as f:
        f.write(provenance(str(raw["llama_cpp_python"])))


if __name__ == "__main__":
    main()
