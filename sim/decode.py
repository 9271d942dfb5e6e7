"""Decode speed, a roofline estimate per token (SPEC §8), not a discrete-event run.

Per layer and token: dense weights and the KV cache read once; K experts, a hit rate from the profile's mass
on resident experts; misses split between the GPU reading them over PCIe and the CPU pool computing them in
place, at the fraction where both sides end together (the cost model ``--pcie-frac`` stands for), or, as
Strata's decode graph does (strata/accel/decode_graph.py, ``pcie_only``), every miss read by the GPU over PCIe
while its product runs. No speculative decoding: one token per pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .costs import Costs
from .workload import inclusion


@dataclass(frozen=True, slots=True)
class DecodeEstimate:
    tok_s: float
    hit_rate: float  # routed experts found in VRAM
    pcie_frac: float  # share of the misses the GPU reads over PCIe
    layer_us: float  # mean per layer


def decode_estimate(
    costs: Costs, profile: list[np.ndarray], resident: list[list[bool]], ctx: int, pcie_only: bool = False
) -> DecodeEstimate:
    m, cal = costs.model, costs.calib
    graph_launch_us = 1.0  # decode runs as captured graphs: ~1 µs a kernel (peers.md 3.3, KTransformers)
    total, hits, fracs = 0.0, [], []
    for l in range(m.n_layer):
        q = inclusion(profile[l], m.k)  # per-token inclusion probability
        hit = float(sum(q[e] for e in range(m.n_expert) if resident[l][e])) / m.k
        kv = ctx * m.kv_bytes_per_token() / m.n_layer
        dense = cal.gpu_kernels_per_layer * graph_launch_us + costs._bw_us(m.dense_bytes(l) + kv)
        blob = m.blob_bytes(l)
        hit_us = m.k * hit * costs.expert_hit_us(l)
        miss = m.k * (1.0 - hit)
        if pcie_only:   # read in place over PCIe by the product itself: the link's time
            f, miss_us = 1.0, miss * costs.copy_us(blob, False)
        else:
            tp = costs.copy_us(blob, False) + costs._bw_us(blob)  # over PCIe, then computed
            tc = costs.cpu_expert_us(l, 1)
            f, miss_us = tc / (tp + tc), miss * tp * tc / (tp + tc)
        total += dense + hit_us + miss_us
        hits.append(hit)
        fracs.append(f)
    total += costs.head_us()
    return DecodeEstimate(1e6 / total, float(np.mean(hits)), float(np.mean(fracs)), total / m.n_layer)
