"""The contention gate (SPEC §6): arms, skip rules, ratios, the upper median, probes, the debug line."""

import pytest

from strata.policy import CpuGate, GatedShare, LayerEnd, MeteredShare, ShareMeter, size_class
from strata.policy.gate import GateReading


def drive(gate, layers, per_expert, nstream=10, n_cpu=5, grow_first_share=True):
    """The engine's order per eligible layer: arm, then the previous window's reading at the routing sync,
    then end_layer. ``per_expert(l, shared)`` is the window's ms per non-resident expert."""
    arms, readings, grown, prev = [], [], False, None
    for l in layers:
        arm = gate.begin_layer(l)
        if gate.pending is not None:
            readings.append(gate.reading(prev))
        one_time = arm and grow_first_share and not grown
        grown = grown or one_time
        gate.end_layer(l, nstream, n_cpu if arm else 0, one_time)
        prev = per_expert(l, arm) * nstream
        arms.append(arm)
    return arms, readings


def as_bits(arms):
    return "".join("1" if a else "0" for a in arms)


def two_chunks():
    return list(range(48)) + list(range(48))  # a 48-layer model, two chunks, every layer eligible


def test_arms_when_sharing_wins():
    gate = CpuGate()
    arms, _ = drive(gate, two_chunks()[:60], lambda l, s: 0.9 if s else 1.0)
    # i0 off (cold layer 0), i1 on (its window grew the pinned buffers: skipped), i2..i6 exploration
    # (3 ratios arrive at i6's routing sync, after i6's arm), i7.. the gate's choice (share),
    # i29 and i58 probe
    expected = "0101010" + "1" * 22 + "0" + "1" * 28 + "0" + "1"
    assert as_bits(arms) == expected
    assert gate.gate and list(gate.ratios) == pytest.approx([0.9] * 5)


def test_arms_when_sharing_loses():
    gate = CpuGate()
    arms, lines = drive(gate, two_chunks()[:60], lambda l, s: 1.1 if s else 1.0)
    expected = "0101010" + "0" * 22 + "1" + "0" * 28 + "1" + "0"
    assert as_bits(arms) == expected
    assert not gate.gate
    assert lines[0].line() == (
        "cpu gate: layer 2 not shared, 10 non-resident, 10.00 ms (1.0000 a expert) " "-> do not share"
    )
    assert (
        lines[1].line()
        == "cpu gate: layer 3 shared, 10 non-resident, 11.00 ms (1.1000 a expert) -> do not share"
    )


def test_no_ratio_across_chunks():
    """57-layer chunks put the probe i58 on chunk 2's layer 1; its reading follows chunk 1's layer 56 (other
    arm, higher index): no ratio. Layer 2 then pairs with layer 1 of the same chunk."""
    gate = CpuGate()
    _, readings = drive(gate, list(range(57)) * 2, lambda l, s: 1.1 if s else 1.0)
    at = [(r.layer, r.shared, r.ratio is not None) for r in readings]
    k = at.index((56, False, False))
    assert at[k : k + 3] == [(56, False, False), (1, True, False), (2, False, True)]
    assert readings[k + 2].ratio == pytest.approx(1.1) and not gate.gate


