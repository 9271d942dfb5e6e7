"""How close two engines' logits are: the tolerances' measures (README's numerics contract; docs/NUMERICS.md).

KL(p || q) of the softmaxes, in float64, and top-1 agreement where the reference's top two logits lie further apart
than `tie` (a near-tie's order is within rounding and is excluded, and counted).
"""

from __future__ import annotations

import numpy as np


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def kl(p_logits, q_logits):
    """KL(softmax(p) || softmax(q)) over the last axis."""
    lp, lq = _log_softmax(p_logits), _log_softmax(q_logits)
    return (np.exp(lp) * (lp - lq)).sum(-1)


def top1_agreement(ref, got, tie=1e-3):
    """(share of rows [N, V] whose argmax agrees, among those whose reference top two differ by more than tie;
    the near-ties excluded)."""
    s = np.sort(ref, axis=-1)
    clear = (s[:, -1] - s[:, -2]) > tie
    agree = ref.argmax(-1) == got.argmax(-1)
    return float(agree[clear].mean()) if clear.any() else 1.0, int((~clear).sum())
