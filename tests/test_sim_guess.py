"""The simulated engine's guessed walks (policy.guess, MoeBlock._guess): a routed-only prompt chunk without the CPU
share issues each layer's likely experts into the ring before its routing sync, layer 0's right after the
embedding, layer l+1's once layer l's last group is enqueued; at the sync the walk takes the routed experts it
missed, and its unrouted guesses are released as the groups pass them. The memory outlives the prompt (Session).

Scenario: 256-token chunks (routed-only: under stream_all_min with the share off), nothing resident, the routed-only
walk's 64 ring slots in groups of 16. Fixed costs (µs): attention 100, routing sync 5, the row layout 50 after it,
a launch group 20 and a copy run 10 (+5 for its event) of host time, a run of n blobs 40 n on the link, a group of
n experts 10 + 5 n on the GPU, combine 10. Token i routes to experts (lo + i, lo + i + 1) mod a span.
"""

import os
import sys

import numpy as np
import pytest

from sim.engine import Run, Session, prefill
from sim.hardware import machine
from sim.models import SimModel
from sim.workload import TraceRouting
from strata.policy import Config, share_policy
from strata.synth.presets import ModelShape

T, E, RING, GROUP = 256, 64, 64, 16
DENSE, SYNC = 100.0, 5.0


# fmt: off
class FixedCosts:
    by_issue = True   # the host timed by what it issues (sim/costs.py Costs.by_issue): the engine's guessing path
    def blob(self, l): return 1000
    def dense_us(self, t, ctx): return DENSE
    def combine_us(self, t): return 10.0
    def grouped_us(self, l, counts): return 10.0 + 5.0 * len(counts)
    def host_issue_us(self, busy): return 30.0
    def copy_us(self, nbytes, busy): return 40.0
    def sync_us(self): return SYNC
    def group_us(self, t): return 50.0
    def head_us(self): return 0.0
    def host_group_us(self, busy): return 20.0
    def host_copy_us(self, busy, event): return 10.0 + (5.0 if event else 0.0)
    def copy_run_us(self, nbytes, count, busy): return 40.0 * count
    def input_d2h_us(self, t): return 15.0
    def rows_h2d_us(self, rows): return 5.0
    def pin_us(self, nbytes): return 0.0
    def cpu_pool_us(self, l, counts): return 50.0 * len(counts)
# fmt: on


class Routing(TraceRouting):   # a trace over all E experts, whichever ids it holds
    def counts(self, layer, start, t):
        return np.bincount(self.ids[layer, start:start + t].ravel(), minlength=E)


def routing(layers: int, span: int, lo: int = 0) -> Routing:
    """Every layer: token i routes to lo + (i, i + 1) mod span (each of those experts takes 2T / span tokens)."""
    i = np.arange(T)
    one = lo + np.stack([i % span, (i + 1) % span], axis=1)
    return Routing(np.stack([one] * layers))


def prompts(routings, guess: bool = True, cfg: Config = Config(cpu_share=0.0), session=None):
    """One T-token prompt a routing, back to back on one session (the engine's memory kept between them)."""
    layers = routings[0].ids.shape[0]
    model = SimModel("tiny", ModelShape("qwen3moe", layers, 64, 2, 1, 32, E, 2, 32, 100))
    out = []
    for r in routings:
        run = Run(machine("h200-host16"), model, T, cfg, cache_slots=200_000, routing=r, costs=FixedCosts(),
                  residency=((False,) * E,) * layers, plan=(T, RING, GROUP), guess=guess, timeline=True)
        session = session or Session(share_policy(run.share, run.gated))
        out.append(prefill(run, session))
    return out


def copies(result, layer: int) -> list[tuple[str, float]]:
    return [(n, t) for n, t in result.events if n.startswith(f"h2d:L{layer} ")]


def experts(run_name: str) -> range:
    """The experts of a copy run's name, "h2d:L1 e0-e31" or "h2d:L1 e5"."""
    lo, _, hi = run_name.split(" ")[1].partition("-")
    return range(int(lo[1:]), int((hi or lo)[1:]) + 1)


