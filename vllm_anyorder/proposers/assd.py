"""``method="assd"``: an any-subset AR model (AS-ARM) drafts for itself, exactly.

Adapter for Any-Subset Speculative Decoding (Guo & Ermon, Sec. 5, Algorithm 1; App. E.4
Algorithm 2) on vLLM's left-to-right engine; the engine-free rule is ``core/assd.py``.

One round per request, n tokens decoded (the last one sampled but not yet in the cache):

1. draft (``propose``, after vLLM's bookkeeping). ``self``: ONE forward of the AS-ARM
   (``AnySubsetLlamaForCausalLM.query_logits``) writes the last token's content K/V and runs
   k query rows at positions n..n+k-1, each attending to the decoded prefix only; each draft
   is sampled independently from q_i = the request's sampling transform (temperature, top-k,
   top-p, as vLLM applies to targets) of its logits. ``ngram``: q_i from context-bigram
   counts of the decoded tokens (Alg. 2), no forward.
2. verify (vLLM's next step): the target forward over [x_{n-1}, d_1..d_k]; the query row of
   d_{i-1} gives p_i = p(x_{n+i-1} | prefix, d_<i). vLLM's rejection sampler gets q through
   the ``draft_probs`` patch: accept d_i with min(1, p_i/q_i), else sample (p_i - q_i)+; the
   bonus token comes from the last row. When every request of the batch is greedy no q is
   built: vLLM's all-greedy path compares each draft with the target's argmax and returns
   before reading q (``v1/sample/rejection_sampler.py:451-484``). Exact because each d_i was
   drawn from exactly q_i given the prefix and d_<i (``self``: independent of d_<i;
   ``ngram``: given its left neighbour) and independently of the verifier's randomness.
3. Lemma 1: q_1 and p_1 are the same conditional (prefix only), so d_1 is accepted (up to
   float rounding) and a drafting round (2 forwards) commits >= 2 tokens: with drafts only
   when at least 2 tokens remain, a request never takes more forwards than tokens.

Infill requests (``vllm_anyorder.infill``): "positions n.." are sequence indices; the
drafting forward's rotary and the bigram neighbours use the request's true positions
(``asarm_positions.request_table``), so drafts target the next masked positions.

Per-request state: bigram counts (``ngram``) and diagnostics, keyed by request id, dropped
when the request leaves the input batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch

from vllm_anyorder import _compat, config, patches
from vllm_anyorder.attention_backends.asarm_positions import lookup, request_table
from vllm_anyorder.core.assd import BigramDrafter, sample_drafts
from vllm_anyorder.proposers.base import AnyOrderProposer


@dataclass
class _Plan:
    row: int  # input-batch row
    req_id: str
    n: int  # decoded tokens (the last one not in the KV cache yet)
    budget: int  # drafts this round


class AssdProposer(AnyOrderProposer):
    method = "assd"

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        patches.apply("draft_probs")
        self.cfg = config.load(vllm_config.additional_config, "assd", k=self.max_chain)
        self.k = min(self.cfg.k, self.max_chain)
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        # same seed on every TP rank: unseeded requests draw identical drafts everywhere
        self._generator = torch.Generator().manual_seed(self.cfg.seed)
        self._bigrams: dict[str, tuple[BigramDrafter, int]] = {}
        self._handed: tuple[list[str], torch.Tensor] | None = None
        # diagnostics: per live request [forwards it took part in, tokens committed];
        # finished requests' totals (bounded); optional trace of self-drafting forwards
        self.live: dict[str, list[int]] = {}
        self.finished: deque[tuple[str, int, int]] = deque(maxlen=4096)
        self.query_forwards = 0
        self.rounds = 0  # verification steps that carried drafts, over all requests
        self.rounds_first_accepted = 0  # ... whose first draft was accepted (Lemma 1)
        self.drafted_tokens = 0  # drafts verified
        self.accepted_tokens = 0  # drafts accepted
        self._verified: dict[str, int] = {}
        self._drafted: set[str] = set()  # requests the last ``propose`` drafted for
        self.trace: list[dict] | None = None

    def observe_verification(self, view: Any, logits: Any, spec_decode_metadata: Any) -> None:
        super().observe_verification(view, logits, spec_decode_metadata)
        counts = [] if spec_decode_metadata is None else spec_decode_metadata.num_draft_tokens
        # only our drafts: vLLM pads a request joining running ones to [token, -1 x k]
        # (never accepted); that is not a drafting round
        self._verified = {r: int(c) for r, c in zip(self.batch_req_ids(), counts)
                          if c and r in self._drafted}

    def load_model(self, target_model: Any) -> None:
        super().load_model(target_model)
        if self.cfg.drafter_kind.queries_target and \
                not callable(getattr(target_model, "query_logits", None)):
            raise TypeError(
                f"assd drafter 'self' needs the AS-ARM model class (query_logits); the "
                f"engine loaded {type(target_model).__name__}")

    def _device(self) -> torch.device:
        params = getattr(self.target, "parameters", None)
        return next(params()).device if params is not None else torch.device("cpu")

    def take_draft_probs(self):
        """(req_ids, probs [R, k, V] float32) of the last ``propose`` (draft_probs patch)."""
        handed, self._handed = self._handed, None
        return handed

    # ------------------------------------------------------------------ propose
    def draft(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> list[list[int]]:
        self._handed = None
        self._drafted = set()
        req_ids = self.batch_req_ids()
        view = self.view
        chains: list[list[int]] = [[] for _ in sampled_token_ids]
        if view is None or len(req_ids) != len(sampled_token_ids):
            return chains
        limits, rows = [], []
        head = num_tokens_no_spec[: len(req_ids)]  # numpy in vLLM
        counts = head.tolist() if hasattr(head, "tolist") else [int(c) for c in head]
        live, verified, requests = self.live, self._verified, view.requests
        for row, (req_id, committed, n) in enumerate(zip(req_ids, sampled_token_ids, counts)):
            if committed:  # this request took part in the step's target forward
                stats = live.get(req_id)
                if stats is None:
                    stats = live[req_id] = [0, 0]
                stats[0] += 1
                stats[1] += len(committed)
                if verified and verified.get(req_id):
                    self.rounds += 1
                    self.rounds_first_accepted += len(committed) >= 2
                    self.drafted_tokens += verified[req_id]
                    self.accepted_tokens += len(committed) - 1
            limits.append(self._budget(requests.get(req_id), committed, n))
            rows.append((row, req_id, n))
        # the speculation budget's cap (a request capped at 0 skips the drafting forward)
        plans = [_Plan(row, req_id, n, cap) for (row, req_id, n), cap
                 in zip(rows, self.draft_caps(limits)) if cap > 0]
        in_batch = set(req_ids)
        self.drop_departed(self.live, lambda r, stats: self.finished.append((r, *stats)),
                           in_batch)
        self.drop_departed(self._bigrams, live=in_batch)
        self._verified = {}
        if plans:
            draft = self._draft_self if self.cfg.drafter_kind.queries_target \
                else self._draft_ngram
            plans, drafts, q = draft(view, plans, token_ids_cpu)
            if plans:
                start = 0
                for plan in plans:
                    chains[plan.row] = drafts[start: start + plan.budget].tolist()
                    start += plan.budget
                if q is not None:  # None: every request greedy, where vLLM reads no q
                    self._handed = ([p.req_id for p in plans], self._draft_probs(plans, q))
                self._drafted = {p.req_id for p in plans}
        return chains

    def _draft_probs(self, plans: list[_Plan], q: torch.Tensor) -> torch.Tensor:
        """q [sum budgets, V] -> [R, k, V] float32 on the target's device (vLLM's rejection
        sampler reads it there; rows past a request's budget stay zero)."""
        probs = torch.zeros(len(plans), self.k, q.shape[-1], dtype=torch.float32,
                            device=self._device())
        start = 0
        for j, plan in enumerate(plans):
            probs[j, : plan.budget] = q[start: start + plan.budget].to(probs.device)
            start += plan.budget
        return probs

    def _budget(self, state: Any, committed: list[int], n: int) -> int:
        """Drafts for a request (``state``: its CachedRequestState): at most k, inside
        max_model_len, none once it is finishing (the base class's ``draft_caps`` then cuts
        it to the tokens left less one)."""
        sp = getattr(state, "sampling_params", None)
        if not committed or sp is None:
            return 0
        out_len = n - int(state.num_prompt_tokens)
        if committed[-1] in sp.all_stop_token_ids and out_len >= (sp.min_tokens or 0):
            return 0  # the request is finishing: do not spend a drafting forward
        return max(0, min(self.k, self.max_model_len - n - 1))

    # ------------------------------------------------------------------ drafters
    @torch.inference_mode()
    def _draft_self(self, view: Any, plans: list[_Plan], token_ids_cpu):
        """Alg. 1 lines 5-8 for every planned request in one forward."""
        from vllm_anyorder.attention_backends.metadata import build_metadata, prefix_metadata
        from vllm_anyorder.model_executor.asarm_vllm import QueryPlan

        table = view.block_table
        bs = int(table.block_size)
        blocks = table.get_cpu_tensor()
        # the last decoded token's K/V go to its own slot: it must be allocated already
        plans = [p for p in plans if int(table.num_blocks_per_row[p.row]) * bs > p.n - 1]
        if not plans:
            return plans, None, None
        rows = torch.tensor([p.row for p in plans])
        last = torch.tensor([p.n - 1 for p in plans], dtype=torch.int64)
        tokens = torch.tensor([int(token_ids_cpu[p.row, p.n - 1]) for p in plans])
        slots = (blocks[rows, last // bs].to(torch.int64) * bs + last % bs)
        # rotary at true positions (an infill request's table; else the sequence index)
        tables = [request_table(view.requests[p.req_id]) for p in plans]
        last_pos = torch.cat([lookup(t, last[j: j + 1]) for j, t in enumerate(tables)])
        query_pos = torch.cat([lookup(t, torch.arange(p.n, p.n + p.budget))
                               for p, t in zip(plans, tables)])
        device = self._device()
        block_rows = blocks[rows].to(device)
        builder = view.metadata_builder()
        seq_lens = [p.n for p in plans]
        plan = QueryPlan(
            content=build_metadata(builder, [1] * len(plans), seq_lens, block_rows,
                                   slots.to(device), causal=True),
            slots=slots.to(device),
            queries=prefix_metadata(builder, [p.budget for p in plans], seq_lens, block_rows),
        )
        logits = self.target.query_logits(tokens.to(device), last_pos.to(device),
                                          query_pos.to(device), plan, self.vllm_config)
        logits = logits.float()  # [sum budgets, V], on the model's device
        self.query_forwards += 1
        for p in plans:
            self.live.setdefault(p.req_id, [0, 0])[0] += 1
        drafts, q = self._sample_drafts(view, plans, logits)
        if self.trace is not None:
            start = 0
            for p in plans:
                self.trace.append({"req_id": p.req_id,
                                   "num_prompt": int(view.requests[p.req_id].num_prompt_tokens),
                                   "prefix": token_ids_cpu[p.row, : p.n].tolist(),
                                   "logits": logits[start: start + p.budget].clone(),
                                   "drafts": drafts[start: start + p.budget].tolist()})
                start += p.budget
        return plans, drafts, q

    def _sample_drafts(self, view: Any, plans: list[_Plan], logits: torch.Tensor):
        """core.assd.sample_drafts with each request's temperature, top-k / top-p and
        generator from vLLM's sampling metadata (rows = the input batch's)."""
        md = view.sampling_metadata
        budgets = [p.budget for p in plans]
        rows = torch.tensor([p.row for p in plans]).repeat_interleave(torch.tensor(budgets))
        if _all_greedy(md):  # vLLM reads no q: build none
            return logits.argmax(-1), None
        on = logits.device
        temp = md.temperature.to(on)[rows.to(on)].float()
        top_k = md.top_k.to(on)[rows.to(on)] if md.top_k is not None else None
        top_p = md.top_p.to(on)[rows.to(on)] if md.top_p is not None else None
        gens = [md.generators.get(p.row, self._generator) for p in plans]
        return sample_drafts(logits, temp, budgets, gens,
                             lambda z: _compat.apply_top_k_top_p(z, top_k, top_p))

    def _draft_ngram(self, view: Any, plans: list[_Plan], token_ids_cpu):
        """Alg. 2: drafts from context-bigram counts (each conditioned on its left
        neighbour, decoded or drafted), q = the counts' distribution (one-hot if greedy)."""
        md = view.sampling_metadata
        all_greedy = _all_greedy(md)
        all_drafts, all_q = [], []
        for p in plans:
            drafter, seen = self._bigrams.get(p.req_id) or (BigramDrafter(self.vocab_size, {}), 0)
            # bigrams of true positions (an infill request's neighbours may be visible)
            # only the indices not folded in yet: [seen, n) decoded, [n, n + budget) drafted
            true = lookup(request_table(view.requests[p.req_id]),
                          torch.arange(seen, p.n + p.budget)).tolist()
            for i, tok in enumerate(token_ids_cpu[p.row, seen: p.n].tolist()):
                drafter.observe(true[i], tok)
            self._bigrams[p.req_id] = (drafter, p.n)
            greedy = all_greedy or float(md.temperature[p.row]) == 0
            gen = md.generators.get(p.row, self._generator)
            tokens, q = drafter.draft(true[p.n - seen:], greedy, gen, with_q=not all_greedy)
            all_drafts.append(tokens)
            if q is not None:
                all_q.append(q.float())
        return plans, torch.cat(all_drafts), torch.cat(all_q) if all_q else None


def _all_greedy(md: Any) -> bool:
    """Every request of the batch greedy (vLLM's sampling metadata): then vLLM's rejection
    sampler compares each draft with the target's argmax and reads no q
    (``v1/sample/rejection_sampler.py:451-484``), so the drafters build none."""
    return bool(md.all_greedy) or md.temperature is None
