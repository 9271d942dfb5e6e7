"""Package data: the bundled default model (strata-tiny) and its card."""

from __future__ import annotations

import os

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = "strata-tiny.Q8_0.gguf"


def default_model_path() -> str:
    p = os.path.join(HERE, DEFAULT_MODEL)
    if not os.path.exists(p):
        raise FileNotFoundError(f"the bundled default model {DEFAULT_MODEL} is missing from {HERE}; "
                                f"pass --model FILE (or make one: python -m strata.synth --preset tiny-qwen3moe)")
    return p
