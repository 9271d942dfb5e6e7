"""`python -m strata.accel generate --device cpu --model X.gguf --prompt "…"`: the whole model on the CPU backend
(CpuEngine: q8-path Numba kernels and the expert pool), streaming text, then llama.cpp-style timing lines.

`run_cpu(args)` takes the namespace of strata.accel.__main__'s `generate` parser; `main()` runs that CLI with
`--device cpu` forced, for use without the top-level command.
"""

from __future__ import annotations

import sys
import time

from strata import models


def _note(msg: str) -> None:
    print(f"strata: {msg}", file=sys.stderr)


def run_cpu(a) -> int:
    from strata.accel.cpu.ops import CpuEngine
    from strata.accel.cpu.pool import ExpertPool
    from strata.accel.generate import model_path, sampling_from, timing_lines
    from strata.sampling import Sampler
    from strata.tokenizer import Tokenizer

    t_load = time.perf_counter()
    m = models.load(model_path(a))
    tok = Tokenizer.from_metadata(m.metadata)
    ids = tok.encode(a.prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    n_ctx = a.ctx or max(512, len(ids) + a.n + 8)
    if len(ids) + a.n > n_ctx:
        raise ValueError(f"the prompt ({len(ids)} tokens) plus -n {a.n} exceeds the context of {n_ctx} (--ctx)")
    pool = ExpertPool(getattr(a, "pool_workers", None))
    eng = CpuEngine(m, pool=pool, n_ctx=n_ctx)
    try:
        eng.forward(ids[:1])   # loads (or compiles) every kernel this model needs, outside the timings
        eng.reset()
        _note(f"load {time.perf_counter() - t_load:.1f} s: {m.cfg.arch}, {m.cfg.n_layer} layers, "
              f"{pool.workers} pool workers + host, pipeline {'on' if pool.pipeline else 'off'}")
        sampler = Sampler(sampling_from(a))
        out = sys.stdout
        out.write(a.prompt)
        out.flush()
        t0 = time.perf_counter()
        logits = eng.prefill(ids, chunk=getattr(a, "chunk", None), logits="last")[-1]
        t_prompt = time.perf_counter() - t0
        hist, gen, ttft = list(ids), [], None
        stream = tok.stream()
        t1 = time.perf_counter()
        for i in range(a.n):
            t = sampler(logits, hist)
            if ttft is None:
                ttft = time.perf_counter() - t0
            gen.append(t)
            hist.append(t)
            if tok.is_eog(t):
                break
            out.write(stream.feed(t))
            out.flush()
            if i + 1 < a.n:
                logits = eng.decode(t)
        out.write(stream.flush() + "\n")
        t_gen = time.perf_counter() - t1
        for line in timing_lines(len(ids), t_prompt, max(0, len(gen) - 1), t_gen, ttft or t_prompt):
            _note(line)
    finally:
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
