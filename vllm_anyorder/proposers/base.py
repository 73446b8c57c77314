"""Shared shape of every anyorder proposer (the ``custom_class`` contract of vLLM 0.32).

vLLM builds the proposer in each worker as ``Class(vllm_config)`` (``custom_class_proposer``),
calls ``load_model(target_model)`` (mandatory on the CPU runner) and, after each step's
bookkeeping, ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, ...)`` with
request-major lists in the runner's input-batch order. Through the ``verification_hook``
patch the proposer also sees the logits of every verified row (``observe_verification``).

Per-request state is keyed by request id and lives only while the request is in the input
batch: a request that finished, was aborted or preempted leaves the batch and its state is
dropped at the next ``propose`` (a preempted request restarts with fresh state when it is
rescheduled; drafts are guesses, so this never affects outputs).
"""

from __future__ import annotations

from typing import Any, ClassVar


class AnyOrderProposer:
    method: ClassVar[str] = ""

    def __init__(self, vllm_config: Any) -> None:
        from vllm_anyorder import patches

        patches.apply("verification_hook")
        self.vllm_config = vllm_config
        self.max_chain = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.target = None
        self._runner = None

    def load_model(self, target_model: Any) -> None:
        """Keep a handle on the target module (self-drafting methods load nothing else)."""
        self.target = target_model

    def batch_req_ids(self) -> list[str]:
        """Request ids of the current input batch, in the order of ``propose``'s lists."""
        return list(self._runner.input_batch.req_ids) if self._runner is not None else []

    def observe_verification(self, runner: Any, logits: Any, spec_decode_metadata: Any) -> None:
        self._runner = runner

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        raise NotImplementedError
