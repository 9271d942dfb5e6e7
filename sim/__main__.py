"""``python -m sim whatif | sweep | catalogue | calibrate`` (run ``python -m sim CMD -h`` for the options)."""

from __future__ import annotations

import argparse
import sys
import time

from strata.cli_args import checked

from .hardware import catalogue, compose, machine
from .models import model

def share_arg(flag: str):
    """A share setting: off | auto | default | a fixed share in [0, 1] (whatif's settings)."""

    def parse(text: str) -> str:
        if text in ("off", "auto", "default"):
            return text
        try:
            ok = 0.0 <= float(text) <= 1.0
        except ValueError:
            ok = False
        if not ok:
            raise argparse.ArgumentTypeError(f"{flag} takes off, auto, default or a share in [0, 1], not {text!r}")
        return text
    return parse


def listed(each, flag: str):
    """A comma list whose items `each` checks (an argparse type that raises ArgumentTypeError), for sweep's axes."""

    def parse(text: str) -> str:
        items = [x for x in text.split(",") if x]
        if not items:
            raise argparse.ArgumentTypeError(f"{flag} takes a comma list, got {text!r}")
        for x in items:
            each(x)
        return text
    return parse


POS_INT = lambda flag: checked(int, flag, lambda v: v >= 1, ">= 1")  # noqa: E731
NONNEG = lambda kind, flag: checked(kind, flag, lambda v: v >= 0, ">= 0")  # noqa: E731


def _machine(a):
    if a.machine:
        return machine(a.machine)
    if not (a.gpu and a.cpu):
        sys.exit("whatif: give --machine NAME, or --gpu and --cpu (python -m sim catalogue lists them)")
    return compose(a.gpu, a.cpu, a.link, a.ram, a.host_issue_us, a.workers)


def cmd_whatif(a) -> None:
    from .whatif import PLOT_LENGTHS, whatif

    m = _machine(a)
    if a.prompt > a.ctx:
        sys.exit(f"whatif: a prompt of {a.prompt:,} tokens does not fit the context of {a.ctx:,} (raise --ctx)")
    if a.share:
        settings = ("off", a.share) if a.share != "off" else ("off",)
    else:  # "default" (unset) differs from "auto" only where the share is on by default (CUDA)
        settings = ("off", "0.5", "auto", "default") if m.gpu.api == "cuda" else ("off", "0.5", "auto")
    t0 = time.perf_counter()
    w = whatif(
        m,
        model(a.model),
        a.prompt,
        settings,
        ctx=a.ctx,
        cache_slots=a.cache_slots,
        lengths=PLOT_LENGTHS if a.plot else (),
    )
    print(w.report())
    if a.gate_lines:
        for name, r in w.results.items():
            for line in r.gate_lines():
                print(f"[{name}] {line}")
    if a.plot:
        w.plot(a.plot)
        print(f"plot     {a.plot}")
    print(f"(simulated in {time.perf_counter() - t0:.1f} s)")


def cmd_sweep(a) -> None:
    from .sweep import grid, sweep, table

    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    points = grid(split(a.machines), split(a.models), split(a.prompts), split(a.shares), a.layers)
    t0 = time.perf_counter()
    rows = sweep(points, a.scheduler, a.workers)
    text = table(rows)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
        print(f"{len(rows)} points in {time.perf_counter() - t0:.1f} s -> {a.out}")
    else:
        print(text, end="")


def cmd_catalogue(a) -> None:
    cat = catalogue()
    for name, m in sorted(cat["machines"].items()):
        print(
            f"{name:20} {m.gpu.name:22} {m.gpu.vram_gib:5g} GiB  {m.cpu.name:16} {m.cpu.cores:3d}c "
            f"{m.cpu.isa:6} "
            f"PCIe{m.link.pcie_gen} {m.link.h2d_gbps:5.1f} GB/s  host {m.host_issue_us:g} us"
        )
    print("gpus:", ", ".join(sorted(cat["gpus"])))
    print("cpus:", ", ".join(sorted(cat["cpus"])))
    print("links:", ", ".join(sorted(cat["links"])))


def cmd_calibrate(a) -> None:
    from .calibrate import calibrate

    calibrate(write=a.write, stages=tuple(int(s) for s in a.stages.split(",")))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m sim", description="Strata's hardware simulator")
    sub = p.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("whatif", help="predict prompt/decode speed per CPU-share setting on a machine")
    w.add_argument("--machine", help="a catalogue machine (python -m sim catalogue)")
    w.add_argument("--gpu"), w.add_argument("--cpu"), w.add_argument(
        "--link", help="default: the GPU's usual"
    )
    w.add_argument("--ram", type=checked(float, "--ram", lambda v: v > 0, "> 0"), default=64.0, help="GiB")
    w.add_argument(
        "--host-issue-us",
        type=NONNEG(float, "--host-issue-us"),
        help="host time per streamed expert (default: the API's)",
    )
    w.add_argument("--workers", type=NONNEG(int, "--workers"), help="CPU pool workers (default: cores)")
    w.add_argument("--model", required=True, help="preset:MIX (qwen3-30b-a3b:Q4_K_M, flash-next:IQ2_XS/Q2_0)")
    w.add_argument("--prompt", type=POS_INT("--prompt"), default=600)
    w.add_argument(
        "--share",
        type=share_arg("--share"),
        help="off | auto | default | a number; default: compare off, 0.5, auto, default",
    )
    w.add_argument("--ctx", type=POS_INT("--ctx"), default=8192)
    w.add_argument(
        "--cache-slots", type=NONNEG(int, "--cache-slots"), help="--expert-cache N (default: sized from free VRAM)"
    )
    w.add_argument("--plot", help="write prompt time against prompt length (PNG)")
    w.add_argument("--gate-lines", action="store_true", help="print auto's STRATA_DBG_CPU_GATE lines")
    w.set_defaults(fn=cmd_whatif)
    s = sub.add_parser("sweep", help="a grid of machines x models x prompts x shares on Dask")
    s.add_argument("--machines", default="rtx3060-5600x,rtx4090-7950x,rtx5090-9950x3d")
    s.add_argument("--models", default="qwen3-30b-a3b:Q4_K_M")
    s.add_argument("--prompts", type=listed(POS_INT("--prompts"), "--prompts"), default="256,600,1000,2048")
    s.add_argument("--shares", type=listed(share_arg("--shares"), "--shares"), default="off,auto")
    s.add_argument("--layers", type=POS_INT("--layers"), help="reduced simulation: the first N layers, scaled")
    s.add_argument("--scheduler", help="a running Dask scheduler (default: a local cluster)")
    s.add_argument("--workers", type=POS_INT("--workers"), default=2)
    s.add_argument("--out", help="CSV file (default: stdout)")
    s.set_defaults(fn=cmd_sweep)
    c = sub.add_parser("catalogue", help="list the hardware catalogue")
    c.set_defaults(fn=cmd_catalogue)
    k = sub.add_parser("calibrate", help="fit the calibrated constants to the seeds")
    k.add_argument("--write", action="store_true", help="rewrite sim/data/calibration.json")
    k.add_argument(
        "--stages", default="1,2,3", help="which stages to fit (1 RTX 5090, 2 RX 7900 GRE, 3 RX 6800)"
    )
    k.set_defaults(fn=cmd_calibrate)
    a = p.parse_args(argv)
    try:
        a.fn(a)
    except (KeyError, ValueError) as e:  # an unknown catalogue name or model, a value the model refuses
        sys.exit(f"sim {a.cmd}: error: {e.args[0] if isinstance(e, KeyError) and e.args else e}")


if __name__ == "__main__":
    main()