def computed(result, layer: int) -> list[int]:
    """The experts of layer `layer` the GPU's launch groups computed, in order."""
    out = []
    for n, _ in result.events:
        if n.startswith(f"gpu:L{layer} e"):
            out += [int(x[1:]) for x in n.split(" ", 1)[1].split(",")]
    return out


def test_layer_0s_copies_go_before_its_routing_sync():
    """Layer 0 routes every expert of a 32 span: after a first prompt the memory guesses all 32, whose copies go
    right after the embedding (a run issued at 15 µs), before the routing reaches the host (DENSE + SYNC); without
    the guess they go after it."""
    r = routing(1, 32)
    on, off = prompts([r, r])[1], prompts([r, r], guess=False)[1]
    assert on.guessed == 32 and on.guessed_unrouted == 0
    assert min(t for _, t in copies(on, 0)) < DENSE + SYNC
    assert (off.guessed, min(t for _, t in copies(off, 0))) == (0, DENSE + SYNC + 15.0)
    assert sorted(computed(on, 0)) == sorted(computed(off, 0)) == list(range(32))
    # the first prompt had nothing to guess from: it ran as without the guess
    assert prompts([r])[0].prompt_ms == prompts([r], guess=False)[0].prompt_ms


def test_guesses_make_a_link_bound_prompt_faster():
    """4 layers, 32 experts each streamed (1,280 µs of link a layer against ~200 of compute): without the guess the
    link idles from a layer's last copy until the next layer's sync; with it, layer l+1's copies queue behind layer
    l's."""
    r = routing(4, 32)
    on, off = prompts([r, r])[1], prompts([r, r], guess=False)[1]
    assert on.guessed == 4 * 32 and on.n_streamed == off.n_streamed == 4 * 32
    assert on.prompt_ms < off.prompt_ms - 3 * DENSE / 1e3
    # the link never idles from the first copy: each layer's walk starts at the slot after the last one's
    # (Ring.cursor), so no guess waits for the slots of the layer still computing
    runs = sorted((t, n) for n, t in on.events if n.startswith("h2d:"))
    assert len(runs) == 4
    assert all(t1 == t0 + 40.0 * len(experts(n0)) for (t0, n0), (t1, _) in zip(runs, runs[1:]))


def test_unrouted_guesses_are_streamed_and_released_and_the_missed_ones_computed():
    """The first prompt routes e0-e47, the second e16-e63: the memory guesses e0-e47 in each layer (one run from
    15 µs), the sync (120) finds e0-e15 unrouted, released as the first group passes them, and e48-e63 missed,
    appended to the walk (the ring's last 16 slots: its copies queue behind the guess's on the link, 1,935). Layer
    1's guess (after layer 0's last group) starts at slot 0 again, after layer 0's groups read those slots (2,115)
    and the link is free (2,575): without the release of e0-e15 it would wait for ever."""
    r = prompts([routing(2, 48), routing(2, 48, lo=16)])[1]
    assert (r.guessed, r.guessed_unrouted) == (2 * 48, 2 * 16)
    assert r.n_streamed == 2 * 64     # every copy, the unrouted guesses' too
    for layer in range(2):
        assert sorted(computed(r, layer)) == list(range(16, 64))       # each routed expert once, no unrouted guess
    g = lambda l, lo: f"gpu:L{l} " + ",".join(f"e{e}" for e in range(lo, lo + 16))   # noqa: E731
    assert r.events == [
        ("gpu:L0 attn", 15.0),
        ("h2d:L0 e0-e47", 15.0),
        (g(0, 16), 1935.0),
        (g(0, 32), 2025.0),
        ("h2d:L0 e48-e63", 1935.0),
        (g(0, 48), 2575.0),
        ("gpu:L0 combine", 2665.0),
        ("gpu:L1 attn", 2675.0),
        ("h2d:L1 e0-e47", 2575.0),
        (g(1, 16), 4495.0),
        (g(1, 32), 4585.0),
        ("h2d:L1 e48-e63", 4495.0),
        (g(1, 48), 5135.0),
        ("gpu:L1 combine", 5225.0),
        ("gpu:head", 5235.0),
    ]


