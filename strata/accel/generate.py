"""The generate loop on the GPU engine, with llama.cpp-style timing lines (`prefill N tokens in X ms -> Y tok/s`)."""

from __future__ import annotations

import contextlib
import functools
import sys
import time

from strata import models
from strata.sampling import Sampler, from_cli_args


def model_path(a) -> str:
    if a.model:
        return a.model
    from strata.data import default_model_path

    return default_model_path()


def timing_lines(prompt_n, prompt_s, gen_n, gen_s, ttft_s) -> list[str]:
    out = [f"prefill {prompt_n} tokens in {prompt_s * 1e3:.1f} ms -> {prompt_n / max(prompt_s, 1e-9):.1f} tok/s"]
    if gen_n:
        out.append(f"decode {gen_n} tokens in {gen_s * 1e3:.1f} ms -> {gen_n / max(gen_s, 1e-9):.1f} tok/s")
    out.append(f"time to first token {ttft_s * 1e3:.1f} ms")
    return out


def prepare(a):
    """The model, its tokenizer, the prompt's ids and the context for a `generate` run (shared by both devices)."""
    from strata.tokenizer import Tokenizer

    m = models.load(model_path(a))
    tok = Tokenizer.from_metadata(m.metadata)
    ids = tok.encode(a.prompt)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    n_ctx = a.ctx or max(512, len(ids) + a.n + 8)
    if len(ids) + a.n > n_ctx:
        raise ValueError(f"the prompt ({len(ids)} tokens) plus -n {a.n} exceeds the context of {n_ctx} (--ctx)")
    return m, tok, ids, n_ctx


def stream_generate(a, tok, ids, prefill, decode) -> list[int]:
    """Write the prompt, prefill, then sample and decode, streaming the text; then the timing lines.
    `prefill(ids)` and `decode(token)` return the next token's logits [V]."""
    sampler = Sampler(from_cli_args(a))
    out = sys.stdout
    out.write(a.prompt)
    out.flush()
    t0 = time.perf_counter()
    logits = prefill(ids)
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
            logits = decode(t)
    out.write(stream.flush() + "\n")
    t_gen = time.perf_counter() - t1
    for line in timing_lines(len(ids), t_prompt, max(0, len(gen) - 1), t_gen, ttft or t_prompt):
        note(line)
    return gen


def run_gpu(a, dev) -> int:
    from strata import policy, routing_trace
    from strata.accel.engine import GpuEngine
    from strata.accel.memplan import RESERVE_MIB

    m, tok, ids, n_ctx = prepare(a)
    order = None
    if a.expert_profile:
        head, counts = routing_trace.profile(a.expert_profile)
        if (head["n_layer"], head["n_expert"]) != (m.cfg.n_layer, m.cfg.n_expert):
            raise ValueError(f"--expert-profile is a trace of another model shape ({head['n_layer']} layers x "
                             f"{head['n_expert']} experts)")
        order = routing_trace.hottest_first(counts, m.cfg.n_layer, m.cfg.n_expert)
    pool, notice = None, contextlib.nullcontext
    try:
        from strata.accel.cpu import warm
        from strata.accel.cpu.compile_note import compile_notice
        from strata.accel.cpu.pool import ExpertPool, default_workers

        # a first run compiles the pool's kernels in processes of their own (warm.py); later runs spawn nothing
        warming = warm.start(warm.model_types(m), note, only=warm.GPU_PARTS)
        if warming is not None:
            warming.wait()

        workers = a.pool_workers if a.pool_workers is not None else max(1, default_workers() - 1)
        notice = functools.partial(compile_notice, note, "the host's kernels")
        with notice():
            pool = ExpertPool(workers)
    except ImportError:        # a build without the CPU backend: the GPU streams every miss
        pass
    t_load = time.perf_counter()
    with notice():
        eng = GpuEngine(m, dev, n_ctx=n_ctx, vram_budget=a.vram_budget, expert_cache=a.expert_cache,
                        reserve_mib=RESERVE_MIB if a.vram_reserve_mib is None else a.vram_reserve_mib,
                        chunk=a.chunk, profile_order=order,
                        config=policy.from_process(), log=note if a.stats else None, pool=pool, progress=note)
    if a.stats:
        note(f"load {time.perf_counter() - t_load:.1f} s on {dev.name}")
    writer = None
    if a.dump_routing:
        writer = routing_trace.RoutingWriter(a.dump_routing, m)
        eng.on_routing = writer.layer
        writer.bind(eng)
    def prefill(ids):
        with notice():         # a first run compiles the engine's host-side layout and table code (Numba) here
            return eng.prefill(ids)

    try:
        stream_generate(a, tok, ids, prefill, lambda t: eng.decode([t])[-1])
    finally:
        if writer:
            writer.close()
        if pool is not None:
            pool.close()
    if a.stats:
        s = eng.stats
        note(f"expert cache: {eng.cache.n_resident()} resident, decode hit rate {100 * s.hit_rate:.1f}% "
             f"({s.hits} of {s.lookups}); streamed {s.streamed_experts} experts, {s.streamed_bytes / 2**20:.1f} MiB")
        if eng.guess and eng.cpu_block is not None and eng.share.on:
            note("guessed walks: none while the prefill CPU share is on (it picks its experts after each routing "
                 "sync; STRATA_PREFILL_CPU_SHARE=0 turns it off)")
        elif eng.guess and eng.dev.kind == "cuda":
            note(f"guessed walks: {s.guessed} experts streamed before their layer's routing sync, "
                 f"{s.guessed_unrouted} of them unrouted, {s.guessed_missed} routed ones missed (streamed after "
                 f"it; STRATA_PROMPT_GUESS=0 turns them off)")
        lm = [n for n, w, _ in s.chunks if w == "layer-major"]
        if lm:
            note(f"layer-major: {len(lm)} prompt chunks ran layer by layer, each layer's experts streamed once a "
                 f"prompt (STRATA_PROMPT_LAYER_MAJOR=0 runs them chunk by chunk)")
        pg = eng.pgraphs
        if pg is not None:
            note(f"prompt graphs: {pg.eager} segments eager, {pg.captures} captured ({pg.capture_s * 1e3:.1f} ms), "
                 f"{pg.replays} replayed (a shape's first prompt runs eagerly, its second captures)")
        gg = eng.pre_graphs
        if gg is not None:
            note(f"pre-sync groups: {gg.eager} eager, {gg.captures} captured, {gg.replays} replayed as graphs "
                 f"(STRATA_PROMPT_GRAPH=0 launches them one by one)")
        if eng.cpu_block is not None:
            cb = eng.cpu_block.stats
            note(f"cpu pool: {cb['cpu_experts']} experts in {cb['shared_layers']} layers; share {eng.share.mode.value}")
    return 0


def note(msg: str) -> None:
    print(f"strata: {msg}", file=sys.stderr)
