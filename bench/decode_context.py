"""Decode speed against the context: tokens a second of the captured decode graph after prompts of several lengths,
on the all-resident engine and with a quarter-size expert cache. A decode token attends to every key before it,
so this is where attention's cost per key shows (SPEC §8: a user's 30K-token prompt is followed by its answer).

python bench/decode_context.py --model X.gguf [--contexts 64,2048,8192,30000] [--tokens 32] [--rounds 3]
       [--cache-frac 0.25] [--device cuda|host]

Rounds interleave the engines and the contexts; each cell is the median over rounds of (tokens ÷ decode time),
the tokens teacher-forced at random (greedy loops repeat one routing, which the adaptive tier then caches whole).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def decode_rate(eng, n_ctx_used: int, tokens: int, rng, vocab: int) -> float:
    """Prefill `n_ctx_used` random tokens, then decode `tokens` more; their tokens a second."""
    eng.reset()
    eng.prefill(rng.integers(0, vocab, n_ctx_used).tolist())
    d0, s0 = eng.stats.decode_tokens, eng.stats.decode_s
    for _ in range(tokens):
        eng.decode([int(rng.integers(0, vocab))])
    return (eng.stats.decode_tokens - d0) / (eng.stats.decode_s - s0)


def engines(model, dev, n_ctx: int, cache_frac: float, log):
    """(name, engine) for the quarter cache and the all-resident engine, sharing one arena; the CPU share off."""
    import dataclasses

    from strata import policy
    from strata.accel.arena import Arena
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import budget_holding

    c = model.cfg
    arena = Arena(model, dev, log=log)
    cfg = dataclasses.replace(policy.from_process(), cpu_share=0.0)
    budget = budget_holding(model, n_ctx, int(cache_frac * c.n_layer * c.n_expert))
    return [("quarter", GpuEngine(model, dev, n_ctx=n_ctx, vram_budget=budget, config=cfg, log=log, arena=arena)),
            ("resident", GpuEngine(model, dev, n_ctx=n_ctx, config=cfg, log=log, arena=arena))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="64,2048,8192,30000")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-frac", type=float, default=0.25)
    ap.add_argument("--device", choices=("cuda", "host"), default="cuda", help="host: a smoke test on the CPU twin")
    a = ap.parse_args()
    from strata import models
    from strata.accel.device.base import get_device

    contexts = [int(x) for x in a.contexts.split(",")]
    m = models.load(a.model)
    c = m.cfg
    n_ctx = max(contexts) + a.tokens + 8
    if n_ctx > c.n_ctx_train:
        sys.exit(f"decode_context: a context of {max(contexts)} + {a.tokens} tokens exceeds the model's "
                 f"{c.n_ctx_train}")
    dev = get_device(a.device)
    log = lambda s: print(s, file=sys.stderr)
    engs = engines(m, dev, n_ctx, a.cache_frac, log)
    rng = np.random.default_rng(0)
    for _, eng in engs:                                     # warm-up: kernels compiled, the graph captured
        decode_rate(eng, 16, 4, rng, c.n_vocab)
    res = {(name, P): [] for name, _ in engs for P in contexts}
    for r in range(a.rounds):
        for P in (contexts if r % 2 == 0 else contexts[::-1]):
            for name, eng in (engs if r % 2 == 0 else engs[::-1]):
                res[name, P].append(decode_rate(eng, P, a.tokens, rng, c.n_vocab))
                log(f"round {r} context {P}: {name} {res[name, P][-1]:.1f} tok/s")
    print(f"model {a.model}: {c.n_layer} layers, {c.n_head} heads of {c.head_dim}; decode tok/s, medians of "
          f"{a.rounds} rounds of {a.tokens} tokens")
    print(f"{'context':>8}" + "".join(f"{name:>12}" for name, _ in engs))
    for P in contexts:
        print(f"{P:8d}" + "".join(f"{statistics.median(res[name, P]):12.1f}" for name, _ in engs))


if __name__ == "__main__":
    main()
