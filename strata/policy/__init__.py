"""Pure decisions shared by both engines and the simulator: no clocks, no numpy required (ARCHITECTURE).

env      every STRATA_* variable -> a frozen ``Config`` (the only reader of the environment)
stream   stream_all_min(), the walk, ring slots, streaming order
chooser  which streamed experts the CPU pool takes (MAXT, fewest first, llround take)
meter    the share g / (c + g) from device and CPU timings
gate     the contention gate: share only while it is faster
share    the per-layer strategy the engine asks (off / fixed); auto: the meter with or without the gate
plan     chunk size, cache loan and ring from the VRAM budget
tier     adaptive-tier admission between decode rounds
"""

from .chooser import CHOOSERS, MAXT, ChooserKind, CpuChoice, FewestFirst, llround
from .env import Config, ConfigError, Share, ShareMode, from_process
from .gate import CpuGate, GateReading
from .meter import MARGIN, PRIME_EXPERTS, PRIME_TOKENS, ShareMeter
from .plan import PLANNERS, ChunkPlan, LoanRequest, PlanError, PlannerKind, prompt_loan
from .registry import Registry
from .auto import GatedShare, MeteredShare, SizedShare, share_policy, size_class, size_class_floor  # noqa: I001 (registers them)
from .share import SHARE_POLICIES, FixedShare, LayerEnd, NoShare, SharePolicy, ShareKind, Wanted
from .stream import (
    GROUP_RESIDENT,
    ROUTED_ONLY_RING,
    IssueOrder,
    StreamWaste,
    Walk,
    ring_budget_slots,
    ring_slots,
    routed_group,
    routed_only_order,
    stream_all_min,
    resident_runs,
    stream_all_queue,
    unrouted_waste,
    walk_for,
    walk_runs,
)
from .tier import TIERS, AdaptiveTier, Move, TierKind

__all__ = [
    "CHOOSERS",
    "MAXT",
    "ChooserKind",
    "CpuChoice",
    "FewestFirst",
    "llround",
    "Config",
    "ConfigError",
    "Share",
    "ShareMode",
    "from_process",
    "CpuGate",
    "IssueOrder",
    "GateReading",
    "ShareMeter",
    "MARGIN",
    "PRIME_EXPERTS",
    "PRIME_TOKENS",
    "PLANNERS",
    "ChunkPlan",
    "LoanRequest",
    "PlanError",
    "PlannerKind",
    "prompt_loan",
    "Registry",
    "SHARE_POLICIES",
    "LayerEnd",
    "SharePolicy",
    "ShareKind",
    "Wanted",
    "share_policy",
    "ROUTED_ONLY_RING",
    "Walk",
    "ring_budget_slots",
    "ring_slots",
    "routed_group",
    "routed_only_order",
    "stream_all_min",
    "stream_all_queue",
    "unrouted_waste",
    "walk_for",
    "StreamWaste",
    "GROUP_RESIDENT",
    "resident_runs",
    "walk_runs",
    "TIERS",
    "AdaptiveTier",
    "Move",
    "TierKind",
    "GatedShare",
    "SizedShare",
    "size_class",
    "size_class_floor",
    "MeteredShare",
    "FixedShare",
    "NoShare",
]
