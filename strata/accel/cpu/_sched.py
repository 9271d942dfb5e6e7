"""The pool's scheduler in Numba: tile claims, dependency groups, and the workers' spin-then-park wait.

A batch is a table of tiles (kind, job, rows, tokens, wait group, signal group) in a fixed order; threads claim
tiles in that order with a 64-bit CAS on `head = epoch << 32 | next` (a claim is valid only for the epoch the
thread woke for, so a late thread can never take a tile of the next batch: the original's issue #29). A tile
with a wait group spins until that group is ready; finishing a tile decrements its signal group, and the thread
that brings a group to zero runs the group's action (the pipeline's per-expert intermediate quantisation) and
then marks it ready. Producers always precede their dependants in the table, so a waiting thread never strands
an unclaimed producer (SPEC §10). Everything runs without the GIL; per-batch buffers arrive as addresses in
the control array `ctl`, which lets an idle worker pick up the next batch without touching Python.

Legend: J jobs, N tokens of a job (<= MAXT), D n_embd, F n_ff.
"""

from __future__ import annotations

import numpy as np
from numba import carray, njit

from strata.accel.cpu._llvm import (addr_ptr, atomic_add, atomic_cas, atomic_load, atomic_store, call_rows,
                                    call_sleep, cycles, data_addr, spin_pause)
from strata.accel.cpu.act import quantize_rows, swiglu
from strata.accel.cpu.dense import attention_heads
from strata.accel.cpu.entry import N_TYPES

# ctl: int64 control words, each on its own cache line; the mailbox holds the current batch's addresses
HEAD, DONE, EPOCH, NPARKED, HOST_PARKED, SHUTDOWN = 0, 8, 16, 24, 32, 40
PLAN, NJOBS, TILES, NTILES, GROUPS, NGROUPS = 48, 49, 50, 51, 52, 53
KFN = 56   # the address of the row kernels' C entry points by type id (entry.table_address)
SLEEPFN, DOZE_US, DOZE_TICKS = 59, 60, 61   # libc usleep's address (0: no doze), one doze, the doze window
PUB_AT, DONE_AT = 62, 63   # cycle counter when the batch was published, and when its last tile finished
CTL_WORDS = 64

# plan: one int64 row per job
(J_KIND, J_GW, J_UW, J_DW, J_GT, J_UT, J_DT, J_GROW, J_UROW, J_DROW, J_D, J_F, J_N, J_X, J_XS, J_OUT, J_OS,
 J_QXG, J_QXGROW, J_QXU, J_QXUROW, J_G, J_U, J_QH, J_QHROW, J_GAT, J_UAT, J_DAT) = range(28)
JF = 32
JOB_EXPERT, JOB_LINEAR, JOB_ATTN = 0, 1, 2

# tiles: one int64 row per tile
K_KIND, K_JOB, K_R0, K_R1, K_T0, K_T1, K_WAIT, K_SIGNAL = range(8)
TF = 8
T_QX, T_GU, T_QH, T_DOWN, T_LIN, T_ATT = 1, 2, 3, 4, 5, 6

# groups: pending count, ready flag, action on completion, its job
G_PENDING, G_READY, G_ACTION, G_JOB = range(4)
GF = 4
A_NONE, A_QH = 0, 1

ST_IDLE, ST_BLOCKED, ST_WAKE_HOST, ST_PARK, ST_EXIT = 0, 1, 2, 3, 4
WS_BYTES = 64 << 10
_MASK = (1 << 32) - 1


@njit(nogil=True, cache=True)
def _u8(addr, n):
    return carray(addr_ptr(addr), (n,), np.uint8)


@njit(nogil=True, cache=True)
def _f32(addr, n):
    return carray(addr_ptr(addr), (n,), np.float32)


@njit(nogil=True, cache=True)
def _i64(addr, n):
    return carray(addr_ptr(addr), (n,), np.int64)


