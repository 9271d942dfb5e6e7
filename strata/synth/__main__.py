"""`python -m strata.synth --preset tiny-qwen3moe --out m.gguf [--seed N] [--routing-skew S] [--quant MIX]`"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import replace

from strata.cli_args import checked
from strata.synth.build import DEFAULT_SKEW, synthesise
from strata.synth.presets import GGML, PRESETS, ROLES


def parse_mix(text: str) -> dict:
    """`Q4_K` (every quantised role) or `exp_gate=IQ2_XS,exp_down=IQ4_NL,attn_q@0=Q8_0`."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        role, _, t = part.rpartition("=")
        t = t.upper()
        if t not in GGML or t == "TIED" and role != "output":
            raise SystemExit(f"synth: unknown quant type {t!r} in --quant (known: {', '.join(k for k in GGML)})")
        roles = [role] if role else [r for r in ROLES if r not in ("norm", "router", "shexp_gate")]
        for r in roles:
            if r.split("@")[0] not in ROLES:
                raise SystemExit(f"synth: unknown role {r!r} in --quant (roles: {', '.join(ROLES)})")
            out[r] = GGML[t]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.synth", description=__doc__)
    ap.add_argument("--preset", choices=sorted(PRESETS), help="model shape and quant mix")
    ap.add_argument("--out", help="output GGUF path")
    ap.add_argument("--seed", type=checked(int, "--seed", lambda v: v >= 0, ">= 0"), default=0)
    ap.add_argument("--routing-skew", type=checked(float, "--routing-skew", lambda v: v >= 0, ">= 0"),
                    default=DEFAULT_SKEW,
                    help=f"Zipf exponent of expert popularity (default {DEFAULT_SKEW}; 0 = uniform)")
    ap.add_argument("--quant", default="", help="override the preset's quant mix (see parse_mix)")
    ap.add_argument("--layers", type=checked(int, "--layers", lambda v: v >= 1, ">= 1"),
                    help="override the layer count (a cut-down model of the same shape)")
    ap.add_argument("--list", action="store_true", help="list the presets and exit")
    a = ap.parse_args(argv)
    if a.list or not a.preset:
        for k, s in PRESETS.items():
            print(f"{k:18s} {s.arch:9s} L={s.n_layer:3d} D={s.n_embd:5d} E={s.n_expert:4d} K={s.n_expert_used:2d} "
                  f"F={s.n_ff_exp:6d} V={s.n_vocab:6d} expert blob {s.expert_blob_bytes(0):,} B")
        return 0 if a.list else 2
    if not a.out:
        ap.error("--out is required")
    shape = PRESETS[a.preset]
    if a.quant:
        shape = replace(shape, types={**shape.types, **parse_mix(a.quant)})
    if a.layers is not None:
        shape = replace(shape, n_layer=a.layers)
    from strata.synth.vocab import tokenizer_meta_for

    t0 = time.monotonic()
    try:
        size = synthesise(shape, a.out, seed=a.seed, skew=a.routing_skew, name=a.preset,
                          tokenizer_meta=tokenizer_meta_for(shape), progress=shape.n_embd >= 1024)
    except OSError as e:                 # a directory that does not exist, a full disk: one line, not a traceback
        print(f"synth: error: {a.out}: {e.strerror or e}", file=sys.stderr)
        return 1
    dt = time.monotonic() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"synth: wrote {a.out}: {size:,} bytes in {dt:.1f} s ({size / max(dt, 1e-9) / 1e6:.0f} MB/s), "
          f"peak RSS {peak:.0f} MiB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
