"""Device buffers of one step (a prompt chunk or a decode round), carved from one region.

Prompt buffers are carved from the expert cache's lent tail slots (SPEC §9); decode buffers are decode-only
resources of their own. `layout_bytes` runs the same carving without a region, so the planner prices exactly
what the engine will take. Legend: T tokens, R = T·K rows, G experts per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALIGN = 256


class Carver:
    """Bump allocator over a flat uint8 device array (or, with region=None, a dry run that only counts)."""

    def __init__(self, dev, region=None):
        self.dev, self.region, self.used = dev, region, 0

    def take(self, shape, dtype):
        dt = np.dtype(dtype)
        n = int(np.prod(shape)) * dt.itemsize
        start = -(-self.used // ALIGN) * ALIGN
        self.used = start + n
        if self.dev is None:
            return None
        if self.region is None:
            return self.dev.empty(shape, dt)
        assert self.used <= self.region.nbytes, f"buffers need {self.used} bytes, the region has {self.region.nbytes}"
        return self.region[start:start + n].view(dt).reshape(shape)


@dataclass
class StepBuffers:
    cap: int          # tokens
    rows: int         # cap · K
    group: int        # experts per group (weight scratch)
    x: object = None
    h: object = None
    q: object = None
    k: object = None
    v: object = None
    attn: object = None
    tmp: object = None
    logits_r: object = None
    ids: object = None
    w: object = None
    xg: object = None
    gu: object = None
    hh: object = None
    dm: object = None
    w_gu: object = None
    w_d: object = None
    moe: object = None
    sh_gu: object = None
    sh_h: object = None
    sh_g: object = None
    logits: object = None
    attn_scratch: object = None


def carve(cfg, cap: int, group: int, n_logits: int, attn_scratch_bytes: int, dev=None, region=None):
    """Lay out a StepBuffers for `cap` tokens; returns (buffers, bytes used)."""
    c = Carver(dev, region)
    D, F, K, E = cfg.n_embd, cfg.n_ff_exp, cfg.n_expert_used, cfg.n_expert
    R = cap * K
    f32, f16, i32 = np.float32, np.float16, np.int32
    b = StepBuffers(cap, R, group)
    b.x, b.h, b.tmp, b.moe = (c.take((cap, D), f32) for _ in range(4))
    b.q = c.take((cap, cfg.n_head, cfg.head_dim), f32)
    b.k = c.take((cap, cfg.n_head_kv, cfg.head_dim), f32)
    b.v = c.take((cap, cfg.n_head_kv, cfg.head_dim), f32)
    b.attn = c.take((cap, cfg.n_q), f32)
    b.logits_r = c.take((cap, E), f32)
    b.ids = c.take((cap, K), i32)
    b.w = c.take((cap, K), f32)
    b.xg = c.take((R, D), f16)
    b.gu = c.take((R, 2 * F), f32)
    b.hh = c.take((R, F), f16)
    b.dm = c.take((R, D), f32)
    b.w_gu = c.take((group, 2 * F, D), f16)
    b.w_d = c.take((group, D, F), f16)
    if cfg.n_ff_shexp:
        b.sh_gu = c.take((cap, 2 * cfg.n_ff_shexp), f32)
        b.sh_h = c.take((cap, cfg.n_ff_shexp), f32)
        b.sh_g = c.take((cap, 1), f32)
    b.logits = c.take((n_logits, cfg.n_vocab), f32)
    b.attn_scratch = c.take((attn_scratch_bytes,), np.uint8)
    return b, c.used


def layout_bytes(cfg, cap: int, group: int, n_logits: int, attn_scratch_bytes: int) -> int:
    return carve(cfg, cap, group, n_logits, attn_scratch_bytes)[1]
