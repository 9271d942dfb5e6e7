"""The VRAM plan (SPEC §9): expert-cache slots from free VRAM, then the policy's chunk/loan plan.

free VRAM - reserve (700 MiB) - runtime context - dense weights - output head - KV - decode-only = the expert
cache, in slots of the largest blob. Prompt buffers borrow the cache's last slots (policy/plan.py).
``prompt_buffer_bytes`` counts what the prompt path allocates for a chunk (ours, after prefill.cpp's
``bytes_needed``: GEMM scratch and workspace, activations, routing, Dm, GU/H, quantised activations, slack).
"""

from __future__ import annotations

from dataclasses import dataclass

from strata.policy import PLANNERS, ChunkPlan, Config, LoanRequest, PlannerKind, prompt_loan, ring_budget_slots

from .hardware import Machine
from .models import SimModel

MIB, GIB = 2**20, 2**30
RESERVE_MIB = 700  # --vram-reserve-mib default (SPEC §9)
CONTEXT_MIB = 400  # ours: CUDA/HIP context, cuBLAS handles, graphs
DECODE_ONLY_MIB = 256  # ours: decode windows, verify buffers, sampler (released by the elastic loans)


def prompt_buffer_bytes(model: SimModel, t: int) -> int:
    s = model.shape
    rows = t * s.n_embd * 4
    pairs = t * s.n_expert_used
    per_chunk = (
        6 * rows  # residual, normed input, outputs, shared expert
        + t * s.n_expert * 4
        + pairs * 8  # router logits, ids and weights
        + pairs * s.n_embd * 4  # Dm
        + pairs * 3 * s.n_ff_exp * 4  # GU and H
        + pairs * s.n_embd * 36 // 32  # activations quantised (q8_1) in expert order
        + 2 * t * s.n_head * s.head_dim * 4
    )  # attention scratch
    return 64 * MIB + per_chunk + 8 * MIB


@dataclass(frozen=True, slots=True)
class VramPlan:
    cache_slots: int  # expert-cache slots (blobs of the largest size)
    plan: ChunkPlan  # the largest chunk, its loan and ring
    request: LoanRequest
    n_experts: int  # layers x experts
    dense_bytes: int
    kv_bytes: int

    @property
    def resident(self) -> int:
        """Experts resident while the planned (largest) layout is lent."""
        return min(self.n_experts, self.cache_slots - self.plan.loan_slots)

    def layout(self, chunk: int, ring: int) -> int:
        """Experts resident while a prompt of ``chunk`` tokens whose walk uses ``ring`` slots borrows the cache
        (policy.prompt_loan, as the engine lends)."""
        return min(self.n_experts, self.cache_slots - self.loan(chunk, ring))

    def loan(self, tokens: int, ring: int) -> int:
        """Cache slots a prompt of ``tokens`` borrows (policy.prompt_loan); the refill after it is as many."""
        return prompt_loan(self.request, self.plan, tokens, ring)[1]


def plan_vram(
    machine: Machine, model: SimModel, cfg: Config, ctx: int, cache_slots: int | None = None
) -> VramPlan:
    """``cache_slots`` fixes the cache (``--expert-cache N``); else it is sized from free VRAM."""
    dense = model.n_layer * model.dense_bytes() + model.head_bytes()
    kv = ctx * model.kv_bytes_per_token()
    lent = DECODE_ONLY_MIB * MIB if cfg.elastic_loan else 0
    if cache_slots is None:
        free = machine.gpu.vram_gib * GIB - (RESERVE_MIB + CONTEXT_MIB + DECODE_ONLY_MIB) * MIB - dense - kv
        if free <= 0:
            raise ValueError(
                f"{model.name} does not fit {machine.gpu.name}: dense weights {dense / GIB:.1f} GiB + "
                f"KV {kv / GIB:.1f} GiB ({ctx} tokens) leave {free / GIB:.1f} GiB for experts"
            )
        all_experts = model.n_layer * model.n_expert
        cache_slots = min(int(free // model.max_blob), all_experts + 4096)  # spare slots beyond every expert
    req = LoanRequest(
        cache_slots=cache_slots,
        slot_bytes=model.max_blob,
        buffer_bytes=lambda t: prompt_buffer_bytes(model, t),
        ring=ring_budget_slots(model.max_blob),
        lend_pct=cfg.lend_pct,
        lent_bytes=lent,
    )
    plan = PLANNERS.create(PlannerKind.AUTO).plan(req)
    return VramPlan(cache_slots, plan, req, model.n_layer * model.n_expert, dense, kv)
