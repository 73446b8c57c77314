"""``method="jacobi"``: the target drafts for itself from its last verification.

Adapter over :mod:`vllm_anyorder.core.jacobi` (pcLLM / Jacobi Forcing, Algorithm 1). Per
step: ``observe_verification`` records, per request, the drafts vLLM verified and the target
argmax at each of their ``k+1`` rows; ``propose`` folds them with the committed tokens into the
request's :class:`JacobiState` and returns the next chain. No draft model is loaded.

A request the budget keeps plain costs nothing per step: a step without drafts computes no
argmax, and the state of a request that neither had nor gets drafts is left alone; when it
drafts again, the plain tokens committed meanwhile are folded in (``JacobiState.catch_up``,
exactly the per-step updates it skipped), so re-enabling drafts loses nothing.
"""

from __future__ import annotations

from typing import Any

from vllm_anyorder import config
from vllm_anyorder.core.jacobi import JacobiSettings, JacobiState
from vllm_anyorder.core.jacobi_refined import RefinedPositions
from vllm_anyorder.proposers.base import AnyOrderProposer

# plain tokens a lagging state folds in one by one; a longer plain stretch restarts it from the
# committed text (cheaper, and only the rejected-tail pool is lost: drafting did not pay then)
CATCH_UP_MAX = 64


class JacobiProposer(AnyOrderProposer):
    method = "jacobi"
    budget_counting = RefinedPositions  # an iterate is refined only where it was verified

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        cfg = config.load(vllm_config.additional_config, "jacobi", block_size=self.max_chain)
        self.settings = JacobiSettings(
            block_size=cfg.block_size,
            max_blocks=cfg.num_blocks,
            pool_size=cfg.pool_size,
            spawn_ratio=cfg.spawn_ratio,
            max_chain=self.max_chain,
            recycle=cfg.recycle,
        )
        self.step_drafts = cfg.step_drafts
        self._states: dict[str, JacobiState] = {}
        self._verified: dict[str, tuple[list[int], list[int]]] = {}

    @property
    def live_request_ids(self) -> list[str]:
        """Requests holding Jacobi state (diagnostics and tests)."""
        return sorted(self._states)

    def observe_verification(self, view: Any, logits: Any, spec_decode_metadata: Any) -> None:
        """Split the verification rows per request: drafts [k] and argmax [k+1]."""
        super().observe_verification(view, logits, spec_decode_metadata)
        req_ids = self.batch_req_ids()
        if spec_decode_metadata is None:
            # no request had drafts: a plain step, whose argmax no state reads (a step without
            # drafts refines no position); skipping it keeps plain steps as cheap as vLLM's
            self._verified = _AllPlain(req_ids)
            return
        # [sum(k_i + 1)]; argmax in fp32: exact (bf16 -> fp32 is lossless, ties keep the first
        # index) and on CPU 5x cheaper than torch's bf16 argmax (0.19 vs 0.90 ms for 136 x 4096)
        greedy = logits.float().argmax(dim=-1).tolist()
        counts = list(spec_decode_metadata.num_draft_tokens)
        drafts = spec_decode_metadata.draft_token_ids.tolist()
        self._verified = {}
        if len(counts) != len(req_ids) or sum(counts) + len(counts) != len(greedy):
            return  # unexpected layout: drop this step's observation (states restart)
        row = d = 0
        for req_id, k in zip(req_ids, counts):
            self._verified[req_id] = (drafts[d : d + k], greedy[row : row + k + 1])
            row, d = row + k + 1, d + k

    def draft(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> list[list[int]]:
        req_ids = self.batch_req_ids()
        if len(req_ids) != len(sampled_token_ids):
            return [[] for _ in sampled_token_ids]
        per_request = self._per_request_cap(sum(1 for c in sampled_token_ids if c))
        # partial prefill chunks and discarded requests (nothing sampled) draft nothing
        limits = [min(per_request, self.max_model_len - int(n)) if committed else 0
                  for committed, n in zip(sampled_token_ids, num_tokens_no_spec)]
        # the budget may cut a chain to any length, 0 included: the state keeps its whole
        # iterate (and its pools) warm, and a shorter chain is verified exactly the same way
        caps = self.draft_caps(limits)
        chains: list[list[int]] = [[] for _ in req_ids]
        live = set(req_ids)
        # plain before and after for every request, each with its state: all of them wait for
        # ``catch_up``, so the loop below would skip each one (issue 22: plain steps' cost)
        all_waiting = isinstance(self._verified, _AllPlain) and not any(caps) and \
            self._verified.req_ids == req_ids and self._states.keys() >= live
        for i, (req_id, cap) in enumerate([] if all_waiting else zip(req_ids, caps)):
            committed = sampled_token_ids[i]
            if not committed:
                continue
            seen = self._verified.get(req_id)
            if not cap and seen is not None and not seen[0] and req_id in self._states:
                continue  # plain for this request now and next: its state catches up later
            n_ctx = int(num_tokens_no_spec[i])
            state = self._advance(req_id, list(committed), n_ctx, token_ids_cpu[i])
            if state is None:
                state = JacobiState(self.settings, token_ids_cpu[i, :n_ctx].tolist())
                self._states[req_id] = state
            if cap > 0:
                chains[i] = state.next_chain(cap)
                if isinstance(self.budget.counting, RefinedPositions):
                    self.budget.counting.drafted(req_id, state.spliced)
        self.drop_departed(self._states, live=live)  # finished, aborted or preempted
        self._verified = {}
        return chains

    def _per_request_cap(self, drafting: int) -> int:
        """Chain cap when ``step_drafts`` bounds the drafts verified per step: an even share
        (at least 1) for each of the ``drafting`` requests. On hardware where verification
        rows cost real compute (2 CPU cores) a batch of full chains costs more than it saves;
        the state keeps its iterate beyond the cap, so nothing is lost between steps."""
        if not self.step_drafts or not drafting:
            return self.max_chain
        return max(1, self.step_drafts // drafting)

    def _advance(self, req_id: str, committed: list[int], n_ctx: int,
                 token_ids: Any) -> JacobiState | None:
        """Fold this step into the request's state; None if it must (re)start.

        A step without drafts for the request leaves its state untouched while the budget
        gives it none (``draft``); the plain tokens committed meanwhile are folded in here,
        one plain step each (``JacobiState.catch_up``), from the runner's token row."""
        state, seen = self._states.get(req_id), self._verified.get(req_id)
        if state is None or seen is None:
            return None
        drafts, greedy = seen
        if len(committed) - 1 > len(drafts):
            return None
        if not drafts:  # plain step(s) since the state last moved
            lag = n_ctx - state.base
            if not len(committed) <= lag <= CATCH_UP_MAX or \
                    token_ids[n_ctx - len(committed) : n_ctx].tolist() != committed:
                return None
            state.catch_up(token_ids[state.base : n_ctx].tolist())
            return state
        if state.base + len(committed) != n_ctx:
            return None
        state.advance(drafts, greedy, committed)
        return state


class _AllPlain:
    """``JacobiProposer._verified`` after a step in which no request had drafts: every
    request of ``req_ids`` verified nothing (no drafts, no argmax), without a dict per step."""

    __slots__ = ("req_ids", "_ids")
    _NOTHING = ((), None)  # immutable: one value shared by every request

    def __init__(self, req_ids: list[str]) -> None:
        self.req_ids = req_ids
        self._ids: set[str] | None = None  # built only if asked

    def get(self, req_id: str):
        if self._ids is None:
            self._ids = set(self.req_ids)
        return self._NOTHING if req_id in self._ids else None