def test_upper_median_and_ring():
    """Windows are timed so that each ratio the gate forms is the next wanted one, whatever arms it picks."""
    wanted = [0.9, 1.05, 0.95, 1.2, 0.8, 0.8, 1.3, 1.4]
    gate, formed, verdicts = CpuGate(), [], []
    last = None  # (shared, ms per expert) of the last window read
    pending_w = None
    for l in range(200):
        arm = gate.begin_layer(l)
        if gate.pending is not None:
            g = gate.reading(pending_w * 10)
            if g.ratio is not None:
                formed.append(g.ratio)
                verdicts.append(g.gate)
        if len(formed) == len(wanted):
            break
        if gate.end_layer(l, 10, 5 if arm else 0):
            if last is None or last[0] == arm:
                w = 1.0 if last is None else last[1]
            else:
                r = wanted[len(formed)]
                w = last[1] * r if arm else last[1] / r
            last, pending_w = (arm, w), w
    assert formed == pytest.approx(wanted)
    # ring after each ratio, sorted, and its element n//2 (the upper median for an even count):
    # [.9] .9 | [.9 1.05] 1.05 | [.9 .95 1.05] .95 | [.9 .95 1.05 1.2] 1.05 | [.8 .9 .95 1.05 1.2] .95 |
    # [.8 .8 .95 1.05 1.2] .95 (0.9 dropped) | [.8 .8 .95 1.2 1.3] .95 | [.8 .8 1.2 1.3 1.4] 1.2
    assert verdicts == [True, False, True, False, True, True, True, False]
    assert list(gate.ratios) == pytest.approx([1.2, 0.8, 0.8, 1.3, 1.4])


def test_skip_rules():
    gate = CpuGate()
    assert gate.begin_layer(3) is False and gate.end_layer(3, 10, 0) is False  # first eligible layer
    assert gate.begin_layer(4) is True and gate.end_layer(4, 10, 0) is False  # shared arm, nothing taken
    assert gate.begin_layer(5) is False and gate.end_layer(5, 0, 0) is False  # nothing to stream
    assert gate.begin_layer(6) is True and gate.end_layer(6, 10, 3, True) is False  # one-time cost
    assert gate.begin_layer(7) is False and gate.end_layer(7, 10, 0) is True
    gate.begin_layer(8)
    with pytest.raises(AssertionError, match="read the previous window"):
        gate.end_layer(8, 10, 3)


def test_debug_line():
    r = GateReading(5, True, 58, 2.894, None, True)
    assert r.line() == "cpu gate: layer 5 shared, 58 non-resident, 2.89 ms (0.0499 a expert) -> share"


def test_gated_share_uses_meter_after_readings():
    pol = GatedShare(ShareMeter(margin=0.0), CpuGate())         # SPEC §5's meter (the margin: test_policy_meter)
    assert pol.begin_layer(0) is False and pol.share(False) == 0.0
    assert not pol.end_layer(LayerEnd(0, 20, 0)).gpu
    assert pol.begin_layer(1) is True
    pol.readings(None, None)
    assert pol.share(True) == 0.5  # the meter's start
    want = pol.end_layer(LayerEnd(1, 20, 10, cpu_ms=1.0))
    assert want.gpu and want.wall
    assert pol.begin_layer(2) is False
    pol.readings(gpu_ms=9.0, wall_ms=5.0)  # c = 0.1, g = 0.9 -> 0.9
    assert pol.meter.share == pytest.approx(0.9)
    ungated = MeteredShare()
    assert all(ungated.begin_layer(l) for l in range(5))


def _drive(pol, chunks, wall, cpu_ms=1.0, gpu_ms=2.0):
    """Run eligible layers 0..7 of each chunk (tokens) through `pol`; wall(tokens, shared) is a window's ms;
    cpu_ms a number or a function of the chunk's index. Returns the (tokens, layer, arm, share) of every layer."""
    out, last = [], None      # last: (tokens, shared) of the window read at the next routing sync
    for i, t in enumerate(chunks):
        pol.begin_chunk(t)
        for l in range(8):
            arm = pol.begin_layer(l)
            want = pol.wants()
            pol.readings(gpu_ms if want.gpu else None, wall(*last) if want.wall else None)
            share = pol.share(arm)
            n_cpu = round(share * 40)
            pol.end_layer(LayerEnd(l, 40, n_cpu, cpu_ms(i) if callable(cpu_ms) else cpu_ms))
            last = (t, n_cpu > 0)
            out.append((t, l, arm, share))
    return out