@njit(nogil=True, cache=True)
def _quantize_h(plan, j, t0, t1):
    """The expert's intermediate h (in G after SwiGLU) -> the down type's vec_dot_type, tokens t0..t1."""
    n, f = plan[j, J_N], plan[j, J_F]
    g = _f32(plan[j, J_G], n * f)
    qh = _u8(plan[j, J_QH], n * plan[j, J_QHROW])
    quantize_rows(plan[j, J_DAT], g, t0 * f, f, t1 - t0, f, qh, t0 * plan[j, J_QHROW], plan[j, J_QHROW])


@njit(nogil=True, cache=True)
def _mm(ctl, qt, w, wn, wrow, r0, r1, a, an, arow, t, out, on, ostride, ws):
    """Rows r0..r1 of a weight (all buffers as addresses) through its type's C entry point (entry.ensure'd)."""
    call_rows(_i64(ctl[KFN], N_TYPES)[qt], qt, w, wn, wrow, r0, r1, a, an, arow, t, out, on, ostride,
              data_addr(ws), ws.size)


@njit(nogil=True, cache=True)
def _exec(ctl, plan, kind, j, r0, r1, t0, t1, ws):
    n, d, f = plan[j, J_N], plan[j, J_D], plan[j, J_F]
    if kind == T_QX:  # x rows t0..t1 -> the gate's (and, if different, the up's) activation type
        x = _f32(plan[j, J_X], n * plan[j, J_XS])
        qg = _u8(plan[j, J_QXG], n * plan[j, J_QXGROW])
        quantize_rows(plan[j, J_GAT], x, t0 * plan[j, J_XS], plan[j, J_XS], t1 - t0, d, qg,
                      t0 * plan[j, J_QXGROW], plan[j, J_QXGROW])
        if plan[j, J_KIND] == JOB_EXPERT and plan[j, J_QXU] != plan[j, J_QXG]:
            qu = _u8(plan[j, J_QXU], n * plan[j, J_QXUROW])
            quantize_rows(plan[j, J_UAT], x, t0 * plan[j, J_XS], plan[j, J_XS], t1 - t0, d, qu,
                          t0 * plan[j, J_QXUROW], plan[j, J_QXUROW])
    elif kind == T_GU:  # gate and up rows r0..r1 for all tokens, then h = silu(g)·u on those rows
        _mm(ctl, plan[j, J_GT], plan[j, J_GW], f * plan[j, J_GROW], plan[j, J_GROW], r0, r1, plan[j, J_QXG],
            n * plan[j, J_QXGROW], plan[j, J_QXGROW], n, plan[j, J_G], n * f, f, ws)
        _mm(ctl, plan[j, J_UT], plan[j, J_UW], f * plan[j, J_UROW], plan[j, J_UROW], r0, r1, plan[j, J_QXU],
            n * plan[j, J_QXUROW], plan[j, J_QXUROW], n, plan[j, J_U], n * f, f, ws)
        g = _f32(plan[j, J_G], n * f)
        u = _f32(plan[j, J_U], n * f)
        for t in range(n):
            swiglu(g, t * f + r0, u, t * f + r0, r1 - r0)
    elif kind == T_QH:
        _quantize_h(plan, j, t0, t1)
    elif kind == T_DOWN:  # down rows r0..r1 -> out[t, r] (unweighted expert output)
        _mm(ctl, plan[j, J_DT], plan[j, J_DW], d * plan[j, J_DROW], plan[j, J_DROW], r0, r1, plan[j, J_QH],
            n * plan[j, J_QHROW], plan[j, J_QHROW], n, plan[j, J_OUT], n * plan[j, J_OS], plan[j, J_OS], ws)
    elif kind == T_ATT:  # attention heads r0..r1 (J_F heads, J_GT kv heads, J_GROW head size, J_UT cache slots)
        hh, hkv, hd, cap = f, plan[j, J_GT], plan[j, J_GROW], plan[j, J_UT]
        q = _f32(plan[j, J_X], n * hh * hd).reshape((n, hh, hd))
        kt = _f32(plan[j, J_GW], hkv * hd * cap).reshape((hkv, hd, cap))
        v = _f32(plan[j, J_UW], hkv * cap * hd).reshape((hkv, cap, hd))
        pos = _i64(plan[j, J_DW], n)
        out = _f32(plan[j, J_OUT], n * hh * hd).reshape((n, hh * hd))
        attention_heads(q, kt, v, pos, d, r0, r1, out)
    else:  # T_LIN: a dense weight (J_F rows of J_D) on tokens t0..t1
        qrow, os = plan[j, J_QXGROW], plan[j, J_OS]
        _mm(ctl, plan[j, J_GT], plan[j, J_GW], f * plan[j, J_GROW], plan[j, J_GROW], r0, r1,
            plan[j, J_QXG] + t0 * qrow, (t1 - t0) * qrow, qrow, t1 - t0, plan[j, J_OUT] + 4 * t0 * os,
            (t1 - t0) * os, os, ws)


