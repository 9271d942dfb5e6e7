"""`python -m strata info FILE`: architecture, config, tensor types and sizes, expert blob size."""

from __future__ import annotations

import argparse
import collections
import sys

from strata.gguf_file import GGUFError


def info(path: str) -> int:
    from strata import models

    m = models.load(path)
    c = m.cfg
    print(f"file          {path}")
    print(f"architecture  {c.arch}  (routing: {c.routing.value}; q/k norm: {c.qk_norm.value}; "
          f"rope: {'neox' if c.rope_neox else 'normal'})")
    fields = [f for f in c.__dataclass_fields__ if f not in ("arch", "routing", "qk_norm", "rope_neox")]
    print("config        " + ", ".join(f"{f}={getattr(c, f)}" for f in fields))
    by_type = collections.defaultdict(lambda: [0, 0])
    for t in m.gguf.tensors.values():
        by_type[t.type_name][0] += 1
        by_type[t.type_name][1] += t.nbytes
    total = sum(v[1] for v in by_type.values())
    print(f"tensors       {len(m.gguf.tensors)} tensors, {total / 2**20:,.1f} MiB")
    for name, (n, b) in sorted(by_type.items(), key=lambda kv: -kv[1][1]):
        print(f"  {name:8s} {n:5d} tensors {b / 2**20:12,.2f} MiB")
    blobs = sorted({m.expert_blob_bytes(l) for l in range(c.n_layer)})
    n_exp = c.n_layer * c.n_expert
    print(f"experts       {n_exp:,} routed experts; blob bytes {', '.join(f'{b:,}' for b in blobs)} "
          f"({n_exp * blobs[-1] / 2**30:.2f} GiB at the largest)")
    for l in (0, c.n_layer - 1) if c.n_layer > 1 else (0,):
        s = m.expert(l, 0)
        from strata.gguf_file import type_name
        print(f"  layer {l}: gate {type_name(s.types[0])}, up {type_name(s.types[1])}, down {type_name(s.types[2])}")
    m.close()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="describe a GGUF MoE model")
    p.add_argument("file")
    a = ap.parse_args(argv)
    try:
        return info(a.file)
    except (GGUFError, ValueError) as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