def test_auto_learns_each_size_class_apart():
    """SizedShare (ours): sharing wins at 250 tokens and loses at 1,000; interleaved, each size keeps its own
    verdict, where one gate for every size (GatedShare, the original's) carries 250's verdict into 1,000."""
    from strata.policy import SizedShare

    def wall(t, shared):      # ms of a window: sharing saves 20% at 250 tokens and costs 10% at 1,000
        return 10.0 * ((0.8 if t < 500 else 1.1) if shared else 1.0)

    sized, one = SizedShare(), GatedShare()
    for pol in (sized, one):
        got = _drive(pol, [250, 1000, 250, 250, 1000] * 6, wall)
        last = [(t, arm) for t, l, arm, _ in got[-80:]]          # the last 10 chunks
        shared = {t: sum(a for tt, a in last if tt == t) / sum(1 for tt, _ in last if tt == t) for t in (250, 1000)}
        if pol is sized:
            assert shared[250] > 0.9 and shared[1000] < 0.1, shared
            assert set(sized.by_class) == {size_class(250), size_class(1000)}
        else:
            assert shared[1000] > 0.5, shared    # one verdict for both sizes: the 1,000-token chunks share


def test_one_size_class_is_the_originals_auto():
    """Chunks of one size class: SizedShare arms, shares and reads exactly as GatedShare."""
    from strata.policy import SizedShare

    def wall(t, shared):
        return 9.0 if shared else 10.0

    runs = []
    for pol in (SizedShare(), GatedShare()):
        runs.append(_drive(pol, [600, 700, 512] * 5, wall, cpu_ms=3.0))
    assert runs[0] == runs[1]


def test_a_window_pending_at_a_chunk_end_goes_to_its_own_class():
    from strata.policy import SizedShare

    pol = SizedShare()
    pol.begin_chunk(250)
    for l in range(2):
        pol.begin_layer(l)
        pol.readings(None, None)
        pol.end_layer(LayerEnd(l, 40, 0 if l == 0 else 20, 1.0))
    assert pol.wants().gpu and pol.wants().wall                  # layer 1 (shared) is pending
    small = pol.current
    pol.begin_chunk(1000)
    pol.begin_layer(0)
    pol.readings(4.0, 6.0)                                       # read at the 1,000-token chunk's first sync
    assert small.meter.c_avg == pytest.approx(0.05) and pol.current.meter.c_avg is None
    assert pol.current is not small and not pol.wants().gpu


def test_size_class_floor_inverts_size_class():
    from strata.policy import size_class_floor

    assert [size_class(t) for t in (191, 192, 255, 256, 767, 768)] == [14, 15, 15, 16, 18, 19]
    for t in range(2, 5000):       # (class 1 is empty: 1 token is class 0)
        c = size_class(t)
        assert size_class_floor(c) <= t < size_class_floor(c + 1)


def test_the_floor_veto_holds_share_arms_while_the_cpu_cannot_keep_up():
    """Ours: while the meter's balance g / (c + g) lies under its floor (0.05), the gate's share arms run unshared
    but one in PROBE, which samples the meter; once the CPU keeps up again the gate's arms share as before.
    Windows here say sharing wins (the gate alone would share every layer): the veto holds it anyway."""
    from strata.policy.gate import PROBE

    def wall(t, shared):
        return 9.0 if shared else 10.0

    slow, fast = GatedShare(), GatedShare()
    # c = 30 ms / n_cpu >> 19 g for 40 chunks, then the CPU catches up (c = 0.2 / n_cpu)
    got_slow = _drive(slow, [600] * 120, wall, cpu_ms=lambda i: 30.0 if i < 40 else 0.2, gpu_ms=2.0)
    got_fast = _drive(fast, [600] * 40, wall, cpu_ms=1.0, gpu_ms=2.0)
    assert not fast.meter.below_floor
    shared = [arm for _, _, arm, _ in got_slow[40:320]]                  # chunks 5..39: the veto holds
    assert 0 < sum(shared) <= len(shared) // PROBE + 1, sum(shared)       # the 1-in-PROBE arms sample the meter
    assert sum(arm for _, _, arm, _ in got_fast[40:]) > 0.9 * len(got_fast[40:])
    # the CPU caught up: the next samples lift the balance over the floor and the gate's arms share again
    assert not slow.meter.below_floor
    assert sum(arm for _, _, arm, _ in got_slow[-160:]) > 0.9 * 160