@njit(nogil=True, cache=True)
def _work(ctl, epoch, resume, spin_ticks):
    """Claim and run tiles of batch `epoch` until none is left. Returns (status, tile):
    (ST_IDLE, -1) nothing left (or the batch is no longer current); (ST_BLOCKED, i) tile i waited longer
    than spin_ticks on its group (call again with resume=i after yielding the CPU); (ST_WAKE_HOST, -1) this
    call finished the batch's last tile while the host thread sleeps."""
    nj, nt, ng = ctl[NJOBS], ctl[NTILES], ctl[NGROUPS]
    plan = _i64(ctl[PLAN], nj * JF).reshape((nj, JF))
    tiles = _i64(ctl[TILES], nt * TF).reshape((nt, TF))
    groups = _i64(ctl[GROUPS], max(ng, 1) * GF)
    ws = np.empty(WS_BYTES, np.uint8)   # this thread's kernel workspace for the whole batch
    status = ST_IDLE
    while True:
        if resume >= 0:
            i = resume
            resume = -1
        else:
            h = atomic_load(ctl, HEAD)
            if (h >> 32) != epoch or (h & _MASK) >= nt:
                return status, -1
            if not atomic_cas(ctl, HEAD, h, h + 1):
                continue
            i = h & _MASK
        w = tiles[i, K_WAIT]
        if w >= 0 and atomic_load(groups, w * GF + G_READY) == 0:
            c0 = cycles()
            while atomic_load(groups, w * GF + G_READY) == 0:
                spin_pause()
                if cycles() - c0 > spin_ticks:
                    return ST_BLOCKED, i
        j = tiles[i, K_JOB]
        _exec(ctl, plan, tiles[i, K_KIND], j, tiles[i, K_R0], tiles[i, K_R1], tiles[i, K_T0], tiles[i, K_T1], ws)
        s = tiles[i, K_SIGNAL]
        if s >= 0 and atomic_add(groups, s * GF + G_PENDING, -1) == 1:
            if groups[s * GF + G_ACTION] == A_QH:  # pipeline: this expert's gate/up is complete
                gj = groups[s * GF + G_JOB]
                _quantize_h(plan, gj, 0, plan[gj, J_N])
            atomic_store(groups, s * GF + G_READY, 1)
        if atomic_add(ctl, DONE, 1) + 1 == nt:
            ctl[DONE_AT] = cycles()
            if atomic_load(ctl, HOST_PARKED) != 0:
                status = ST_WAKE_HOST


@njit(nogil=True, cache=True)
def _doze(ctl, past):
    """Past the spin window, sleep one short doze inside this nogil code while `past` ticks are within the doze
    window; False once it is over (then park in Python). A parked thread needs the GIL to wake, and a prompt's
    engine thread holds it for milliseconds (Python's switch interval is 5 ms): the share's first CPU layer of
    each chunk cost 2x its GPU twin (bench/cpu_share.py, STRATA_DBG_CPU_GATE on the H200) with parked workers."""
    if ctl[SLEEPFN] == 0 or past > ctl[DOZE_TICKS]:
        return False
    call_sleep(ctl[SLEEPFN], ctl[DOZE_US])
    return True


