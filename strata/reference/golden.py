"""Golden files: fixed prompts through the reference on the bundled models, compared to the bit.

Layout (golden/):
  <model>.gguf                    the synthesised tiny models (strata-tiny is the package's strata/data file)
  prompts.json                    {"prompts": [text, ...], "n_greedy": 32}
  <model>.<path>.npz              per prompt i: ids_i [T] int32, logits_i [T, V] float32, greedy_i [32] int32
One command writes them (`python -m strata.reference golden --write`) and one compares (`--check`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from strata import models
from strata.reference.engine import RefEngine
from strata.reference.linalg import Path
from strata.tokenizer import Tokenizer

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "golden")
MODELS = ("tiny-qwen3moe", "tiny-mixtral", "tiny-qwen2moe", "tiny-olmoe")
GOLDEN_SKEW = 0.8      # the routing skew the golden tiny models were synthesised with (fixed: the files stay put)


def model_path(name: str, directory: str = GOLDEN_DIR) -> str:
    """The GGUF of a golden model: the synthesised ones live in golden/, strata-tiny is the package's own."""
    if name == "strata-tiny":
        from strata.data import default_model_path

        return default_model_path()
    return os.path.join(directory, name + ".gguf")


def golden_models(directory: str = GOLDEN_DIR) -> list[str]:
    names = MODELS + ("strata-tiny",)
    return [m for m in names if os.path.exists(os.path.join(directory, f"{m}.float.npz"))
            and os.path.exists(model_path(m, directory))]


def load_prompts(directory: str = GOLDEN_DIR) -> tuple[list[str], int]:
    with open(os.path.join(directory, "prompts.json"), encoding="utf-8") as f:
        d = json.load(f)
    return d["prompts"], int(d["n_greedy"])


def compute(model_path: str, path: Path, prompts: list[str], n_greedy: int) -> dict[str, np.ndarray]:
    """Run every prompt from an empty cache: its logits at every position, then n_greedy greedy tokens."""
    m = models.load(model_path)
    tok = Tokenizer.from_metadata(m.metadata)
    out = {}
    for i, text in enumerate(prompts):
        ids = tok.encode(text)
        eng = RefEngine(m, path, n_ctx=len(ids) + n_greedy + 1)
        logits = eng.prefill(ids)
        out[f"ids_{i}"] = np.asarray(ids, np.int32)
        out[f"logits_{i}"] = logits
        greedy, last = [], logits[-1]
        for _ in range(n_greedy):
            t = int(np.argmax(last))
            greedy.append(t)
            last = eng.decode(t)
        out[f"greedy_{i}"] = np.asarray(greedy, np.int32)
    m.close()
    return out


@dataclass
class Diff:
    key: str
    text: str


def compare(expected: dict, got: dict) -> list[Diff]:
    """Exact comparison; for logits: the worst position and token, the values, and how many bits differ."""
    diffs = []
    for key in sorted(set(expected) | set(got)):
        if key not in expected or key not in got:
            diffs.append(Diff(key, "present on one side only"))
            continue
        a, b = np.asarray(expected[key]), np.asarray(got[key])
        if a.shape != b.shape:
            diffs.append(Diff(key, f"shape {a.shape} expected, got {b.shape}"))
        elif a.dtype == np.float32 and not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
            d = np.abs(a.astype(np.float64) - b.astype(np.float64))
            pos, tok = np.unravel_index(int(np.argmax(d)), d.shape)
            bits = int(np.unpackbits((a.view(np.uint32) ^ b.view(np.uint32)).view(np.uint8)).sum())
            n_bad = int((a.view(np.uint32) != b.view(np.uint32)).sum())
            diffs.append(Diff(key, f"{n_bad} of {a.size} values differ ({bits} bits); worst at position {pos}, "
                                   f"token {tok}: expected {a[pos, tok]!r}, got {b[pos, tok]!r} "
                                   f"(|Δ| {d[pos, tok]:.3g}, max logit {np.abs(a).max():.3g})"))
        elif a.dtype != np.float32 and not np.array_equal(a, b):
            first = int(np.argmax(a.reshape(-1) != b.reshape(-1)))
            diffs.append(Diff(key, f"differs first at index {first}: expected {a.reshape(-1)[first]}, "
                                   f"got {b.reshape(-1)[first]} (expected {a.tolist()[:40]}, got {b.tolist()[:40]})"))
    return diffs


def golden_path(name: str, path: Path, directory: str = GOLDEN_DIR) -> str:
    return os.path.join(directory, f"{name}.{path.value}.npz")


def synth_models(directory: str = GOLDEN_DIR) -> list[str]:
    """(Re)write the synthesised golden models from their presets, seed 0 (deterministic: a test checks that
    this reproduces the committed files byte for byte)."""
    from strata.synth.build import synthesise
    from strata.synth.presets import PRESETS

    out = []
    for name in MODELS:
        p = os.path.join(directory, name + ".gguf")
        synthesise(PRESETS[name], p, seed=0, skew=GOLDEN_SKEW, name=name, isolate=False)
        out.append(p)
    return out


def write(directory: str = GOLDEN_DIR, names: list[str] | None = None) -> list[str]:
    prompts, n = load_prompts(directory)
    done = []
    for name in names or golden_models(directory):
        for path in Path:
            res = compute(model_path(name, directory), path, prompts, n)
            np.savez_compressed(golden_path(name, path, directory), **res)
            done.append(golden_path(name, path, directory))
    return done


def check(directory: str = GOLDEN_DIR, names: list[str] | None = None, log=print) -> bool:
    prompts, n = load_prompts(directory)
    ok = True
    for name in names or golden_models(directory):
        for path in Path:
            gp = golden_path(name, path, directory)
            if not os.path.exists(gp):
                log(f"golden: {name} {path.value}: MISSING {gp} (run `golden --write`)")
                ok = False
                continue
            with np.load(gp) as z:
                exp = dict(z)
            diffs = compare(exp, compute(model_path(name, directory), path, prompts, n))
            log(f"golden: {name} {path.value}: " + ("identical" if not diffs else f"{len(diffs)} arrays DIFFER"))
            for d in diffs:
                log(f"    {d.key}: {d.text}")
            ok &= not diffs
    return ok