def test_without_the_veto_the_gate_alone_decides():
    """share_policy(veto=False) is auto before the floor veto (stored runs of older engines replay with it): the
    same slow CPU, and the gate's verdict (sharing wins in these windows) shares every layer."""
    from strata.policy import Share, ShareMode, share_policy

    def wall(t, shared):
        return 9.0 if shared else 10.0

    old = share_policy(Share(ShareMode.AUTO), veto=False)
    got = _drive(old, [600] * 40, wall, cpu_ms=30.0, gpu_ms=2.0)
    assert old.current.meter.below_floor
    assert sum(arm for _, _, arm, _ in got[40:]) > 0.9 * len(got[40:])


def test_each_layer_shares_by_its_own_meter():
    """Ours (stop 23): a layer whose CPU experts cost more takes a smaller share once it has sampled; a layer not
    yet sampled shares by the meter of every layer; layer_meters=False keeps one share for all (stored runs)."""
    from strata.policy import Share, ShareMode, share_policy

    def drive(pol):
        for l in range(4):
            assert pol.begin_layer(l)
            pol.readings(3.0 if pol.wants().gpu else None, None)     # 30 streamed experts, 0.1 ms each
            # layers 0-1: 1 ms a CPU expert; layers 2-3: 0.1 ms; the GPU 0.1 ms a streamed expert
            pol.end_layer(LayerEnd(l, 40, 10, cpu_ms=10.0 if l < 2 else 1.0))
        pol.begin_layer(4)
        pol.readings(3.0, None)       # layer 3's window

    per_layer = share_policy(Share(ShareMode.AUTO), gated=False, margin=0.0)
    drive(per_layer)
    assert per_layer.meter_of(0).share == pytest.approx(0.1 / 1.1)        # g / (c + g) of layer 0 alone
    assert per_layer.meter_of(3).share == pytest.approx(0.5)
    per_layer.begin_layer(3)
    assert per_layer.share(True) == pytest.approx(0.5)
    per_layer.begin_layer(7)                                            # never sampled: every layer's meter
    assert per_layer.share(True) == pytest.approx(per_layer.meter.share)
    assert per_layer.meter.share < 0.5                                 # (layers 0-1 pulled it down)
    one = share_policy(Share(ShareMode.AUTO), gated=False, layer_meters=False, margin=0.0)
    drive(one)
    one.begin_layer(3)
    assert one.share(True) == pytest.approx(per_layer.meter.share) and one.layer_meters is None


def test_a_new_size_class_starts_from_the_last_classs_meter():
    """Ours (stop 23): a size class met for the first time starts its meter where the last class's stands (the
    CPU's and the GPU's cost an expert carry across sizes), not at 0.5; its gate starts afresh; the very first
    class, with nothing to start from, starts at SPEC §5's 0.5."""
    from strata.policy import SizedShare

    pol = SizedShare()
    _drive(pol, [250] * 3, lambda t, shared: 10.0, cpu_ms=8.0, gpu_ms=2.0)
    small = pol.by_class[size_class(250)]
    assert small.meter.c_avg is not None and small.meter.share < 0.5
    pol.begin_chunk(1000)
    big = pol.current
    assert big is not small and big.gate.layers == 0 and not big.gate.ratios
    assert (big.meter.c_avg, big.meter.g_avg, big.meter.share) == (small.meter.c_avg, small.meter.g_avg,
                                                                     small.meter.share)
    assert big.meter is not small.meter
    big.begin_layer(0)
    assert big.share(True) == pytest.approx(small.meter.share)     # not 0.5
    fresh = SizedShare()
    fresh.begin_chunk(250)
    assert fresh.current.meter.c_avg is None and fresh.current.meter.share == 0.5