@njit(nogil=True, cache=True)
def step(ctl, epoch, resume, spin_ticks, worker):
    """One stretch of a thread's work, without the GIL (the one compiled entry that links the kernels).
    Returns (status, epoch, tile).

    Host (worker=False): claim and run tiles of batch `epoch` (resuming tile `resume` if >= 0), then spin
    (bounded) until every tile is done -> ST_IDLE (all done), ST_BLOCKED (yield, then call again with the tile)
    or ST_PARK (the spin ran out: sleep until the last tile's thread wakes the host).
    Worker: after finishing `resume` if any, spin (bounded) for a batch newer than `epoch`, work it, and repeat;
    returns ST_PARK (idle for spin_ticks; registered in NPARKED), ST_EXIT, ST_BLOCKED or ST_WAKE_HOST."""
    if not worker:
        if epoch >= 0:   # epoch < 0: only wait (a host that takes no tiles)
            st, i = _work(ctl, epoch, resume, spin_ticks)
            if st == ST_BLOCKED:
                return st, epoch, i
        nt = ctl[NTILES]
        c0 = cycles()
        while atomic_load(ctl, DONE) < nt:
            if cycles() - c0 > spin_ticks:
                if not _doze(ctl, cycles() - c0 - spin_ticks):
                    return ST_PARK, epoch, -1
            else:
                spin_pause()
        return ST_IDLE, epoch, -1
    while True:
        if resume < 0:
            c0 = cycles()
            while True:
                if atomic_load(ctl, SHUTDOWN) != 0:
                    return ST_EXIT, epoch, -1
                e = atomic_load(ctl, EPOCH)
                if e != epoch:
                    break
                if cycles() - c0 > spin_ticks:
                    if _doze(ctl, cycles() - c0 - spin_ticks):
                        continue
                    atomic_add(ctl, NPARKED, 1)
                    if atomic_load(ctl, EPOCH) == epoch and atomic_load(ctl, SHUTDOWN) == 0:
                        return ST_PARK, epoch, -1
                    atomic_add(ctl, NPARKED, -1)  # a batch arrived while registering: take it
                    c0 = cycles()
                spin_pause()
            epoch = e
        st, i = _work(ctl, epoch, resume, spin_ticks)
        resume = -1
        if st != ST_IDLE:
            return st, epoch, i


@njit(nogil=True, cache=True)
def publish(ctl, epoch, plan_addr, njobs, tiles_addr, ntiles, groups_addr, ngroups):
    """Make a batch current: mailbox first, counters reset, then the epoch (seq_cst) that workers watch."""
    ctl[PLAN], ctl[NJOBS], ctl[TILES], ctl[NTILES] = plan_addr, njobs, tiles_addr, ntiles
    ctl[GROUPS], ctl[NGROUPS] = groups_addr, ngroups
    ctl[PUB_AT] = cycles()
    atomic_store(ctl, DONE, 0)
    atomic_store(ctl, HOST_PARKED, 0)
    atomic_store(ctl, HEAD, epoch << 32)
    atomic_store(ctl, EPOCH, epoch)
    return atomic_load(ctl, NPARKED)


@njit(nogil=True, cache=True)
def park_host(ctl, ntiles):
    """Register the host as sleeping (HOST_PARKED), then re-check: True if the batch finished meanwhile. The
    thread that finishes the last tile reads the flag after counting it, so one of the two always sees the other."""
    atomic_store(ctl, HOST_PARKED, 1)
    return atomic_load(ctl, DONE) >= ntiles


@njit(nogil=True, cache=True)
def ctl_add(ctl, idx, v):
    return atomic_add(ctl, idx, v)


@njit(nogil=True, cache=True)
def ctl_load(ctl, idx):
    return atomic_load(ctl, idx)


@njit(nogil=True, cache=True)
def ctl_store(ctl, idx, v):
    atomic_store(ctl, idx, v)


@njit(nogil=True, cache=True)
def tick_count():
    return cycles()


@njit(inline="always")
def _add(tiles, groups, k, kind, j, r0, r1, t0, t1, wait, sig):
    tiles[k, K_KIND], tiles[k, K_JOB], tiles[k, K_R0], tiles[k, K_R1] = kind, j, r0, r1
    tiles[k, K_T0], tiles[k, K_T1], tiles[k, K_WAIT], tiles[k, K_SIGNAL] = t0, t1, wait, sig
    if sig >= 0:
        groups[sig * GF + G_PENDING] += 1
    return k + 1


