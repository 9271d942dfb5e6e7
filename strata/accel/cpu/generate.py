"""`python -m strata.accel generate --device cpu --model X.gguf --prompt "…"`: the whole model on the CPU backend
(CpuEngine: q8-path Numba kernels and the expert pool), streaming text, then llama.cpp-style timing lines.

`run_cpu(args)` takes the namespace of strata.accel.__main__'s `generate` parser; `main()` runs that CLI with
`--device cpu` forced, for use without the top-level command.
"""

from __future__ import annotations

import contextlib
import sys
import time



def _note(msg: str) -> None:
    print(f"strata: {msg}", file=sys.stderr)


def layer_progress(n_layer: int, note, every_s: float = 1.0, clock=time.perf_counter):
    """CpuEngine.on_layer for a prompt: a line after a layer once `every_s` has passed since the prompt began and
    since the last line (a long prompt on the CPU runs minutes, one layer at a time over all its tokens; a short
    one prints nothing)."""
    t0 = clock()
    last = [t0]

    def on_layer(layer: int, tokens: int) -> None:
        now = clock()
        if now - last[0] >= every_s:
            last[0] = now
            note(f"prefill: layer {layer + 1} of {n_layer}, {tokens:,} tokens, {now - t0:.1f} s")
    return on_layer


GPU_ONLY = ("vram_budget", "vram_reserve_mib", "expert_cache", "expert_profile")  # the VRAM plan, the expert cache


def gpu_only_flags(a) -> list[str]:
    """The GPU engine's flags a CPU run was given: the whole model runs from RAM, so they change nothing."""
    return ["--" + f.replace("_", "-") for f in GPU_ONLY if getattr(a, f, None) is not None]


def run_cpu(a) -> int:
    from strata import routing_trace
    from strata.accel.cpu import warm
    from strata.accel.cpu.compile_note import compile_notice
    from strata.accel.cpu.ops import CpuEngine
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.generate import prepare, stream_generate

    t_load = time.perf_counter()
    m, tok, ids, n_ctx = prepare(a)
    ignored = gpu_only_flags(a)
    if ignored:
        _note(f"{', '.join(ignored)}: the GPU engine's (VRAM and its expert cache); the CPU backend runs the whole "
              f"model from RAM, so they change nothing here (--device host runs the GPU engine on its CPU twin)")
    warming = warm.start(warm.model_types(m), _note, only=warm.CPU_PARTS)   # a first run: in parallel processes
    if warming is not None:
        warming.wait()
    compiling = contextlib.ExitStack()          # one line while the pool and the warm-up compile (a first run)
    compiling.enter_context(compile_notice(_note))
    pool = ExpertPool(getattr(a, "pool_workers", None))
    eng = CpuEngine(m, pool=pool, n_ctx=n_ctx)
    writer = None
    try:
        try:
            eng.forward(ids[:1])   # loads (or compiles) every kernel this model needs, outside the timings
        finally:
            compiling.close()
        eng.reset()
        _note(f"load {time.perf_counter() - t_load:.1f} s: {m.cfg.arch}, {m.cfg.n_layer} layers, "
              f"{pool.workers} pool workers + host, pipeline {'on' if pool.pipeline else 'off'}")
        if getattr(a, "dump_routing", None):       # after the warm-up token, which is no part of the run
            writer = routing_trace.RoutingWriter(a.dump_routing, m)
            writer.bind(eng)
            eng.on_routing = writer.layer

        def prefill(ids):
            eng.on_layer = layer_progress(m.cfg.n_layer, _note)
            try:
                return eng.prefill(ids, chunk=getattr(a, "chunk", None), logits="last")[-1]
            finally:
                eng.on_layer = None

        stream_generate(a, tok, ids, prefill, eng.decode)
    finally:
        if writer:
            writer.close()
        eng.close()
        m.close()
    return 0


def main(argv=None) -> int:
    from strata.accel.__main__ import main as accel_main

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["generate"]:
        args = args[1:]
    return accel_main(["generate", *args, "--device", "cpu"])


if __name__ == "__main__":
    sys.exit(main())