def test_prime_reaches_the_first_size_class_and_the_later_ones_through_it():
    """Ours: auto primed at load seeds its first size class's meter (and the later ones from it); a seeded or
    sampled meter keeps its averages; fixed shares and off take no prime."""
    from strata.policy import Share, ShareMode, SizedShare, share_policy

    pol = SizedShare()
    assert pol.prime(0.3, 0.03)
    pol.begin_chunk(250)
    assert pol.meter.c_avg == 0.3 and pol.meter.share == pytest.approx(0.03 / (1.25 * 0.3 + 0.03))
    pol.begin_chunk(1000)                        # a new class seeds from the last one's, the primed meter
    assert pol.meter.c_avg == 0.3 and pol.meter is not pol.by_class[size_class(250)].meter
    assert not pol.prime(1.0, 1.0) and pol.meter.c_avg == 0.3
    assert not share_policy(Share(ShareMode.FIXED, 0.3)).prime(0.3, 0.03)
    assert not share_policy(Share(ShareMode.OFF)).prime(0.3, 0.03)
    one = share_policy(Share(ShareMode.AUTO), sized=False)
    assert one.prime(0.3, 0.03) and one.meter.c_avg == 0.3


@pytest.mark.parametrize("cpu_ms", [1.0, lambda i: 30.0 if i < 20 else 0.2])
def test_peek_arm_is_the_next_begin_layers_arm(cpu_ms):
    """peek_arm(l), asked where the engine guesses layer l's experts (after the chunk starts, or before the layer
    before it ends), is the arm begin_layer(l) then gives: through exploration, both verdicts of each size class,
    its probes and the floor veto (a CPU too slow for 20 chunks, then caught up). guesses(l) (MoeBlock._guess beside
    the share) only where the layer is unarmed and the gate done exploring; never for a fixed or ungated share."""
    from strata.policy import NoShare, SizedShare
    from strata.policy.share import FixedShare

    def wall(t, shared):      # sharing saves 20% at 250 tokens and costs 10% at 1,000
        return 10.0 * ((0.8 if t < 500 else 1.1) if shared else 1.0)

    for pol in (SizedShare(), GatedShare(), MeteredShare(), FixedShare(0.3), NoShare()):
        last, arms, guessed = None, [], []
        for i, t in enumerate([250, 1000, 250, 250, 1000] * 12):
            pol.begin_chunk(t)
            peek, guess, exploring = pol.peek_arm(0), pol.guesses(0), _exploring(pol)
            for l in range(8):
                arm = pol.begin_layer(l)
                assert arm == peek, (type(pol).__name__, i, l)
                assert not (guess and (arm or exploring)), (type(pol).__name__, i, l)   # guesses: unarmed, settled
                guessed.append(guess)
                want = pol.wants()
                pol.readings(2.0 if want.gpu else None, wall(*last) if want.wall else None)
                n_cpu = round(pol.share(arm) * 40)
                if l + 1 < 8:   # the next layer's guess, before this layer's end
                    peek, guess, exploring = pol.peek_arm(l + 1), pol.guesses(l + 1), _exploring(pol)
                pol.end_layer(LayerEnd(l, 40, n_cpu, cpu_ms(i) if callable(cpu_ms) else cpu_ms))
                last = (t, n_cpu > 0)
                arms.append(arm)
        name = type(pol).__name__
        if isinstance(pol, (SizedShare, GatedShare)):
            assert 0 < sum(arms) < len(arms), name      # both arms seen: the peek proved something
        if isinstance(pol, SizedShare):                 # the 1,000-token class settles on "do not share"
            assert 0 < sum(guessed) < len(guessed) - sum(arms), name
        elif type(pol) in (MeteredShare, FixedShare):
            assert not any(guessed), name


def _exploring(pol) -> bool:
    gate = getattr(pol, "gate", None)
    return gate is not None and gate.exploring()
