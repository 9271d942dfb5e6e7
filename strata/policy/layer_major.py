"""A prompt of several chunks run layer by layer (ours; SPEC §3 runs chunk by chunk): every chunk through layer 0,
then every chunk through layer 1, and so on, with each layer's routed experts admitted into the expert cache for
the whole layer, so that an expert streams at most once a prompt instead of once a chunk.

Chunk by chunk, a chunk's routed-only walk streams what that chunk routes in every layer, and the next chunk streams
most of it again: qwen3-30b-a3b's quarter cache streamed 6.0 GB for an 8K prompt (7 chunks) whose layers route
1.3 GB of distinct non-resident experts (bench/results/h200/prefill_q8_stop36.log, chunk_routing_q8_stop28.log).
Layer by layer, the cache slots the prompt does not borrow hold one layer's experts at a time: that needs room for
a whole layer (kept slots >= E) and, in the borrowed region, every chunk's residual stream [T, D] f32 beside one
chunk's step buffers. The arithmetic of each (layer, chunk) is the chunk-by-chunk engine's, so the bits are too.

Legend: T prompt tokens, D hidden, E experts a layer, L layers.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from .plan import GRID


def layer_major_chunk(tokens: int, chunk: int, slots: int, slot_bytes: int, max_loan: int, n_expert: int,
                      buffer_bytes: Callable[[int], int], state_bytes: int,
                      owned_bytes: int | None = None) -> tuple[int, int] | None:
    """(chunk, loan slots) of a prompt of `tokens` run layer by layer, or None where it does not qualify: one
    chunk's worth of tokens (nothing to share between chunks), or no chunk size whose step buffers
    (`buffer_bytes(t)`) and the prompt's residual streams (`state_bytes`) fit the loan while the cache keeps a
    whole layer (`slots` - loan >= `n_expert`). `owned_bytes`: the prompt owns a region of that size instead of
    borrowing (the cache keeps every slot). The fewest chunks of equal size, none past the plan's `chunk` (the size
    the step temporaries are priced at): each chunk dequantises its layer's routed experts again. Down to GRID
    tokens a chunk (or the first equal size, where the plan's chunk is smaller than GRID)."""
    if tokens <= chunk:
        return None

    def loan_for(t: int) -> int | None:
        need = buffer_bytes(t) + state_bytes
        if owned_bytes is not None:
            return 0 if need <= owned_bytes and slots >= n_expert else None
        loan = -(-need // slot_bytes)
        return loan if loan <= max_loan and slots - loan >= n_expert else None

    n0 = n = -(-tokens // chunk)
    while (t := -(-tokens // n)) >= min(GRID, chunk) or n == n0:
        loan = loan_for(t)
        if loan is not None:
            return t, loan
        n += 1
    return None


def victims(owner_layers: Sequence[int] | np.ndarray, layer: int, protect: Collection[int],
            ready: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
    """The cache slots that may take `layer`'s experts, best first: owner_layers[s] is the layer whose expert slot s
    holds (-1: none). Empty slots first; then those of layers already run (nothing reads them again in this prompt),
    in the order they come free (`ready[s]`: when slot s's last reader ends, in any increasing units; default: its
    layer), so that the copies that must wait go last; then those of layers still to come, the farthest first (the
    next layer's, likely prefetched, last). Never a layer in `protect` (the layer being run, and the one being
    prefetched)."""
    own = np.asarray(owner_layers, np.int64)
    done = (own >= 0) & (own < layer)
    rd = own if ready is None else np.asarray(ready, np.int64)
    top = int(max(rd[done].max(initial=0), own.max(initial=0))) + 2
    key = np.where(own < 0, -1, np.where(done, rd, 2 * top - own))                    # ascending = better
    bad = np.isin(own, np.fromiter(protect, np.int64, len(protect))) & (own >= 0)
    order = np.argsort(key, kind="stable")
    return order[~bad[order]]