@njit(nogil=True, cache=True)
def build_tiles(plan, owner, gu_rows, dn_rows, pipeline):
    """The batch's tile table and groups, in claim order: [ATT][QX][GU][LIN][QH (phased)][DOWN].

    owner[j]: the job whose activation quantisation job j shares (owner[j] == j quantises);
    gu_rows[j]/dn_rows[j]: rows per GU (or LIN) and DOWN tile. Phased groups: 0 = all QX, 1 = all GU,
    2 = all QH. Pipeline groups: j = QX of owner j, J + j = GU of job j (action: quantise its h)."""
    nj = plan.shape[0]
    nt = 0
    for j in range(nj):
        n = plan[j, J_N]
        ntok = (n + 7) // 8
        rows_gu = (plan[j, J_F] + gu_rows[j] - 1) // gu_rows[j]
        if plan[j, J_KIND] == JOB_ATTN:
            nt += rows_gu
            continue
        if owner[j] == j:
            nt += ntok
        if plan[j, J_KIND] == JOB_LINEAR:
            nt += rows_gu * ntok
        else:
            nt += rows_gu + (plan[j, J_D] + dn_rows[j] - 1) // dn_rows[j] + (0 if pipeline else n)
    ng = 2 * nj if pipeline else 3
    tiles = np.full((nt, TF), -1, np.int64)
    groups = np.zeros(ng * GF, np.int64)
    k = 0

    for j in range(nj):  # attention heads: no dependencies
        if plan[j, J_KIND] == JOB_ATTN:
            for r0 in range(0, plan[j, J_F], gu_rows[j]):
                k = _add(tiles, groups, k, T_ATT, j, r0, min(plan[j, J_F], r0 + gu_rows[j]), 0, plan[j, J_N], -1, -1)
    for j in range(nj):  # QX
        if owner[j] == j and plan[j, J_KIND] != JOB_ATTN:
            for t0 in range(0, plan[j, J_N], 8):
                k = _add(tiles, groups, k, T_QX, j, 0, 0, t0, min(plan[j, J_N], t0 + 8), -1, j if pipeline else 0)
    for j in range(nj):  # GU
        if plan[j, J_KIND] == JOB_EXPERT:
            for r0 in range(0, plan[j, J_F], gu_rows[j]):
                k = _add(tiles, groups, k, T_GU, j, r0, min(plan[j, J_F], r0 + gu_rows[j]), 0, plan[j, J_N],
                        owner[j] if pipeline else 0, nj + j if pipeline else 1)
            if pipeline:
                groups[(nj + j) * GF + G_ACTION] = A_QH
                groups[(nj + j) * GF + G_JOB] = j
    for j in range(nj):  # LIN
        if plan[j, J_KIND] == JOB_LINEAR:
            for r0 in range(0, plan[j, J_F], gu_rows[j]):
                for t0 in range(0, plan[j, J_N], 8):
                    k = _add(tiles, groups, k, T_LIN, j, r0, min(plan[j, J_F], r0 + gu_rows[j]), t0, min(plan[j, J_N], t0 + 8),
                            owner[j] if pipeline else 0, -1)
    if not pipeline:  # QH per (job, token)
        for j in range(nj):
            if plan[j, J_KIND] == JOB_EXPERT:
                for t in range(plan[j, J_N]):
                    k = _add(tiles, groups, k, T_QH, j, 0, 0, t, t + 1, 1, 2)
    for j in range(nj):  # DOWN
        if plan[j, J_KIND] == JOB_EXPERT:
            for r0 in range(0, plan[j, J_D], dn_rows[j]):
                k = _add(tiles, groups, k, T_DOWN, j, r0, min(plan[j, J_D], r0 + dn_rows[j]), 0, plan[j, J_N],
                        nj + j if pipeline else 2, -1)
    for g in range(ng):
        if groups[g * GF + G_PENDING] == 0:
            groups[g * GF + G_READY] = 1
    return tiles, groups


