"""Device buffers of one step (a prompt chunk or a decode round), carved from one region.

Prompt buffers are carved from the expert cache's lent tail slots (SPEC §9); decode buffers are decode-only
resources of their own. `layout_bytes` runs the same carving without a region, so the planner prices exactly
what the engine will take. Legend: T tokens, R = T·K rows, G experts per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.accel.device.base import Bump
from strata.accel.gpu.cuda_decode import attn_decode_cols
from strata.accel.gpu.kernels import ONE_PASS_HEAD_DIMS, ROUTE_TILE
from strata.accel.presync import carve_shape, pre_bytes
from strata.models.base import QKNorm

ALIGN = Bump.ALIGN


class Carver:
    """A step's buffers carved from a flat uint8 device array (device.base.Bump), or with region=None each its own
    allocation, counted; with dev=None a dry run that only counts."""

    def __init__(self, dev, region=None):
        self.dev, self.region = dev, region
        self._bump = Bump(region if dev is not None else None)     # carving past the region raises MemoryError

    @property
    def used(self) -> int:
        return self._bump.used

    def take(self, shape, dtype):
        if self.dev is None or self.region is None:
            self._bump.take(int(np.prod(shape)) * np.dtype(dtype).itemsize)
            return None if self.dev is None else self.dev.empty(shape, dtype)
        return self._bump.view(shape, dtype)


@dataclass
class StepBuffers:
    """What the MoE block and the embedding need for a step of up to `cap` tokens. The dense ops' outputs are
    step temporaries from the device's memory pool (priced by `temp_bytes`)."""

    cap: int          # tokens
    rows: int         # cap · K
    group: int        # experts per group (weight scratch)
    x: object = None            # f32 [T, D]     the embedded chunk
    ids: object = None          # i32 [T, K]     routed experts
    w: object = None            # f32 [T, K]     routing weights
    hist: object = None         # i32 [R/tile, E] the routing's counts by tile of pairs (kernels.route_hist)
    src: object = None          # i32 [R]        the token of each row    } made on the device from the routing
    slot: object = None         # i32 [R]        the row of each pair     } (kernels.route_rows)
    xg: object = None           # f16 [R, D]     expert inputs in row order
    gu: object = None           # f32 [R, 2F]    gate | up products
    hh: object = None           # f16 [R, F]     silu(gate) · up
    dm: object = None           # f32 [R, D]     unweighted expert outputs (Dm)
    w_gu: object = None         # f16 [G, 2F, D] dequantised gate | up weights of a group
    w_d: object = None          # f16 [G, D, F]  dequantised down weights of a group
    attn_scratch: object = None  # u8            blocked attention's score buffers
    pre: object = None          # u8             the pre-sync groups' tables (presync.py)
    pre_shape: object = None    # presync.PreShape of `pre`


