"""python -m strata.reference  logits | generate | golden

  logits   --model X.gguf --ids 1,2,3 [--path float|q8] --out x.npy      float32 logits [tokens, vocab]
  generate --model X.gguf --prompt "…" -n 16 [--greedy] [--seed N] [sampling flags] [--dump-routing F.jsonl]
  golden   --check | --write [--model NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from strata.gguf_file import GGUFError
from strata.reference.linalg import Path
from strata.cli_args import checked, closed_stdout, text, utf8_output
from strata.sampling import add_cli_args, from_cli_args


def cmd_logits(a) -> int:
    from strata import models
    from strata.reference.engine import RefEngine

    ids = [int(x) for x in a.ids.split(",") if x.strip()]
    m = models.load(a.model)
    eng = RefEngine(m, Path(a.path), n_ctx=len(ids))
    logits = eng.prefill(ids)
    np.save(a.out, logits)
    print(f"logits {logits.shape} float32 -> {a.out}")
    return 0


def cmd_generate(a) -> int:
    from strata import models
    from strata.reference.engine import RefEngine
    from strata.routing_trace import RoutingWriter
    from strata.tokenizer import Tokenizer

    m = models.load(a.model or default_model())
    tok = Tokenizer.from_metadata(m.metadata)
    ids = tok.encode(a.prompt)
    writer = RoutingWriter(a.dump_routing, m) if a.dump_routing else None
    eng = RefEngine(m, Path(a.path), n_ctx=a.ctx or len(ids) + a.n + 1,
                    on_routing=writer.layer if writer else None)
    if writer:
        writer.bind(eng)
    t0 = time.perf_counter()
    out = eng.generate(ids, a.n, from_cli_args(a), stop=tok.is_eog)
    dt = time.perf_counter() - t0
    print(a.prompt + tok.decode(out))
    print(f"reference: {len(ids)} prompt + {len(out)} generated tokens in {dt * 1e3:.0f} ms", file=sys.stderr)
    if writer:
        writer.close()
        print(f"routing written to {a.dump_routing}", file=sys.stderr)
    return 0


def default_model() -> str:
    from strata.data import default_model_path

    return default_model_path()


def cmd_golden(a) -> int:
    from strata.reference import golden

    names = a.model or None
    if a.synth:
        for p in golden.synth_models():
            print(f"golden: synthesised {p}")
    if a.write:
        for p in golden.write(names=names):
            print(f"golden: wrote {p}")
        return 0
    return 0 if golden.check(names=names) else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m strata.reference", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("logits")
    p.add_argument("--model", required=True)
    p.add_argument("--ids", required=True)
    p.add_argument("--path", choices=[x.value for x in Path], default="float")
    p.add_argument("--out", required=True)
    p = sub.add_parser("generate")
    p.add_argument("--model")
    p.add_argument("--prompt", type=text("--prompt"), required=True)
    p.add_argument("-n", type=checked(int, "-n", lambda v: v >= 0, ">= 0"), default=16)
    p.add_argument("--ctx", type=checked(int, "--ctx", lambda v: v >= 1, ">= 1"))
    p.add_argument("--path", choices=[x.value for x in Path], default="float")
    p.add_argument("--dump-routing", metavar="FILE", help="write routed expert ids per chunk and layer (JSONL)")
    add_cli_args(p)
    p = sub.add_parser("golden")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true")
    g.add_argument("--write", action="store_true")
    p.add_argument("--model", action="append", help="only this golden model (repeatable)")
    p.add_argument("--synth", action="store_true", help="first re-synthesise the tiny golden models (seed 0)")
    a = ap.parse_args(argv)
    utf8_output()
    try:
        return {"logits": cmd_logits, "generate": cmd_generate, "golden": cmd_golden}[a.cmd](a)
    except (GGUFError, ValueError) as e:
        print(f"strata.reference: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return closed_stdout()


if __name__ == "__main__":
    sys.exit(main())