@njit(nogil=True, cache=True)
def prepare(plan, owner, threads, base, cap, pipeline):
    """Lay out a batch's scratch (G, U, QH per expert job; quantised x per owner job; 64-byte aligned from
    address `base`, `cap` bytes) into the plan, size the tiles (about 4 per thread over a phase, 16..256 KiB of
    weights each; one head per attention tile) and build the tile table.
    Returns (bytes needed, tiles, groups); when the bytes exceed `cap` nothing is written (grow and retry)."""
    nj = plan.shape[0]
    total = 0
    for j in range(nj):
        n, k = plan[j, J_N], plan[j, J_KIND]
        if k == JOB_EXPERT:
            total += 2 * ((n * plan[j, J_F] * 4 + 63) // 64 * 64) + (n * plan[j, J_QHROW] + 63) // 64 * 64
        if owner[j] == j and k != JOB_ATTN:
            total += (n * plan[j, J_QXGROW] + 63) // 64 * 64
            if k == JOB_EXPERT and plan[j, J_UAT] != plan[j, J_GAT]:
                total += (n * plan[j, J_QXUROW] + 63) // 64 * 64
    if total > cap:
        return total, np.empty((0, TF), np.int64), np.empty(0, np.int64)
    off = base
    gu_total, dn_total = 0, 0
    for j in range(nj):
        n, k = plan[j, J_N], plan[j, J_KIND]
        if k == JOB_EXPERT:
            plan[j, J_G] = off
            off += (n * plan[j, J_F] * 4 + 63) // 64 * 64
            plan[j, J_U] = off
            off += (n * plan[j, J_F] * 4 + 63) // 64 * 64
            plan[j, J_QH] = off
            off += (n * plan[j, J_QHROW] + 63) // 64 * 64
            gu_total += (plan[j, J_GROW] + plan[j, J_UROW]) * plan[j, J_F]
            dn_total += plan[j, J_DROW] * plan[j, J_D]
        elif k == JOB_LINEAR:
            gu_total += plan[j, J_GROW] * plan[j, J_F] * ((n + 7) // 8)
        if owner[j] == j and k != JOB_ATTN:
            plan[j, J_QXG] = off
            plan[j, J_QXU] = off
            off += (n * plan[j, J_QXGROW] + 63) // 64 * 64
            if k == JOB_EXPERT and plan[j, J_UAT] != plan[j, J_GAT]:
                plan[j, J_QXU] = off
                off += (n * plan[j, J_QXUROW] + 63) // 64 * 64
    for j in range(nj):
        if owner[j] != j:
            plan[j, J_QXG] = plan[owner[j], J_QXG]
            plan[j, J_QXU] = plan[owner[j], J_QXU]
    gu_t = min(256 << 10, max(16 << 10, gu_total // (4 * threads)))
    dn_t = min(256 << 10, max(16 << 10, dn_total // (4 * threads)))
    gu_rows = np.ones(nj, np.int64)
    dn_rows = np.ones(nj, np.int64)
    for j in range(nj):
        if plan[j, J_KIND] == JOB_EXPERT:
            gu_rows[j] = max(1, gu_t // max(1, plan[j, J_GROW] + plan[j, J_UROW]))
            dn_rows[j] = max(1, dn_t // max(1, plan[j, J_DROW]))
        elif plan[j, J_KIND] == JOB_LINEAR:
            gu_rows[j] = max(1, gu_t // max(1, plan[j, J_GROW]))
    tiles, groups = build_tiles(plan, owner, gu_rows, dn_rows, pipeline)
    return total, tiles, groups


@njit(nogil=True, cache=True)
def launch(ctl, epoch, plan, owner, threads, scratch, pipeline):
    """prepare() into `scratch`, then publish the batch as `epoch`. Returns (bytes short, tiles, groups, parked
    workers): bytes short > 0 means scratch is too small and nothing was published."""
    base = data_addr(scratch)
    pad = (64 - base % 64) % 64
    total, tiles, groups = prepare(plan, owner, threads, base + pad, scratch.size - pad, pipeline)
    if total > scratch.size - pad:
        return total + 64, tiles, groups, 0
    parked = publish(ctl, epoch, data_addr(plan), plan.shape[0], data_addr(tiles), tiles.shape[0],
                     data_addr(groups), groups.size // GF)
    return 0, tiles, groups, parked