def carve(cfg, cap: int, group: int, attn_scratch_bytes: int, carver: Carver, weights=None,
          x: bool = True) -> StepBuffers:
    """Lay out a StepBuffers for `cap` tokens with `carver` (a dry-run carver only counts). `weights`: a weight
    scratch (w_gu, w_d) of `group` experts to use instead of carving one (a layer-major prompt borrows decode's);
    x=False: no embedding buffer (a layer-major prompt keeps every chunk's rows in its own)."""
    c = carver
    D, F, K = cfg.n_embd, cfg.n_ff_exp, cfg.n_expert_used
    R = cap * K
    f32, f16, i32 = np.float32, np.float16, np.int32
    b = StepBuffers(cap, R, group)
    b.x = c.take((cap, D), f32) if x else None
    b.ids = c.take((cap, K), i32)
    b.w = c.take((cap, K), f32)
    b.hist = c.take((-(-R // ROUTE_TILE), cfg.n_expert), i32)
    b.src = c.take((R,), i32)
    b.slot = c.take((R,), i32)
    b.xg = c.take((R, D), f16)
    b.gu = c.take((R, 2 * F), f32)
    b.hh = c.take((R, F), f16)
    b.dm = c.take((R, D), f32)
    if weights is None:
        b.w_gu = c.take((group, 2 * F, D), f16)
        b.w_d = c.take((group, D, F), f16)
    else:                                             # (None, None): a dry run that leaves the scratch out
        b.w_gu, b.w_d = weights
        assert b.w_gu is None or (b.w_gu.shape == (group, 2 * F, D) and b.w_d.shape == (group, D, F)), group
    b.attn_scratch = c.take((attn_scratch_bytes,), np.uint8)
    b.pre_shape = carve_shape(cfg.n_expert, cap, K, group)
    b.pre = c.take((pre_bytes(b.pre_shape),), np.uint8)
    return b


ATTN_SCRATCH_TARGET = 64 << 20


def attn_scratch_bytes(cfg, cap: int, n_ctx: int) -> int:
    """Score buffers of the blocked attention: H heads of fp32 scores + fp16 probabilities (+ the permuted q
    and o) for as many queries a block as fit 64 MiB over a full context (at most 128, at least one). None for
    the head sizes whose attention keeps its scores in registers: those 64 MiB go to the prompt's chunk."""
    if cfg.head_dim in ONE_PASS_HEAD_DIMS:
        return 0
    per_q = cfg.n_head * (6 * n_ctx + 6 * cfg.head_dim) + 1024
    return max(1, min(cap, 128, ATTN_SCRATCH_TARGET // per_q)) * per_q + 4096


def decode_scores_bytes(cfg, n_ctx: int) -> int:
    """One query's attention scratch (DeviceOps.dscores: the decode graph's and the per-layer decode's), at its
    CUDA size (the host twin's is smaller)."""
    return cfg.n_head * attn_decode_cols(n_ctx, cfg.head_dim) * 4


def layout_bytes(cfg, cap: int, group: int, attn_scratch_bytes: int, weights: bool = True, x: bool = True) -> int:
    """Bytes `carve` takes, rounded up to ALIGN: what follows in the same region (the ring) starts aligned.
    weights=False: without the weight scratch (carve's `weights` given); x=False: without the embedding buffer."""
    c = Carver(None)
    carve(cfg, cap, group, attn_scratch_bytes, c, None if weights else (None, None), x)
    return -(-c.used // ALIGN) * ALIGN


def carve_prompt(cfg, chunk: int, n_ctx: int, group: int, ring: int, slot_bytes: int, carver: Carver, weights=None):
    """A prompt chunk's buffers and then its ring [ring, slot_bytes], as the engine lays them in a loan;
    takes layout_bytes(cfg, chunk, group, ...) + ring·slot_bytes (without the weight scratch where `weights`, a
    scratch of `group` experts borrowed from decode, is given)."""
    bufs = carve(cfg, chunk, group, attn_scratch_bytes(cfg, chunk, n_ctx), carver, weights)
    return bufs, carver.take((ring, slot_bytes), np.uint8)


SIDE_PENDING = 2        # deferred blocks on the side stream that the compute stream has not waited for, at most


def temp_bytes(cfg, cap: int) -> int:
    """Peak step temporaries of a chunk of `cap` tokens in the memory pool: the dense ops' (x, h, q, k, v, attention
    out, projections, sums: ~8 live [T, max(D, H·hd)] float32 arrays) plus the router logits and one row of output
    logits; what deferred MoE blocks keep (deferred.py: each its input and the residual its add reads, 2 [T, D]
    float32, for the block waiting and the SIDE_PENDING ones on the side stream); and the side stream's own pool
    arena, which the compute stream's freed blocks cannot serve (moe_block._beside): a block's output and the adds
    recorded on it, 3 [T, D]. On the H200 an 8K layer-major prompt of qwen3-30b-a3b's quarter cache (chunks of
    1,166) grew the pool by 166.0 MiB, 123.6 MiB of it live at once (bench/results/h200/pool_growth_q8_stop42.log)."""
    width = max(cfg.n_embd, cfg.n_q, 2 * cfg.n_ff_shexp)
    kept = 2 * (SIDE_PENDING + 1) + 3
    return 8 * cap * width * 4 + cap * cfg.n_expert * 4 + cfg.n_vocab * 4 + kept * cap * cfg.n_embd * 4


SEGMENT_ALLOCS = 64     # more allocations than any segment makes: each may waste ALIGN bytes


def segment_bytes(cfg, T: int) -> int:
    """The bytes one prompt segment of T rows carves from its region (prompt_graph.py): every array the dense ops
    and their kernels allocate between two MoE blocks, none freed, in float32 units a row. test_prompt_graph checks
    it against what each golden model's segments take."""
    D, Q, KV, Fs = cfg.n_embd, cfg.n_q, cfg.n_kv, cfg.n_ff_shexp
    row = 2 * D + 2 * D                    # the two residual adds, the two norms
    row += D / 2 + Q / 2                   # fp16 copies of the q|k|v and o GEMMs' inputs
    row += Q + 2 * KV + Q + D              # q, k, v; the attention's output; o
    row += cfg.n_expert                    # the router's logits
    if cfg.qkv_bias:
        row += Q + 2 * KV
    if cfg.qk_norm is not QKNorm.NONE:
        row += Q + KV
    if Fs:                                 # the shared expert: gu, fp16 input and hh, (GEMV's f32 hh), out, gate,
        row += 3.5 * Fs + 3.5 * D + 1      # its product and one more add
    return int(row * 4) * T + SEGMENT_ALLOCS * ALIGN

