"""This engine's layer-major prompts (policy.layer_major, strata/accel/layer_major.py) on modelled hardware: every
chunk through a layer before any goes on, each layer's routed experts copied into the cache slots the prompt does
not borrow once a prompt. The choice is the engine's own (policy.layer_major.layer_major_chunk over the simulator's
prompt buffers, sim/vram.py); the copies are the engine's admissions: the next layer's likely experts (policy.guess)
during a layer where room is left, the rest after it (the engine frees a layer's slots group by group in its last
chunk: modelled as the layer's end), and a chunk's routed experts not in yet at its routing sync. Each chunk's MoE
block is issued behind the next chunk's dense part (strata/accel/deferred.py; Run.defer_blocks): its routing sync
waits for the mark after its own dense part, and the host lays it out while the GPU computes the next one's. The
engine issues that block on a second compute stream beside the dense part (moe_block._beside, stop 40); the model's
GPU is one stream, so here the two still run one after the other. Times in µs.
"""

from __future__ import annotations

from strata.policy import Walk, walk_for
from strata.policy.layer_major import layer_major_chunk
from strata.policy.stream import unrouted_waste

from .vram import prompt_buffer_bytes
from .walks import resident_groups
from .workload import residency


class LayerMajorWalk:
    """_Runner's layer-major prompt: expects env, run, costs, result, gpu, link, pool, plan, ring, n_layer,
    session, routing, waste, resident and the shared parts (_embed, _attention, _routing_sync, _group_op, _host)."""

    def layer_major_plan(self, vp) -> tuple[int, int, bool] | None:
        """(chunk, loan, stream-all refused) as GpuEngine._layer_major chooses, or None: chunk by chunk."""
        run, m = self.run, self.run.model
        if not run.layer_major or not run.cfg.prompt_layer_major or self.mmq:
            return None
        walk = walk_for(run.cfg, run.share, min(run.prompt, self.plan.chunk), self.ring)
        refused = walk is Walk.STREAM_ALL
        if refused and (self.waste is None or self.waste.dense):
            return None
        if not refused and run.share.on:
            return None
        got = layer_major_chunk(run.prompt, self.plan.chunk, vp.cache_slots, m.max_blob, self.plan.loan_slots,
                                m.n_expert, lambda t: prompt_buffer_bytes(m, t), run.prompt * m.shape.n_embd * 4)
        return None if got is None else (*got, refused)

    def layer_major_prompt(self, chunk: int, loan: int, refused: bool, vp):
        run, m, res = self.run, self.run.model, self.result
        kept = vp.cache_slots - loan
        # resident while the prompt runs: the run's own fill where given (an engine's uniform order), else the
        # hottest pairs the kept slots hold; a trace's profile may stop short of the model's last expert
        home = [list(r) + [False] * (m.n_expert - len(r)) for r in
                (self.resident if run.residency is not None else
                 residency(self.routing.profile(), min(m.n_layer * m.n_expert, kept)))]
        spans = [(s, min(chunk, run.prompt - s)) for s in range(0, run.prompt, chunk)]
        counted = [0, 0] if refused else None
        for start, t in spans:
            res.chunks.append((start, t, Walk.LAYER_MAJOR))
            yield from self._embed(t)
        landed: dict = {}                 # (layer, expert) -> its copy's completion, while in the working set
        queue = self._lm_guess(0, chunk, home, kept, landed)
        self._lm_copies(0, queue, landed, None)
        state = {"held": {}}              # layer -> its experts resident or copied; "end": the last layer end's mark
        waiting = None                    # a chunk's MoE block issued behind the next chunk's dense part (deferred)
        for l in range(self.n_layer):
            state["held"][l] = sum(home[l]) + sum(1 for (ll, _) in landed if ll == l)
            for j, (start, t) in enumerate(spans):
                self._attention(l, start, t)
                if waiting is not None:
                    yield from self._lm_block(*waiting, spans, chunk, home, kept, landed, state, counted)
                    waiting = None
                block = (l, j, start, t, self.gpu.mark() if run.defer_blocks else None)
                if run.defer_blocks and not (l + 1 == self.n_layer and j + 1 == len(spans)):
                    waiting = block
                else:
                    yield from self._lm_block(*block, spans, chunk, home, kept, landed, state, counted)
                if j == 0 and l + 1 < self.n_layer:      # the room this layer leaves: the next one's likely experts
                    queue = self._lm_guess(l + 1, chunk, home, kept - state["held"][l], landed)
                    self._lm_copies(l + 1, queue, landed, None)
        if counted is not None:
            self.waste.note(*counted)

    def _lm_block(self, l, j, start, t, routed, spans, chunk, home, kept, landed, state, counted):
        """Chunk j's MoE block of layer l (its routing sync on `routed`, the mark after its dense part, where the
        next chunk's is queued behind); a layer's last block ends the layer: its slots the next layer's victims."""
        c = self.costs
        cnt = yield from self._routing_sync(l, start, t, routed=routed)
        if counted is not None:
            n, u = unrouted_waste(cnt, home[l])
            counted[0] += n
            counted[1] += u
        routed = [e for e in range(len(cnt)) if cnt[e] > 0]
        need = [e for e in routed if not home[l][e] and (l, e) not in landed]
        self._lm_copies(l, need, landed, state.get("end"))
        state["held"][l] += len(need)
        groups = resident_groups([int(cnt[e]) for e in routed], self.group)
        for g in groups:
            if c.by_issue:                       # the host timed by what it issues (Costs.by_issue)
                yield from self._host(c.host_group_us(self.pool.busy))
            self._group_op(l, [routed[i] for i in g], cnt, waits=[landed.get((l, routed[i])) for i in g])
        self.gpu.op(f"L{l} combine", c.combine_us(t), category="combine")
        if j + 1 == len(spans):
            end = state["end"] = self.gpu.mark()
            for key in [k for k in landed if k[0] == l]:   # this layer's slots are the next layer's victims
                del landed[key]
            if l + 1 < self.n_layer:
                self._lm_copies(l + 1, self._lm_guess(l + 1, chunk, home, kept, landed), landed, end)

    def _lm_guess(self, l: int, t: int, home, room: int, landed) -> list[int]:
        """The experts layer l likely routes in a chunk (policy.guess), not resident nor copied yet, up to `room`."""
        have = [home[l][e] or (l, e) in landed for e in range(self.run.model.n_expert)]
        return self.session.routes.guess(l, t, have, max(0, room - sum(have)))

    def _lm_copies(self, l: int, experts, landed, after) -> None:
        for e in experts:
            landed[(l, e)] = self.link.h2d(f"L{l} e{e}", self.costs.blob(l), waits=[after])
        self.result.n_streamed += len(experts)
