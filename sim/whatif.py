"""``python -m sim whatif``: what this model would do on a machine, per CPU-share setting.

For each setting (off, a fixed share, auto): the predicted prompt time and speed, the share auto settles on,
the gate's decisions, the chunk plan, the decode estimate, a recommendation; and a plot of prompt time against
prompt length for the settings.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from strata.policy import Config

from .costs import Costs
from .decode import DecodeEstimate, decode_estimate
from .engine import Result, Run, prefill
from .hardware import Machine
from .models import SimModel
from .vram import plan_vram
from .workload import ZipfRouting, residency

PLOT_LENGTHS = (128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


def setting_config(setting: str, base: Config = Config()) -> Config:
    """'off' -> 0, 'auto' -> auto, 'default' -> unset, a number -> a fixed share."""
    if setting == "off":
        return replace(base, cpu_share=0.0)
    if setting == "default":
        return replace(base, cpu_share=None)
    if setting == "auto":
        return replace(base, cpu_share="auto")
    x = float(setting)
    assert 0.0 <= x <= 1.0, f"a fixed share is in [0, 1], got {setting}"
    return replace(base, cpu_share=min(1.0, x))


@dataclass
class WhatIf:
    machine: Machine
    model: SimModel
    prompt: int
    results: dict[str, Result]
    decode: DecodeEstimate
    curves: dict[str, list[tuple[int, float]]]

    def best(self) -> str:
        return min(self.results, key=lambda k: self.results[k].prompt_ms)

    def report(self) -> str:
        m, r0 = self.machine, next(iter(self.results.values()))
        vp = r0.vram
        lines = [
            f"machine  {m.name}: {m.gpu.name} {m.gpu.vram_gib:g} GiB, {m.cpu.name} ({m.cpu.cores} cores, "
            f"{m.cpu.isa}), PCIe {m.link.pcie_gen}.0 x{m.link.lanes} {m.link.h2d_gbps:g} GB/s, "
            f"host issue {m.host_issue_us:g} us/expert",
            f"model    {self.model.name}: {self.model.n_layer} layers x {self.model.n_expert} experts "
            f"(top-{self.model.k}), blob {self.model.max_blob / 2**20:.2f} MiB",
            f"plan     cache {vp.cache_slots} slots; largest chunk {vp.plan.chunk} tokens (loan "
            f"{vp.plan.loan_slots} slots, ring {vp.plan.ring}); this prompt: {r0.resident} of "
            f"{vp.n_experts} experts resident",
            *self._ram_warning(),
            f"prompt   {self.prompt} tokens",
            f"{'setting':>9} {'prompt ms':>10} {'tok/s':>8} {'vs off':>7} {'walk':>11} {'CPU exp':>8} "
            f"{'share':>6} {'shared layers':>14} {'host us/exp':>11}",
        ]
        off = self.results.get("off")
        for name, r in self.results.items():
            walk = ",".join(sorted({w.value for _, _, w in r.chunks}))
            shared = sum(1 for s in r.layer_shares if s > 0)
            share = (
                f"{r.final_share:.2f}"
                if r.final_share is not None
                else (f"{float(name):.2f}" if _num(name) else "-")
            )
            vs = f"{100 * (r.prompt_ms / off.prompt_ms - 1):+.1f}%" if off else ""
            lines.append(
                f"{name:>9} {r.prompt_ms:10.1f} {r.tok_s:8.1f} {vs:>7} {walk:>11} {r.n_cpu:8d} "
                f"{share:>6} {shared:>7}/{len(r.layer_shares):<6} {r.host_us_per_streamed:11.1f}"
            )
        auto = self.results.get("auto")
        if auto and auto.readings:
            g = auto.readings[-1]
            lines.append(f"gate     {len(auto.readings)} readings, last: {g.line()}")
        d = self.decode
        lines.append(
            f"decode   ~{d.tok_s:.1f} tok/s (hit rate {d.hit_rate:.0%}, PCIe share of misses "
            f"{d.pcie_frac:.0%}; the same for every setting)"
        )
        best = self.best()
        if off and best != "off":
            gain = 100 * (1 - self.results[best].prompt_ms / off.prompt_ms)
            lines.append(f"advice   {best}: {gain:.1f}% faster than off at {self.prompt} tokens")
        else:
            lines.append("advice   off: sharing does not pay here (STRATA_PREFILL_CPU_SHARE=0)")
        return "\n".join(lines)

    def _ram_warning(self) -> list[str]:
        m, mod = self.machine, self.model
        experts = sum(mod.blob_bytes(l) for l in range(mod.n_layer)) * mod.n_expert
        if experts <= 0.9 * m.ram_gib * 2**30:
            return []
        return [
            f"warning  the experts ({experts / 2**30:.0f} GiB) exceed 90% of {m.ram_gib:g} GiB RAM: the "
            f"arena would spill to SSD, which this model does not simulate (it assumes every blob in RAM)"
        ]

    def plot(self, path: str) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
        styles = ("-", "-", "-", "--", ":")  # "default" overlaps auto below 1,024 and off above: dashed
        for (name, pts), ls in zip(self.curves.items(), styles):
            ax.plot(
                [p for p, _ in pts],
                [ms for _, ms in pts],
                marker="o",
                markersize=4,
                linestyle=ls,
                label=f"share {name}",
            )
        cfg_auto = setting_config("auto")
        for x, what in (
            (1024, "off/default: stream-all from 1,024"),
            (cfg_auto.share_max(cfg_auto.share(True)), "auto: stream-all from 3,072"),
        ):
            ax.axvline(x, color="grey", linestyle=":", linewidth=1)
            ax.text(x, ax.get_ylim()[1], " " + what, fontsize=7, color="grey", va="top", rotation=90)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel("prompt time (ms)")
        ax.set_title(f"{self.model.name} on {self.machine.name} (simulated)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def _num(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def whatif(
    machine: Machine,
    model: SimModel,
    prompt: int,
    settings=("off", "0.5", "auto"),
    ctx: int = 8192,
    cache_slots: int | None = None,
    lengths=PLOT_LENGTHS,
    seed: int = 0,
) -> WhatIf:
    qualifies = machine.gpu.api == "cuda"
    base = Run(machine, model, prompt, qualifies=qualifies, ctx=ctx, cache_slots=cache_slots, seed=seed)
    results = {s: prefill(replace(base, cfg=setting_config(s))) for s in settings}
    curves = (
        {
            s: [(n, prefill(replace(base, prompt=n, cfg=setting_config(s))).prompt_ms) for n in lengths]
            for s in settings
        }
        if lengths
        else {}
    )
    vp = plan_vram(machine, model, Config(), ctx, cache_slots)
    routing = ZipfRouting(model.n_layer, model.n_expert, model.k, seed=seed)
    after = residency(routing.profile(), min(vp.cache_slots, model.n_layer * model.n_expert))
    graph = qualifies and Config().decode_graph       # the engine's default decode on CUDA: one graph a token
    dec = decode_estimate(Costs(machine, model), routing.profile(), after, ctx, pcie_only=graph)
    return WhatIf(machine, model, prompt, results, dec, curves)