def test_a_guess_waits_for_the_slots_the_layer_before_still_reads():
    """64 experts a layer fill the ring: layer 1's guessed walk starts at the slot after layer 0's last (the ring's
    cursor, back at slot 0) while layer 0's groups still read those slots; each of its copies waits for the group
    that read its slot's last holder (a slot is never overwritten under a read)."""
    r = prompts([routing(2, 64)] * 2)[1]
    assert r.guessed == 2 * 64
    ends = {}   # expert -> the end of the layer-0 group that computed it
    for n, t in r.events:
        if n.startswith("gpu:L0 e"):
            es = [int(x[1:]) for x in n.split(" ", 1)[1].split(",")]
            ends.update({e: t + 10.0 + 5.0 * len(es) for e in es})
    runs = copies(r, 1)
    assert runs, "layer 1 streamed nothing"
    for name, start in runs:   # layer 1's walk: expert e in slot e, as layer 0's; a run waits for all its slots
        assert start >= max(ends[e] for e in experts(name)), name


def test_no_guess_with_the_share_on_the_chunk():
    """MoeBlock._guess: the CPU share picks its experts after each routing sync, so a chunk it may take guesses
    nothing (the memory is still noted)."""
    r = routing(2, 32)
    on = prompts([r, r], cfg=Config(cpu_share=0.5))
    assert on[1].guessed == 0
    assert on[1].session.routes.noted.all()


def test_auto_share_guesses_the_layers_its_settled_gate_leaves_unshared():
    """MoeBlock._guess beside auto's share (SharePolicy.guesses): once the chunk's gate says "do not share", its
    unshared layers guess as the share-off engine's do, and its probe layer (a share arm) does not; an exploring
    gate guesses nothing (its unshared windows are the share's yardstick), nor does a fixed share (every layer
    armed)."""
    from sim.engine import Session
    from strata.policy import Share, ShareMode, share_policy, size_class
    from strata.policy.gate import PROBE

    r = routing(8, 32)
    settled = share_policy(Share(ShareMode.AUTO))
    gate = settled._class(size_class(T)).gate
    gate.ratios.extend([2.0] * 5)                   # sharing doubled a window's time: do not share
    gate.layers = 1                                 # the next probe (a share arm) is this session's layer 28
    auto = prompts([r, r, r, r], cfg=Config(cpu_share="auto"), session=Session(settled))
    exploring = prompts([r, r], cfg=Config(cpu_share="auto"))
    fixed = prompts([r, r], cfg=Config(cpu_share=0.5))
    off = prompts([r, r, r, r])
    assert exploring[1].guessed == 0 and fixed[1].guessed == 0, (exploring[1].guessed, fixed[1].guessed)
    assert not gate.gate and gate.layers == 1 + 4 * 8 and PROBE == 29
    # prompts 1-3 guess as the share-off engine does but for prompt 3's layer 4 (the probe; its guess went out
    # after layer 3), which shares
    assert [p.guessed for p in auto[1:3]] == [p.guessed for p in off[1:3]]
    assert 0 < auto[3].guessed < off[3].guessed


def test_every_stored_engine_predates_the_guess():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    from share_sim import ENGINES

    assert all(flags.get("guess") is False for flags in ENGINES.values())
    assert all(flags.get("layer_major") is False for flags in ENGINES.values())     # and layer-major prompts
    assert ENGINES["stop34"] == dict(guess=False, layer_major=False, counted=True)


@pytest.mark.parametrize("span", [16, 48])
def test_guess_off_runs_as_before_whatever_the_memory(span):
    """Run.guess=False keeps every walk at ring slot 0 and streams nothing before a sync: a session whose memory
    was filled runs a prompt as a fresh one does."""
    r = routing(2, span)
    filled = prompts([r, r], guess=False)[1]
    fresh = prompts([r], guess=False)[0]
    assert filled.events == fresh.events and filled.prompt_ms == fresh.prompt_ms
