"""The routing sync's host work, compiled: the expert-major row layout and the launch groups' tiles (SPEC §3).

Legend: T tokens, K top-k, P = T·K (token, k) pairs, n experts in row order, G launch groups.
Between a prompt layer's routing sync and its first launch the link idles (prefill_timeline_stop25_detail.log);
as whole-array numpy this work was ~40 numpy calls a layer (bench/host_layout.py: 0.3-0.45 ms a layer on this
dev box for qwen3, most of it per-call overhead). Here each step is one pass over its rows. moe.py states the
rules; tests/test_row_layout.py holds these to loops that state them.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def split_routed(cnt, resident, on_cpu):
    """cnt [E] tokens per expert, resident [E] bool, on_cpu [E] bool -> (resident, streamed, CPU) routed experts,
    each in id order (moe.placement's rule, one pass: three boolean numpy passes and their temporaries were ~20 us
    of a prompt layer's host time on the H200, bench/results/h200/lines_q8_stop33.log)."""
    E = cnt.shape[0]
    res = np.empty(E, np.int64)
    strm = np.empty(E, np.int64)
    cpu = np.empty(E, np.int64)
    i = j = k = 0
    for e in range(E):
        if cnt[e] > 0:
            if resident[e]:
                res[i] = e
                i += 1
            elif not on_cpu[e]:
                strm[j] = e
                j += 1
            if on_cpu[e]:
                cpu[k] = e
                k += 1
    return res[:i], strm[:j], cpu[:k]


@njit(cache=True, nogil=True)
def expert_major(ids, rank, cnt, K):
    """ids [P] (token-major pairs), rank [E] each routed expert's position in row order, cnt [n] rows of each
    position, K top-k -> (src [P] i32 token of each row, slot [P] i32 row of each pair, starts [n] i64 first row of
    each position). A counting sort by rank taking pairs in order keeps each expert's tokens in order (stable)."""
    n = cnt.shape[0]
    starts = np.empty(n, np.int64)
    s = 0
    for i in range(n):
        starts[i] = s
        s += cnt[i]
    nxt = starts.copy()
    P = ids.shape[0]
    src = np.empty(P, np.int32)
    slot = np.empty(P, np.int32)
    for p in range(P):
        r = rank[ids[p]]
        row = nxt[r]
        nxt[r] = row + 1
        slot[p] = row
        src[row] = p // K
    return src, slot, starts


@njit(cache=True, nogil=True)
def order_layout(cnt, res, strm, cpu):
    """The row order of a layout: cnt [E], the placement's three parts -> (order [n], rank [E] (-1 unrouted), off
    [E] (0 unrouted), starts [n]); the pairs' rows are expert_major's (or the device's, kernels.route_rows)."""
    E = cnt.shape[0]
    n = res.shape[0] + strm.shape[0] + cpu.shape[0]
    order = np.empty(n, np.int64)
    order[:res.shape[0]] = res
    order[res.shape[0]:res.shape[0] + strm.shape[0]] = strm
    order[res.shape[0] + strm.shape[0]:] = cpu
    rank = np.full(E, -1, np.int64)
    starts = np.empty(n, np.int64)
    off = np.zeros(E, np.int64)
    s = 0
    for i in range(n):
        e = order[i]
        rank[e] = i
        starts[i] = s
        off[e] = s
        s += cnt[e]
    return order, rank, off, starts


@njit(cache=True, nogil=True)
def tile_sums(hist, n, E):
    """The routing's counts [E] (i64) from the first n tiles of hist (flat i32 [tiles · E], kernels.route_hist's
    download): numpy's reshape and sum took ~15 us of the H200 host's window at 900 tokens (stop 45)."""
    cnt = np.zeros(E, np.int64)
    for t in range(n):
        for e in range(E):
            cnt[e] += hist[t * E + e]
    return cnt


@njit(cache=True, nogil=True)
def layout(ids, cnt, res, strm, cpu, K):
    """moe.row_layout in one call: ids [P] pairs, cnt [E], the placement's three parts -> (order [n], rank [E]
    (-1 unrouted), off [E] (0 unrouted), src [P], slot [P], starts [n]). The numpy glue around expert_major
    (concatenation, rank and offset scatters) was ~30 us a layer on the H200's host."""
    order, rank, off, starts = order_layout(cnt, res, strm, cpu)
    n = order.shape[0]
    c = np.empty(n, np.int64)
    for i in range(n):
        c[i] = cnt[order[i]]
    src, slot, _ = expert_major(ids, rank, c, K)
    return order, rank, off, src, slot, starts


@njit(cache=True, nogil=True)
def many_tile(cnt, few_rows, gemm_bm, big_bm):
    """The GEMM row tile of a launch group whose members have cnt [m] rows: big_bm when every many-row member
    (more than few_rows rows) has more than gemm_bm, so each fills gemm_grouped_mma128's 128-row block tile (the
    64-row kernel takes 0.77-0.91 of its time on experts of up to 56 rows and 1.09-1.36 from 80,
    bench/results/h200/gemm_kernel_stop44.log), else gemm_bm.
    big_bm 0: always gemm_bm."""
    if big_bm <= gemm_bm:
        return gemm_bm
    for c in cnt:
        if few_rows < c <= gemm_bm:
            return gemm_bm
    return big_bm


@njit(cache=True, nogil=True)
def group_rows(cnt, first, size, few_rows, gemm_bm, big_bm):
    """Each launch group's GEMM row tile (many_tile of its members' rows): cnt [n] rows of each position in row
    order, group g holds positions first[g] .. first[g] + size[g] - 1. -> [G] i64."""
    G = first.shape[0]
    bm = np.empty(G, np.int64)
    for g in range(G):
        bm[g] = many_tile(cnt[first[g]:first[g] + size[g]], few_rows, gemm_bm, big_bm)
    return bm


@njit(cache=True, nogil=True)
def group_tiles(cnt, starts, first, size, few_rows, rows_tile, bm):
    """Launch groups' row tiles. cnt, starts [n] rows and first row of each position in row order; group g holds
    positions first[g] .. first[g] + size[g] - 1. An expert of at most few_rows rows takes rows_tile-row tiles
    (g = its index among the group's members), the others tiles of bm[g] rows (group_rows: the group's GEMM row
    tile; g = its index among the group's many-row members); tiles never cross experts.
    -> (tiles [n_tiles, 3] i32 (g, start, end): per group its few-row tiles then its many-row ones; cut [2G + 1]:
    set 2g = group g's few-row tiles, set 2g + 1 its many-row ones, tiles[cut[s]:cut[s + 1]]; many [M] i64: the
    many-row members' indices into the groups' members concatenated; n_many [G])."""
    G = first.shape[0]
    n_t = 0
    n_m = 0
    for g in range(G):
        for p in range(first[g], first[g] + size[g]):
            c = cnt[p]
            if c <= few_rows:
                n_t += (c + rows_tile - 1) // rows_tile
            else:
                n_t += (c + bm[g] - 1) // bm[g]
                n_m += 1
    tiles = np.empty((n_t, 3), np.int32)
    cut = np.empty(2 * G + 1, np.int64)
    many = np.empty(n_m, np.int64)
    n_many = np.empty(G, np.int64)
    t = 0
    m = 0
    base = 0
    for g in range(G):
        cut[2 * g] = t
        for p in range(first[g], first[g] + size[g]):
            if cnt[p] <= few_rows:
                r, end = starts[p], starts[p] + cnt[p]
                while r < end:
                    tiles[t, 0], tiles[t, 1], tiles[t, 2] = p - first[g], r, min(r + rows_tile, end)
                    t += 1
                    r += rows_tile
        cut[2 * g + 1] = t
        j = 0
        for p in range(first[g], first[g] + size[g]):
            if cnt[p] > few_rows:
                r, end = starts[p], starts[p] + cnt[p]
                while r < end:
                    tiles[t, 0], tiles[t, 1], tiles[t, 2] = j, r, min(r + bm[g], end)
                    t += 1
                    r += bm[g]
                many[m] = base + p - first[g]
                m += 1
                j += 1
        n_many[g] = j
        base += size[g]
    cut[2 * G] = t
    return tiles, cut, many, n_many


@njit(cache=True, nogil=True)
def _up16(n):
    return (n + 15) // 16 * 16


@njit(cache=True, nogil=True)
def pack_layer(cnt, starts, first, size, idx_all, ptr0, stride, offs, few_rows, rows_tile, bm, ra, rb, out):
    """A layer's launch-group tables in CudaKernels.layer_tables' byte layout, in one pass (the whole-array numpy
    version cost ~110 us a layer on this dev box, 160-350 on the H200's host: host_breakdown_stop29.log).
    cnt, starts, first, size: group_tiles' inputs; idx_all [members]: each member's row in its group's buffer,
    the groups' members concatenated; ptr0, stride [G] u64: each group buffer's address and row stride; offs [W]
    u64: byte offsets into a blob; ra, rb: two int32 tables riding in the copy (the host layout's slot and src,
    or the device layout's off and an empty one).
    Sets: 2g = group g's members (few-row tables), 2g + 1 its many-row members. Writes into out (u8, at least
    pack_bound bytes: the staging ring's pinned bytes) [pointer tables offset-major [W, n_ptr] u64 | tiles i32
    [n_tiles, 3] | ra | rb, each 16-byte aligned] -> (bytes written; at [2G, W + 1] u64:
    each set's W pointer tables' and its tiles' byte offsets in packed; lens [2G, 2]: its pointers and tiles;
    n_many [G]; byte offsets of ra and rb)."""
    tl, cut, many, n_many = group_tiles(cnt, starts, first, size, few_rows, rows_tile, bm)
    G = first.shape[0]
    W = offs.shape[0]
    n_ptr = idx_all.shape[0] + many.shape[0]
    addr = np.empty(n_ptr, np.uint64)
    p_at = np.empty(2 * G, np.int64)
    p_len = np.empty(2 * G, np.int64)
    t_at = np.empty(2 * G, np.int64)
    t_len = np.empty(2 * G, np.int64)
    j = 0
    a = 0
    m = 0
    for g in range(G):
        p_at[2 * g] = j
        for i in range(size[g]):
            addr[j] = ptr0[g] + np.uint64(idx_all[a + i]) * stride[g]
            j += 1
        p_len[2 * g] = size[g]
        p_at[2 * g + 1] = j
        for i in range(n_many[g]):
            addr[j] = ptr0[g] + np.uint64(idx_all[many[m]]) * stride[g]
            j += 1
            m += 1
        p_len[2 * g + 1] = n_many[g]
        a += size[g]
        for h in range(2):
            t_at[2 * g + h] = cut[2 * g + h]
            t_len[2 * g + h] = cut[2 * g + h + 1] - cut[2 * g + h]
    t0 = W * n_ptr * 8
    t_end = t0 + tl.size * 4
    s_at = _up16(t_end)
    r_at = s_at + _up16(ra.size * 4)
    need = r_at + _up16(rb.size * 4)
    assert need <= out.shape[0], "pack_layer's output is smaller than pack_bound"
    packed = out[:need]
    ptrs = packed[:t0].view(np.uint64)
    for w in range(W):
        for i in range(n_ptr):
            ptrs[w * n_ptr + i] = addr[i] + offs[w]
    packed[t0:t_end].view(np.int32)[:] = tl.reshape(-1)
    packed[s_at:s_at + ra.size * 4].view(np.int32)[:] = ra.reshape(-1)
    packed[r_at:r_at + rb.size * 4].view(np.int32)[:] = rb.reshape(-1)
    at = np.empty((2 * G, W + 1), np.uint64)
    lens = np.empty((2 * G, 2), np.int64)
    for q in range(2 * G):
        for w in range(W):
            at[q, w] = 8 * (w * n_ptr + p_at[q])
        at[q, W] = t0 + 12 * t_at[q]
        lens[q, 0] = p_len[q]
        lens[q, 1] = t_len[q]
    return need, at, lens, n_many, s_at, r_at


def pack_bound(W: int, members: int, rows: int, n_ra: int, n_rb: int) -> int:
    """Bytes pack_layer may write for `members` group members of `rows` rows in all, W blob offsets and the
    riders' sizes: each member's pointers in both of its sets, a tile a row at most, the alignment pads."""
    return W * 2 * members * 8 + 12 * rows + 4 * (n_ra + n_rb) + 64


def warm() -> None:
    """Compile (or load) every function above with the argument types the engine passes (a machine's first run
    does this in a process of its own: strata/accel/cpu/warm.py). A small layer: 4 experts, 3 tokens, top-2."""
    i64, K = np.int64, 2
    cnt = np.array([3, 0, 2, 1], i64)
    res, strm, cpu = split_routed(cnt, np.array([True, False, False, True]), np.zeros(4, np.bool_))
    layout(np.array([0, 2, 0, 3, 0, 2], np.int32), cnt, res, strm, cpu, K)
    order, rank, off, starts = order_layout(cnt, res, strm, cpu)
    tile_sums(np.zeros(8, np.int32), 2, 4)
    c = cnt[order].astype(i64)
    first, size = np.zeros(1, i64), np.array([order.size], i64)
    rows = group_rows(c, first, size, 8, 64, 128)
    many_tile(c, 8, 64, 128)
    group_tiles(c, starts, first, size, 8, 8, rows)
    # the riders: the device layout's off [E] and an empty table; the host layout's slot [T, K] and src [R]
    for ra, rb in ((off.astype(np.int32), np.zeros(0, np.int32)), (np.zeros((3, K), np.int32), np.zeros(6, np.int32))):
        out = np.zeros(pack_bound(3, order.size, int(c.sum()), ra.size, rb.size), np.uint8)
        pack_layer(c, starts, first, size, np.arange(order.size, dtype=i64), np.zeros(1, np.uint64),
                   np.ones(1, np.uint64), np.zeros(3, np.uint64), 8, 8, rows, ra, rb, out)
