"""Print the measured differences quoted in golden/oracle/README.md (both oracles, from the stored data).

    python golden/oracle/llama_cpp/report.py        # from the repository root, about 40 s

Relative difference of a position: max |Δ| over its logits / max |logit| over the prompt (ours).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(GOLDEN))

from strata import models  # noqa: E402
from strata.reference.engine import RefEngine  # noqa: E402

ARCHS = ("qwen3moe", "qwen2moe", "mixtral", "olmoe")


def path_of(name: str) -> str:
    if name.startswith("hf-"):
        return os.path.join(GOLDEN, "oracle", "transformers", f"{name}.f32.gguf")
    return os.path.join(GOLDEN, f"{name}.gguf")


def rel(theirs, ours):
    return np.abs(theirs.astype(np.float64) - ours).max(axis=1) / np.abs(ours).max()


def run(m, path, ids):
    return RefEngine(m, path, n_ctx=len(ids)).prefill(list(ids))


def transformers_table() -> None:
    print("transformers oracle (float32 torch) vs strata, F32 GGUF from llama.cpp's converter")
    print(f"{'arch':9s} {'float max':>10s} {'q8 max':>10s}  positions")
    for a in ARCHS:
        m = models.load(path_of(f"hf-{a}"))
        with np.load(os.path.join(GOLDEN, "oracle", "transformers", f"hf-{a}.npz")) as z:
            d = {k: z[k] for k in z.files}
        n = len([k for k in d if k.startswith("logits_")])
        worst = {
            p: max(rel(d[f"logits_{i}"], run(m, p, d[f"ids_{i}"].tolist())).max() for i in range(n))
            for p in ("float", "q8")
        }
        T = sum(d[f"ids_{i}"].size for i in range(n))
        print(f"{a:9s} {worst['float']:10.2e} {worst['q8']:10.2e}  {T} ({n} prompts)")


def llama_table(prompts: list[str]) -> None:
    print("\nllama.cpp oracle vs strata: max / median relative difference, share of positions <= 1e-6")
    print(
        f"{'model':14s} {'path':5s} {'KV f32: max':>12s} {'median':>9s} {'<=1e-6':>7s}"
        f" {'KV f16: max':>12s} {'median':>9s}"
    )
    greedy_lines = []
    for name in [f"tiny-{a}" for a in ARCHS] + [f"hf-{a}" for a in ARCHS]:
        m = models.load(path_of(name))
        with np.load(os.path.join(HERE, f"{name}.npz")) as z:
            d = {k: z[k] for k in z.files}
        n = len([k for k in d if k.startswith("logits_f32_")])
        for path in ("q8", "float"):
            cols = []
            for kv in ("f32", "f16"):
                r = np.concatenate(
                    [rel(d[f"logits_{kv}_{i}"], run(m, path, d[f"ids_{i}"].tolist())) for i in range(n)]
                )
                cols.append((r.max(), np.median(r), np.mean(r <= 1e-6)))
            print(
                f"{name:14s} {path:5s} {cols[0][0]:12.2e} {cols[0][1]:9.2e} {cols[0][2]:7.0%}"
                f" {cols[1][0]:12.2e} {cols[1][1]:9.2e}"
            )
            for kv in ("f32", "f16"):
                same, notes = 0, []
                for i in range(len(prompts)):
                    ids, g = d[f"ids_{i}"].tolist(), d[f"greedy_{kv}_{i}"].tolist()
                    lg = run(m, path, ids + g[:-1])[len(ids) - 1 :]
                    pick = lg.argmax(axis=1)
                    bad = np.flatnonzero(pick != np.asarray(g))
                    if bad.size == 0:
                        same += 1
                        continue
                    s = int(bad[0])
                    row = lg[s].astype(np.float64)
                    notes.append(
                        f"p{i} step {s}: ours {pick[s]} / llama {g[s]}, our gap "
                        f"{(row[pick[s]] - row[g[s]]) / np.abs(row).max():.1e}, llama's "
                        f"{d[f'gap_{kv}_{i}'][s] / np.abs(row).max():.1e}"
                    )
                greedy_lines.append(
                    f"{name:14s} {path:5s} KV {kv}: {same}/{len(prompts)} identical"
                    + (" — " + "; ".join(notes) if notes else "")
                )
        tok = all(np.array_equal(d[f"ids_{i}"], d[f"ours_ids_{i}"]) for i in range(len(prompts)))
        greedy_lines.append(f"{name:14s} tokenization identical on {len(prompts)} prompts: {tok}")
    print("\ngreedy (32 tokens, teacher-forced; gaps relative to max |logit| of the row)")
    print("\n".join(greedy_lines))


def main() -> None:
    with open(os.path.join(GOLDEN, "prompts.json")) as f:
        prompts = json.load(f)["prompts"]
    transformers_table()
    llama_table(prompts)


if __name__ == "__main__":
    main()
