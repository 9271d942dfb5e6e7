"""python -m strata.accel generate [--model X.gguf] [--prompt "…"] [-n 64] [--device auto|cuda|cpu] [--stats] …

Without --model it runs the bundled default model (strata-tiny). `--device auto` uses CUDA when CuPy sees a GPU
and falls back to the CPU backend with a one-line note.
"""

from __future__ import annotations

import argparse
import re
import sys

from strata.gguf_file import GGUFError
from strata.cli_args import checked, closed_stdout, text, utf8_output
from strata.sampling import add_cli_args


def parse_bytes(text: str) -> int:
    """`24G`, `8192M`, `12.5GiB`, or a plain number of bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text or "")
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 24G or 8192M)")
    mult = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[m.group(2).lower()]
    return int(float(m.group(1)) * mult)


def cache_arg(text: str):
    if text == "auto":
        return None
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--expert-cache takes a slot count or 'auto', not {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError("--expert-cache must be >= 0")
    return n


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m strata.accel", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("generate", help="generate text")
    g.add_argument("--model", help="a GGUF MoE model (default: the bundled strata-tiny)")
    g.add_argument("--prompt", type=text("--prompt"), default="def fibonacci(n):")
    g.add_argument("-n", type=checked(int, "-n", lambda v: v >= 0, ">= 0"), default=64, help="tokens to generate")
    g.add_argument("--device", choices=("auto", "cuda", "cpu", "host"), default="auto",
                   help="host = the GPU engine on the CPU twin (for debugging)")
    g.add_argument("--vram-budget", type=parse_bytes, help="cap the VRAM the engine uses (emulates a smaller card)")
    g.add_argument("--vram-reserve-mib", type=checked(int, "--vram-reserve-mib", lambda v: v >= 0, ">= 0"),
                   help="VRAM left to others (the CUDA context, the display) (default: memplan.RESERVE_MIB, 700)")
    g.add_argument("--expert-cache", type=cache_arg, default=None, help="expert cache slots, or auto (default)")
    g.add_argument("--expert-profile", action="append", metavar="TRACE",
                   help="routing trace(s) from --dump-routing: fill the cache hottest first")
    g.add_argument("--dump-routing", metavar="FILE", help="write this run's routing trace (JSONL)")
    g.add_argument("--ctx", type=checked(int, "--ctx", lambda v: v >= 1, ">= 1"),
                   help="context length (default: prompt + n, at least 512)")
    g.add_argument("--chunk", type=checked(int, "--chunk", lambda v: v >= 1, ">= 1"),
                   help="prompt chunk tokens (default: planned)")
    g.add_argument("--pool-workers", type=checked(int, "--pool-workers", lambda v: v >= 0, ">= 0"),
                   help="CPU expert-pool workers (default: the machine's cores - 1)")
    g.add_argument("--stats", action="store_true", help="timing lines, expert-cache hit rate, streamed bytes")
    add_cli_args(g)
    return ap


def note(msg: str) -> None:
    print(f"strata: {msg}", file=sys.stderr)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    utf8_output()
    try:
        from strata import policy

        config = policy.from_process()         # a bad STRATA_* value fails here, before any work
        if a.device == "cpu":
            return run_cpu(a)
        from strata.accel.device.base import get_device

        dev = get_device(a.device, log=note, budget_bytes=a.vram_budget, gemm=config.gemm)
        if dev is None:
            return run_cpu(a)
        from strata.accel.generate import run_gpu

        return run_gpu(a, dev)
    except (GGUFError, ValueError, FileNotFoundError, RuntimeError) as e:
        print(f"strata: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return closed_stdout()
    except KeyboardInterrupt:           # ^C: the engine's cleanup (its pool, a trace file) has run on the way out
        return interrupted()
    except SystemError as e:            # ^C inside a Numba call: a SystemError caused by the KeyboardInterrupt
        if not _from_interrupt(e):
            raise
        return interrupted()


def interrupted() -> int:
    print("\nstrata: interrupted", file=sys.stderr)
    return 130


def _from_interrupt(e: BaseException) -> bool:
    """Whether a KeyboardInterrupt is in e's chain of causes (Numba re-raises one that lands in its own Python
    callbacks, e.g. unpickling a cached kernel's constants, as a SystemError from it)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def run_cpu(a) -> int:
    from strata.accel.cpu.generate import run_cpu as run

    return run(a)


if __name__ == "__main__":
    sys.exit(main())
