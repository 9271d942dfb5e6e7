"""One MoE layer on the device: router, routing sync, expert-major row layout, expert groups, combine (SPEC §3).

Legend: T tokens, K top-k, R = T·K rows, D hidden, F expert FFN, G experts per launch group.
Row order (Dm): [resident experts by id | streamed experts by id | CPU experts by id]; each expert owns a
contiguous row range, its tokens in order. Experts are computed in groups: dequantise the group's blobs into
fp16 scratch, one grouped GEMM for gate|up, SwiGLU, one for down, straight into their Dm rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

GEMM_BM = 64           # rows per GEMM tile (the CUDA kernel's block tile)
GROUP_RESIDENT = 16    # experts per launch group from the cache


@dataclass
class RowLayout:
    """The routing sync's product: which rows each expert owns, and the tables the kernels read."""

    ids: np.ndarray           # [T, K] routed expert ids
    order: np.ndarray         # experts in row order (resident | streamed | cpu)
    off: dict                 # expert -> first row
    cnt: np.ndarray           # [E] tokens per expert
    src: np.ndarray           # [R] token of each row
    slot: np.ndarray          # [T, K] row of each (token, k) pair
    resident: list = field(default_factory=list)
    streamed: list = field(default_factory=list)
    cpu: list = field(default_factory=list)
    rank: np.ndarray | None = None     # [E] each routed expert's position in `order`
    starts: np.ndarray | None = None   # [len(order)] first row of each expert in `order`


def row_layout(ids: np.ndarray, cnt: np.ndarray, resident: np.ndarray, cpu: list[int]) -> RowLayout:
    """ids [T, K]; cnt [E] tokens per expert (bincount of ids); resident [E] bool; cpu: the CPU's experts."""
    T, K = ids.shape
    n_expert = cnt.shape[0]
    routed = cnt > 0
    on_cpu = np.zeros(n_expert, bool)
    on_cpu[list(cpu)] = True
    res = np.flatnonzero(routed & resident)
    strm = np.flatnonzero(routed & ~resident & ~on_cpu)
    cpu_ids = np.flatnonzero(routed & on_cpu)
    order = np.concatenate([res, strm, cpu_ids]).astype(np.int64)
    rank = np.empty(n_expert, np.int64)
    rank[order] = np.arange(order.size)
    key = rank[ids] * T + np.arange(T)[:, None]                 # [T, K]: expert block first, then token
    pairs = np.argsort(key.ravel(), kind="stable")              # row r holds pair pairs[r] = t*K + k
    slot = np.empty(T * K, np.int32)
    slot[pairs] = np.arange(T * K, dtype=np.int32)
    starts = np.concatenate([[0], np.cumsum(cnt[order])[:-1]]) if order.size else np.zeros(0, np.int64)
    return RowLayout(ids, order, {int(e): int(s) for e, s in zip(order, starts)}, cnt,
                     (pairs // K).astype(np.int32), slot.reshape(T, K),
                     res.tolist(), strm.tolist(), cpu_ids.tolist(), rank, starts.astype(np.int64))


def _tiles(r0: np.ndarray, n: np.ndarray) -> np.ndarray:
    """GEMM_BM-row tiles (g, start, end) of experts g whose rows are r0[g] .. r0[g] + n[g] (n > 0), never
    crossing experts: [n_tiles, 3] int32."""
    nt = -(-n // GEMM_BM)                                          # tiles per expert
    g = np.repeat(np.arange(len(n)), nt)
    first = np.repeat(np.cumsum(nt) - nt, nt)
    start = np.repeat(r0, nt) + (np.arange(g.size) - first) * GEMM_BM
    end = np.minimum(start + GEMM_BM, np.repeat(r0 + n, nt))
    return np.stack([g, start, end], axis=1).astype(np.int32).reshape(-1, 3)


def blob_offsets(cfg, types: tuple[int, int, int]) -> tuple[int, int, int]:
    """Byte offsets of the gate, up and down matrices in an expert blob of these types: [gate | up | down]."""
    from strata import quants

    gb = quants.get(types[0]).row_bytes(cfg.n_embd) * cfg.n_ff_exp
    ub = quants.get(types[1]).row_bytes(cfg.n_embd) * cfg.n_ff_exp
    return 0, gb, gb + ub


class ExpertRunner:
    """Computes groups of experts into Dm. Owns the fp16 weight scratch; knows each layer's blob layout."""

    def __init__(self, dev, cfg, layer_types: list[tuple[int, int, int]], bufs):
        self.dev, self.k, self.cfg, self.bufs = dev, dev.k, cfg, bufs
        self.types = layer_types
        self.offsets = [blob_offsets(cfg, t) for t in layer_types]

    def tables(self, layer: int, groups: list[tuple[list[int], object, np.ndarray]], lay: RowLayout) -> list:
        """Every group's tables of a layer in one upload: groups[g] = (members, buf, idx), the members' blobs
        being rows idx of buf (cache slots or ring slots, known before the copies land)."""
        # every group is a run of consecutive experts in row order: tile the layer once, then cut
        every = _tiles(lay.starts, lay.cnt[lay.order].astype(np.int64))        # g = position in row order
        first = lay.rank[[m[0] for m, _, _ in groups]]
        last = lay.rank[[m[-1] for m, _, _ in groups]]
        assert np.array_equal(last - first, [len(m) - 1 for m, _, _ in groups]), \
            "a group must be a run of experts in row order"
        lo, hi = np.searchsorted(every[:, 0], first), np.searchsorted(every[:, 0], last + 1)
        tiles = []
        for i in range(len(groups)):
            t = every[lo[i]:hi[i]].copy()
            t[:, 0] -= first[i]
            tiles.append(t)
        return self.k.expert_tables([(buf, idx) for _, buf, idx in groups], self.offsets[layer], tiles,
                                    self.dev.compute)

    def group(self, layer: int, members: list[int], tab, lay: RowLayout, on_released=None):
        """Enqueue one group (its `tables` entry): dequantise, release the blobs (on_released), gate|up GEMM,
        SwiGLU, down GEMM."""
        k, s, b = self.k, self.dev.compute, self.bufs
        D, F, n = self.cfg.n_embd, self.cfg.n_ff_exp, len(members)
        assert n <= b.w_d.shape[0], f"a group of {n} experts exceeds the {b.w_d.shape[0]}-expert weight scratch"
        tg, tu, td = self.types[layer]
        t_gate, t_up, t_down, td_dev, n_tiles = tab
        if tg == tu:   # [gate rows | up rows] is one [2F, D] matrix of one type (the kernel fills g < n only)
            k.dequant(b.w_gu, t_gate, tg, 2 * F, D, s)
        else:
            k.dequant(b.w_gu[:n, :F], t_gate, tg, F, D, s)
            k.dequant(b.w_gu[:n, F:], t_up, tu, F, D, s)
        k.dequant(b.w_d, t_down, td, D, F, s)
        if on_released:
            on_released()
        r0 = lay.off[members[0]]
        r1 = lay.off[members[-1]] + int(lay.cnt[members[-1]])
        k.gemm_grouped(b.gu, b.xg, b.w_gu, td_dev, n_tiles, s)         # GU[rows] = Xg[rows] · Wgu[g]ᵀ
        k.swiglu(b.hh[r0:r1], b.gu[r0:r1], F, s)                          # H = silu(G) · U
        k.gemm_grouped(b.dm, b.hh, b.w_d, td_dev, n_tiles, s)            # Dm[rows] = H[rows] · Wdᵀ
