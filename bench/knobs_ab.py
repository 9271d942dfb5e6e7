"""In one process: prompts on two quarter-cache engines that differ only in a MoeBlock scheduling knob, CUDA only
(bench/kernel_ab.py's harness: two engines on one arena, arms alternating, medians, per-round ratios, logits compared
bit for bit: the knobs move host work, not arithmetic).

Knobs (class attributes of strata.accel.moe_block.MoeBlock, set on one engine): rows_on_device (a prompt layer's
pairs laid out on the device, the sync downloading counts only; off: on the host from the downloaded ids). Stop 45
also ran guess_ahead in an earlier four-arm form of this script (the next layer's guess picked before the routing
sync, its copies issued after the combine: 0.988-0.997x, not kept; knobs_ab_q8_stop45.log).

python bench/knobs_ab.py MODEL.gguf 250,600,900,2048 ROUNDS KNOB"""
import sys

import numpy as np

from kernel_ab import AB
from prefill import quarter_engines      # bench/prefill.py

KNOBS = ("rows_on_device",)


class KnobAB(AB):
    """kernel_ab.AB's prompts on two engines: "old" with `knob` off, "new" with it on."""

    def __init__(self, path: str, knob: str, rounds: int):
        assert knob in KNOBS, f"a knob of {KNOBS}"
        self.dev, self.m, self.arena, (eo, en) = quarter_engines(path, 2)
        setattr(eo, knob, False)
        setattr(en, knob, True)
        self.arms, self.rounds = {"old": (eo, None), "new": (en, None)}, rounds

    def use(self, md: str) -> None:
        """Nothing to swap: each arm is its own engine."""


path, lengths, rounds, knob = sys.argv[1], [int(x) for x in sys.argv[2].split(",")], int(sys.argv[3]), sys.argv[4]
ab = KnobAB(path, knob, rounds)
print(f"{knob}: old = off, new = on", flush=True)
ab.prompts(lengths, np.random.default_rng(0))
