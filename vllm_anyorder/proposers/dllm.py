"""Diffusion LLMs (LLaDA, Dream) decoded block by block inside vLLM: ``stepwise``, ``ssd``,
``freedave``.

Adapter over :mod:`vllm_anyorder.core.dllm` (one state machine per request, three policies
that decode identically: the baseline's static stepwise schedule, SSD Algorithm 1, FreeDave
Algorithm 2). vLLM carries the request; one engine step moves it by one block:

1. vLLM's forward runs exactly one unit of rows: the prompt (prefill), then the block decoded
   in the previous step (its first token = vLLM's bonus token, the rest = this proposer's
   drafts). Block-causal attention (``attention_backends/dllm_cpu.py``) makes those rows'
   K/V final: the paged cache holds the committed prefix, written once.
2. ``observe_verification`` (the ``verification_hook`` patch, before vLLM samples) decides
   the next block: it runs the core's plan -> forward -> advance loop for every request of
   the batch in lock-step, each round ONE batched forward of all requests' nodes over the
   paged prefix (``DllmForDiffusionLM.row_logits``). Then it overwrites vLLM's logits in place
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
import zlib
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from vllm_anyorder import config, families
from vllm_anyorder.core.dllm import DllmRequest
from vllm_anyorder.core.dllm_blocks import DllmSettings, block_span
from vllm_anyorder.proposers.base import AnyOrderProposer

logger = logging.getLogger("vllm_anyorder")


@dataclass
class _State:
    req: DllmRequest
    prompt_len: int
    clean: int = 0  # positions [0, clean) hold final K/V in the paged cache
    anchor: torch.Tensor | None = None  # raw logits of row clean - 1 (logit-shift models)
    written: int = 0  # end of the rows vLLM's last forward wrote (their slots exist)
    repairs: int = 0
    steps: int = 0  # engine steps (vLLM forwards) the request took part in


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
        return _State(req, p)

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
            self._written(st, a, e, logits[row + rows - 1])
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

    def _written(self, st: _State, a: int, e: int, last_row_logits) -> None:
        """vLLM's forward wrote rows [a, e): final iff they are exactly the prompt or exactly
        one block right after the clean prefix."""
        p, s = st.prompt_len, st.req.s
        st.written = e
        unit = (a == 0 and e == p) or (
            a >= p and (a - p) % s.block_length == 0 and a - p < s.max_tokens
            and e == p + block_span(s, (a - p) // s.block_length)[1])
        if st.clean == a and unit:
            st.clean = e
            st.anchor = last_row_logits.detach().float().cpu().clone() if self.shift else None
        else:
            st.clean = min(st.clean, a)

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
            jobs = []
            for st, i, _, _ in active:
                plan = st.req.plan()
                if plan is not None:
                    jobs.append((st, i, plan))
            if jobs:
                self._repair(view, [(st, i, plan) for st, i, plan in jobs])
                for (st, _, _), lg in zip(jobs, self._evaluate(view, jobs)):
                    st.req.advance(lg)
            active = [w for w in active if self._needs(w[0], w[2], w[3])]

    # ------------------------------------------------------------------ forwards
    def _context(self, view: Any):
        table = view.block_table
        builder = view.metadata_builder()
        return table, int(table.block_size), builder

    def _cuts(self, st: _State, start: int, end: int) -> tuple[int, ...]:
        """Group ends for rows [start, end): the prompt end, then each block's end."""
        p, s = st.prompt_len, st.req.s
        cuts = [p] if start < p else []
        g = max(0, start - p)
        while p + g < end:
            g = block_span(s, g // s.block_length)[1]
            cuts.append(min(p + g, end))
        return tuple(c for c in cuts if c > start)

    def _repair(self, view: Any, jobs) -> None:
        """Rewrite, in the real cache, rows [clean, c) whose K/V vLLM wrote incompletely (a
        preempted request recomputed as one prompt): c = the last unit boundary before both
        the plan's window and the end of vLLM's rows (their slots exist)."""
        from vllm_anyorder.attention_backends.dllm_cpu import NodeJob, repair_plan

        todo = []
        for st, i, plan in jobs:
            p, lim = st.prompt_len, min(st.prompt_len + plan.window[0], st.written)
            c = p + (lim - p) // st.req.s.block_length * st.req.s.block_length if lim >= p else 0
            if st.clean < c:
                todo.append((st, i, c))
        if not todo:
            return
        table, bs, builder = self._context(view)
        blocks, device = table.get_cpu_tensor(), next(self.target.parameters()).device
        jobs, ids, pos = [], [], []
        for st, i, c in todo:
            jobs.append(NodeJob(blocks[i].to(torch.int64), st.clean, c, 1,
                                self._cuts(st, st.clean, c)))
            ids.append(torch.cat([st.req.prompt, st.req.canvas])[st.clean:c])
            pos.append(torch.arange(st.clean, c))
        plan = repair_plan(builder, jobs, bs)
        out = self.target.row_logits(torch.cat(ids).to(device), torch.cat(pos).to(device), plan)
        end = 0
        for (st, _, c), job in zip(todo, jobs):
            end += job.end - job.start
            st.clean, st.repairs = c, st.repairs + 1
            st.anchor = out[end - 1].float().cpu().clone() if self.shift else None

    def _evaluate(self, view: Any, jobs) -> list[torch.Tensor]:
        """ONE forward over every node of every job -> per job logits [n, w1 - w0, V]."""
        from vllm_anyorder.attention_backends.dllm_cpu import NodeJob, scratch_plan

        table, bs, builder = self._context(view)
        blocks, device = table.get_cpu_tensor(), next(self.target.parameters()).device
        node_jobs, ids, pos = [], [], []
        for st, i, plan in jobs:
            # rows from the clean prefix on: normally the window itself; when the window
            # starts past a decided block vLLM has not written yet (FreeDave drafting across
            # a block end), that block's rows are computed alongside (block-causal: exact)
            p, (w0, w1) = st.prompt_len, plan.window
            r0, n = min(st.clean, p + w0), plan.nodes.shape[0]
            full = torch.cat([st.req.prompt.expand(n, -1), plan.nodes], 1)
            node_jobs.append(NodeJob(blocks[i].to(torch.int64), r0, p + w1, n,
                                     self._cuts(st, r0, p + w1)))
            ids.append(full[:, r0: p + w1].reshape(-1))
            pos.append(torch.arange(r0, p + w1).repeat(n))
        caches = [layer.self_attn.attn.kv_cache for layer in self.target.layers]
        plan_rows = scratch_plan(builder, node_jobs, caches, bs)
        raw = self.target.row_logits(torch.cat(ids).to(device), torch.cat(pos).to(device),
                                     plan_rows).float().cpu()
        out, start = [], 0
        for (st, _, plan), job in zip(jobs, node_jobs):
            n, w = job.nodes, job.end - job.start
            lg = raw[start: start + n * w].view(n, w, -1)
            start += n * w
            skip = st.prompt_len + plan.window[0] - job.start  # rows before the window
            if not self.shift:
                out.append(lg[:, skip:])
            elif skip:  # row q predicts q + 1: the row before the window was computed too
                out.append(lg[:, skip - 1: -1])
            else:  # ... or it is the last clean row: its logits are kept (the anchor)
                out.append(torch.cat([st.anchor.expand(n, 1, -1), lg[:, :-1]], 1))
            if self.trace is not None:
                self.trace.append({"prompt": st.req.prompt.tolist(), "nodes": plan.nodes.clone(),
                                   "window": plan.window, "logits": out[-1].clone()})
        return out

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
                              "repairs": st.repairs})


class StepwiseProposer(DllmProposer):
    method, policy = "stepwise", "stepwise"


class SsdProposer(DllmProposer):
    method, policy = "ssd", "ssd"


class FreeDaveProposer(DllmProposer):
    method, policy = "freedave", "freedave"
