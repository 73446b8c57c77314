"""Shared shape of every anyorder proposer (the ``custom_class`` contract of vLLM 0.32).

vLLM builds the proposer in each worker as ``Class(vllm_config)`` (``custom_class_proposer``),
calls ``load_model(target_model)`` (mandatory on the CPU runner) and, after each step's
bookkeeping, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)`` with
request-major lists in the runner's input-batch order. Through the ``verification_hook``
patch the proposer first sees the logits of every verified row and the step's
:class:`~vllm_anyorder.contract.RunnerView` (``observe_verification``); it reads the batch
only through that view (``self.view``), never through vLLM's runner.

Per-request state is keyed by request id and lives only while the request is in the input
batch: a request that finished, was aborted or preempted leaves the batch and its state is
dropped (:meth:`drop_departed`) at the next ``propose`` (a preempted request restarts with
fresh state when it is rescheduled; drafts are guesses, so this never affects outputs).
"""

from __future__ import annotations

import time
from typing import Any, Callable, ClassVar

from vllm_anyorder import _compat, config, metrics
from vllm_anyorder.contract import BudgetCounting, RunnerView
from vllm_anyorder.model_executor.cpu_row_warmup import verification_rows, warm_row_counts
from vllm_anyorder.proposers.budget import StepBudget


class AnyOrderProposer:
    """Base of every proposer; a :class:`~vllm_anyorder.contract.VerificationObserver`."""

    method: ClassVar[str] = ""
    # which verified drafts the budget learns acceptance from (proposers/budget.py): None =
    # all of them; otherwise a class whose instances are a contract.BudgetCounting
    budget_counting: ClassVar[type[BudgetCounting] | None] = None

    def __init__(self, vllm_config: Any) -> None:
        from vllm_anyorder import patches

        patches.apply("verification_hook")
        patches.apply("plain_decode_steps")  # steps without drafts: vLLM's plain path
        self.vllm_config = vllm_config
        self.max_chain = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.target = None
        self.view: RunnerView | None = None  # this step's batch (set before propose)
        # the speculation budget (core/budget.py): drafts per request, zero included
        options = config.section(vllm_config.additional_config).get(self.method) or {}
        self.budget = StepBudget(options.get("budget", "auto"), self.max_chain,
                                 _compat.tp_group(), metrics.budget_snapshot_path(
                                     str(getattr(vllm_config, "instance_id", "") or "default")),
                                 counting=self.budget_counting and self.budget_counting(),
                                 stages=self.budget_stages())

    def budget_stages(self) -> Callable[[int], int] | None:
        """Drafter forwards a step whose deepest chain is ``depth`` runs, for a method whose
        drafting work grows with depth (the budget then prices each depth); None: drafting
        costs the same at any depth (the default)."""
        return None

    def load_model(self, target_model: Any) -> None:
        """Keep a handle on the target module (self-drafting methods load nothing else), and
        on a CPU engine build its matmul kernels for every row count a verification step may
        run (``model_executor/cpu_row_warmup``: else a fresh engine builds each inside its
        first requests)."""
        self.target = target_model
        sched = getattr(self.vllm_config, "scheduler_config", None)
        if sched is not None:
            warm_row_counts(target_model, verification_rows(
                int(sched.max_num_seqs), self.max_chain, int(sched.max_num_batched_tokens)))

    def batch_req_ids(self) -> list[str]:
        """Request ids of the current input batch, in the order of ``propose``'s lists."""
        return self.view.req_ids if self.view is not None else []

    def observe_verification(self, view: RunnerView, logits: Any,
                             spec_decode_metadata: Any) -> None:
        self.view = view
        counts = None if spec_decode_metadata is None else \
            list(spec_decode_metadata.num_draft_tokens)
        self.budget.verified(view.req_ids, counts)

    def drop_departed(self, table: dict[str, Any],
                      on_drop: Callable[[str, Any], None] | None = None,
                      live: set[str] | None = None) -> None:
        """Forget the entries of requests no longer in the batch (``on_drop(req_id, value)``
        first, e.g. to keep finished requests' counters); ``live``: the batch's request ids,
        if the caller has them."""
        live = set(self.batch_req_ids()) if live is None else live
        if table.keys() <= live:
            return  # nobody left (the usual step)
        for req_id in [r for r in table if r not in live]:
            value = table.pop(req_id)
            if on_drop is not None:
                on_drop(req_id, value)

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any,
                token_ids_cpu: Any, slot_mappings: Any = None) -> list[list[int]]:
        """vLLM's call: the budget learns from the step that just ran, :meth:`draft` drafts
        within :meth:`draft_caps`, the budget remembers what was drafted."""
        start = time.perf_counter()
        req_ids = self.batch_req_ids()
        self.budget.begin(req_ids, sampled_token_ids)
        chains = self.draft(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        self.budget.end(req_ids, chains, start)
        self.budget.propose_seconds += time.perf_counter() - start
        return chains

    def draft_caps(self, limits: list[int]) -> list[int]:
        """Drafts per input-batch row for the next step: each row's own limit (room left,
        configured size; 0 where it cannot draft), cut to the drafts its tokens left can use
        (:meth:`within_max_tokens`), then by the budget (``fixed``: the limits)."""
        req_ids = self.batch_req_ids()
        left = self.tokens_left(req_ids)  # looked up once per step, for both uses below
        limits = self.within_max_tokens(limits, left)
        remaining = (lambda: None if None in left else left) if self.budget.mode == "auto" \
            else None  # asked only for a closed batch (core/budget_drain): all bounded
        return self.budget.caps(req_ids, limits, remaining)

    def within_max_tokens(self, limits: list[int], left: list[int | None]) -> list[int]:
        """Each limit cut to the request's tokens left less one: with n tokens left, a step
        commits at most n (n - 1 accepted drafts and the token the verification samples), so
        rows past that are verified for nothing (a ``jacobi`` chain of 16 ran into every
        request's last step, issue 22). Outputs do not change: vLLM drops tokens past
        ``max_tokens`` anyway."""
        if len(left) != len(limits):
            return list(limits)
        return [limit if n is None else min(limit, max(0, n - 1))
                for limit, n in zip(limits, left)]

    def tokens_left(self, req_ids: list[str]) -> list[int | None]:
        """Per request: ``max_tokens`` less its output so far (the worker updated both before
        ``propose``), or None where unbounded or unknown."""
        requests = self.view.requests if self.view is not None else {}
        out: list[int | None] = []
        for req_id in req_ids:
            state = requests.get(req_id)
            params = getattr(state, "sampling_params", None)
            output = getattr(state, "output_token_ids", None)
            if params is None or params.max_tokens is None or output is None:
                out.append(None)
            else:
                out.append(max(0, params.max_tokens - len(output)))
        return out

    def draft(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any,
              token_ids_cpu: Any) -> list[list[int]]:
        """The method's drafts (request-major, input-batch order), each within its cap."""
        raise NotImplementedError
