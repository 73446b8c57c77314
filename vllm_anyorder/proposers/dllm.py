"""Diffusion LLMs (LLaDA, Dream) decoded block by block inside vLLM: ``stepwise``, ``ssd``,
``freedave``.

Adapter over :mod:`vllm_anyorder.core.dllm` (one state machine per request, three policies
that decode identically: the baseline's static stepwise schedule, SSD Algorithm 1, FreeDave
Algorithm 2). vLLM carries the request; one engine step moves it by one block:

1. vLLM's forward runs exactly one unit of rows: the prompt (prefill), then the block decoded
   in the previous step (its first token = vLLM's bonus token, the rest = this proposer's
   drafts). Block-causal attention (``attention_backends/dllm_plans.py``) makes those rows'
   K/V final: the paged cache holds the committed prefix, written once.
2. ``observe_verification`` (the ``verification_hook`` patch, before vLLM samples) decides
   the next block: it runs the core's plan -> forward -> advance loop for every request of
   the batch in lock-step, each round ONE batched forward of all requests' nodes over the
   paged prefix (``attention_backends/dllm_rows.py``: the cache bookkeeping, the repair and
   evaluation forwards through ``DllmForDiffusionLM.row_logits``; ``core.dllm.advance_all``:
   the rows every node 0 reads scored in one batch). The speculation budget caps each
   request's drafted nodes round by round (``ssd`` / ``freedave``: 0 = one node, the
   ``stepwise`` forward) and learns from each round's time and verified drafts, so on a
   machine where extra nodes cost as much as whole forwards it stops drafting (see
   ``_round``). Then it overwrites vLLM's logits in place
   with one-hot rows (0 at the decided token, -inf elsewhere): the rejection sampler accepts
   the drafts (the previous block) and emits the new block's first token. One-hot rows keep
   the choice under every sampling transform (temperature, top-k/p, penalties, bias).
3. ``propose`` returns the rest of that block as the next step's drafts.

The decisions, their randomness (keyed by seed, step and position) and the cache policy are
the core's, so ``ssd`` and ``freedave`` commit exactly the tokens ``stepwise`` commits. Rows
whose K/V were written incompletely (a preempted request recomputed as one prompt) are
rewritten by a repair forward before they are read. Per-request state is dropped when the
request leaves the input batch; a resumed request is rebuilt from its committed blocks.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from vllm_anyorder import config, families
from vllm_anyorder.core.dllm import DllmRequest, advance_all
from vllm_anyorder.attention_backends.dllm_rows import DllmRowRunner, PagedPrefix
from vllm_anyorder.core.dllm_blocks import DllmSettings, block_span
from vllm_anyorder.proposers.base import AnyOrderProposer

logger = logging.getLogger("vllm_anyorder")


@dataclass
class _State:
    req: DllmRequest
    cache: PagedPrefix  # what the paged cache holds for it (attention_backends/dllm_rows.py)
    steps: int = 0  # engine steps (vLLM forwards) the request took part in

    @property
    def prompt_len(self) -> int:
        return self.cache.prompt_len


class DllmProposer(AnyOrderProposer):
    method = ""
    policy = ""  # core.dllm_blocks.METHODS

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.cfg = config.load(vllm_config.additional_config, self.method)
        shape = families.dllm_shape_of(vllm_config.model_config.hf_config)
        if shape is None:
            raise TypeError(f"method '{self.method}' needs a LLaDA or Dream model")
        self.mask_id, self.eos_id, self.shift = shape
        self.states: dict[str, _State] = {}
        self.finished: deque[dict] = deque(maxlen=4096)  # per-request counters (diagnostics)
        self.trace: list[dict] | None = None  # tests: the logits of every evaluated plan

    def load_model(self, target_model: Any) -> None:
        super().load_model(target_model)
        if not callable(getattr(target_model, "row_logits", None)):
            raise TypeError(f"method '{self.method}' needs the plugin's dLLM model class; the "
                            f"engine loaded {type(target_model).__name__}")
        self.rows = DllmRowRunner(target_model, self.shift)

    # ------------------------------------------------------------------ settings
    def _settings(self, sp: Any, prompt_len: int) -> DllmSettings:
        c = self.cfg
        max_tokens = sp.max_tokens if sp.max_tokens is not None else self.max_model_len
        eos = None if sp.ignore_eos else getattr(sp, "eos_token_id", None)
        return DllmSettings(
            mask_id=self.mask_id,
            max_tokens=max(1, min(max_tokens, self.max_model_len - prompt_len)),
            block_length=c.block_length, steps_per_block=c.steps,
            temperature=float(sp.temperature or 0.0), remasking=c.remasking,
            eos_id=eos if eos != self.mask_id else None, method=self.policy,
            draft_length=getattr(c, "draft_length", 4), mix_order=getattr(c, "mix_order", False),
            draft_steps=getattr(c, "draft_steps", 4),
            lookahead_blocks=getattr(c, "lookahead_blocks", 1))

    def _new_state(self, view: Any, req_id: str, row: int, n: int) -> _State:
        rs = view.requests[req_id]
        p = int(rs.num_prompt_tokens)
        tokens = view.token_ids_cpu[row]
        sp = rs.sampling_params
        # unseeded requests: a seed from the request id, identical on every TP rank
        seed = sp.seed if sp.seed is not None else zlib.crc32(req_id.encode())
        req = DllmRequest(tokens[:p].tolist(), self._settings(sp, p), seed)
        outputs = tokens[p:n].tolist()
        if outputs:  # resumed after preemption: keep the committed blocks, redo the last one
            full = len(outputs) // req.s.block_length * req.s.block_length
            req.canvas[:full] = torch.tensor(outputs[:full])
            while req.i < len(req.steps) and req.steps[req.i].block * req.s.block_length < full:
                req.i += 1
        return _State(req, PagedPrefix(p))

    # ------------------------------------------------------------------ the hook
    def observe_verification(self, view: Any, logits: Any, spec_decode_metadata: Any) -> None:
        super().observe_verification(view, logits, spec_decode_metadata)
        req_ids = self.batch_req_ids()
        sdm = spec_decode_metadata
        counts = [0] * len(req_ids) if sdm is None else [int(c) for c in sdm.num_draft_tokens]
        if len(counts) != len(req_ids) or sum(counts) + len(counts) != logits.shape[0]:
            raise RuntimeError("dllm: unexpected logits layout; cannot decode this step")
        work, row = [], 0
        for i, req_id in enumerate(req_ids):
            rows = counts[i] + 1
            n = int(view.num_tokens_no_spec[i])
            a, e = int(view.num_computed_tokens[i]), n + counts[i]
            st = self.states.get(req_id)
            if st is None:
                st = self.states[req_id] = self._new_state(view, req_id, i, n)
            st.steps += 1
            st.cache.observe_write(a, e, st.req.s, logits[row + rows - 1], self.shift)
            work.append((st, i, row, rows, e))
            row += rows
        self._decide(view, [(st, i, e - rows + 1, e) for st, i, _, rows, e in work])
        logits.fill_(float("-inf"))
        for st, _, row, rows, e in work:
            s, p = st.req.s, st.prompt_len
            for r in range(rows):
                g = e - rows + r + 1 - p  # generated index this row commits
                tok = int(st.req.canvas[g]) if 0 <= g < s.max_tokens else (s.eos_id or 0)
                logits[row + r, tok if tok != self.mask_id else (s.eos_id or 0)] = 0.0

    def _needs(self, st: _State, lo: int, hi: int) -> bool:
        """Whether a token this step commits (positions lo..hi) or the rest of the bonus
        token's block (the next step's drafts) is still undecided."""
        req, p = st.req, st.prompt_len
        g0, g1 = max(0, lo - p), min(hi - p, req.s.max_tokens - 1)
        if g1 >= 0:
            g1 = block_span(req.s, g1 // req.s.block_length)[1] - 1
        return not req.finished and g1 >= g0 and \
            bool((req.canvas[g0: g1 + 1] == req.s.mask_id).any())

    @torch.inference_mode()
    def _decide(self, view: Any, work: list[tuple[_State, int, int, int]]) -> None:
        """Lock-step rounds over every request with undecided tokens to commit (each round
        one batched forward of all their plans' nodes)."""
        active = [w for w in work if self._needs(w[0], w[2], w[3])]
        while active:
            self._round(view, [(st, i) for st, i, _, _ in active])
            active = [w for w in active if self._needs(w[0], w[2], w[3])]

    def _round(self, view: Any, active: list[tuple[_State, int]]) -> None:
        """One round: every request's plan within its budget cap, ONE batched forward of all
        their nodes, the decisions. The budget (not for ``stepwise``, which never drafts) sees
        the round as a step: rows = node 0 of each request + its drafted steps, its wall time
        (plans, repair, forward, decisions; rank 0's under TP), and per request the drafted
        steps and how many of them the baseline walk accepted (steps moved - 1)."""
        ids = self.batch_req_ids()
        budgeted = self.policy != "stepwise"
        caps = self.budget.caps([ids[i] for _, i in active],
                                [st.req.draft_room() for st, _ in active]) \
            if budgeted else [None] * len(active)
        start, repairs = time.perf_counter(), sum(st.cache.repairs for st, _ in active)
        jobs = []
        for (st, i), cap in zip(active, caps):
            before = st.req.i
            plan = st.req.plan(cap)
            if plan is not None:
                jobs.append((st, i, plan, before))
        if not jobs:
            return
        row_jobs = [(st.cache, st.req, i, plan) for st, i, plan, _ in jobs]
        self.rows.repair(view, row_jobs)
        logits = self.rows.evaluate(view, row_jobs)
        if self.trace is not None:
            self.trace += [{"prompt": st.req.prompt.tolist(), "nodes": plan.nodes.clone(),
                            "window": plan.window, "logits": lg.float()}
                           for (st, _, plan, _), lg in zip(jobs, logits)]
        advance_all([(st.req, lg) for (st, _, _, _), lg in zip(jobs, logits)])
        if budgeted and self.budget.measuring():
            seconds = time.perf_counter() - start
            clean = sum(st.cache.repairs for st, _ in active) == repairs
            outcomes = [(ids[i], plan.drafted, max(0, min(st.req.i - before - 1, plan.drafted)))
                        for st, i, plan, before in jobs]
            drafted = sum(k for _, k, _ in outcomes)
            self.budget.round_done(ids, len(jobs) + drafted, drafted > 0, clean, seconds,
                                   outcomes)

    # ------------------------------------------------------------------ drafts
    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                slot_mappings=None) -> list[list[int]]:
        req_ids = self.batch_req_ids()
        chains: list[list[int]] = [[] for _ in sampled_token_ids]
        for i, req_id in enumerate(req_ids[: len(sampled_token_ids)]):
            st = self.states.get(req_id)
            if st is None or not sampled_token_ids[i]:
                continue
            n, s = int(num_tokens_no_spec[i]), st.req.s
            g0 = n - 1 - st.prompt_len  # the bonus token (first row of the next unit)
            if g0 < 0 or g0 >= s.max_tokens:
                continue
            end = min(block_span(s, g0 // s.block_length)[1], self.max_model_len - st.prompt_len)
            rest = st.req.canvas[g0 + 1: end].tolist()
            chains[i] = rest[: rest.index(self.mask_id)] if self.mask_id in rest else rest
        self.drop_departed(self.states, self._record_finished)
        return chains

    def _record_finished(self, req_id: str, st: _State) -> None:
        self.finished.append({"req_id": req_id, "prompt_len": st.prompt_len,
                              "max_tokens": st.req.s.max_tokens,
                              "temperature": st.req.s.temperature, "steps": st.steps,
                              "forwards": st.req.forwards, "nodes": st.req.nodes,
                              "repairs": st.cache.repairs})


class StepwiseProposer(DllmProposer):
    method, policy = "stepwise", "stepwise"


class SsdProposer(DllmProposer):
    method, policy = "ssd", "ssd"


class FreeDaveProposer(DllmProposer):
    method, policy = "freedave", "freedave"
