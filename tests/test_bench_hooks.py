"""The CUDA-only diagnostics in bench/ (prefill_timeline.py, host_profile.py, ...) wrap the engine's methods by
name and never run in CI: every engine class attribute a bench script names must exist (stop 21's IssueOrder
refactor removed Walk._issue_run, which bench/prefill_timeline.py still wrapped until stop 22)."""

import importlib
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"
MODULES = ("strata.accel.stream", "strata.accel.moe", "strata.accel.engine", "strata.accel.moe_block",
           "strata.accel.prompt_graph", "strata.accel.cpu_block",
           "strata.accel.cache", "strata.accel.cpu.pool", "strata.accel.arena", "strata.accel.gpu.cuda_kernels",
           "strata.accel.decode_graph", "strata.accel.dense")
NAMED = re.compile(r"\b([A-Z]\w+)\.([A-Za-z_]\w*)\b")


def _classes() -> dict:
    out = {}
    for name in MODULES:
        m = importlib.import_module(name)
        for k, v in vars(m).items():
            if isinstance(v, type) and v.__module__ == name:
                out[k] = v
    return out


def test_every_engine_attribute_a_bench_script_names_exists():
    classes = _classes()
    assert {"Walk", "Ring", "GpuEngine", "ExpertRunner", "CpuBlock"} <= set(classes)
    missing = []
    for f in sorted(BENCH.glob("*.py")):
        code = "\n".join(line.split("#", 1)[0] for line in f.read_text().splitlines())   # names in comments aside
        for cls, attr in NAMED.findall(code):
            if cls in classes and not hasattr(classes[cls], attr):
                missing.append(f"{f.name}: {cls}.{attr}")
    assert not missing, missing
