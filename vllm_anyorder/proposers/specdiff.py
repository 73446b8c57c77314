"""``method="specdiff"``: a masked-diffusion drafter proposes gamma tokens for an AR target.

Adapter over :mod:`vllm_anyorder.core.specdiff` (SpecDiff, Sec. 4.1 / Algorithm 1). The
drafter (MDLM or SEDD format, :mod:`vllm_anyorder.model_executor.masked_diffusion`) is loaded
on the target's device in every worker; each ``propose`` drafts for all requests of the step
together: T drafter forwards over [batch, window + gamma], fewer and narrower where the
speculation budget cuts gamma (``SpecDiffSettings.for_depth``). vLLM verifies the drafts as point
masses (custom_class passes no draft probabilities), which is what keeps sampling exact.
Nothing is kept per request.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from vllm_anyorder import config
from vllm_anyorder.core.specdiff import SpecDiffSettings, draft
from vllm_anyorder.proposers.base import AnyOrderProposer


class SpecDiffProposer(AnyOrderProposer):
    method = "specdiff"

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.cfg = config.load(vllm_config.additional_config, "specdiff")
        self.drafter = None
        self.settings: SpecDiffSettings | None = None
        # diagnostics (benchmarks, tests): denoising forwards, drafting calls, seconds
        self.drafter_forwards = 0
        self.drafter_calls = 0
        self.drafter_seconds = 0.0
        self._steps = 0

    def budget_stages(self):
        """ceil(T * depth / gamma) drafter forwards for a chain of ``depth`` (``for_depth``)."""
        return lambda depth: self.settings.for_depth(depth).steps if self.settings else 1

    def load_model(self, target_model: Any) -> None:
        from vllm_anyorder.model_executor.masked_diffusion import load_drafter

        super().load_model(target_model)
        weight = next(target_model.parameters())
        device = weight.device
        # auto: the engine's dtype (the target's weights), as vLLM's draft_model does; a bf16
        # drafter under an fp32 engine on a CPU without native bf16 cost 4x per forward
        dtype = str(weight.dtype).removeprefix("torch.") if self.cfg.dtype == "auto" \
            else self.cfg.dtype
        self.drafter = load_drafter(self.cfg.drafter, dtype=dtype, device=device)
        spec = self.drafter.spec
        gamma = self.cfg.num_draft_tokens
        window = self.cfg.context_window or spec.max_length - gamma
        self.settings = SpecDiffSettings(
            num_draft_tokens=gamma,
            steps=self.cfg.steps,
            context_window=window,
            schedule=self.cfg.schedule,
            temperature=self.cfg.temperature,
        )

    @torch.inference_mode()
    def _denoise(self, tokens: torch.Tensor, t: torch.Tensor, key_mask: torch.Tensor):
        device = self.drafter_device
        return self.drafter.token_logits(tokens.to(device), t.to(device), key_mask.to(device)).cpu()

    @property
    def drafter_device(self):
        return next(self.drafter.parameters()).device

    def draft(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu) -> list[list[int]]:
        s = self.settings
        limits = [min(s.num_draft_tokens, self.max_model_len - int(num_tokens_no_spec[i]))
                  if committed else 0  # partial prefill chunk: nothing to draft
                  for i, committed in enumerate(sampled_token_ids)]
        # the budget's cap per request; a request capped at 0 is left out of the drafter's
        # batch (no drafter forward at all when every cap is 0)
        rows, contexts, budgets = [], [], []
        for i, budget in enumerate(self.draft_caps([max(0, lim) for lim in limits])):
            if budget <= 0:
                continue
            n_ctx = int(num_tokens_no_spec[i])
            rows.append(i)
            contexts.append(token_ids_cpu[i, max(0, n_ctx - s.context_window) : n_ctx].tolist())
            budgets.append(budget)
        # Same seed sequence on every TP rank: the ranks' proposers must agree.
        generator = torch.Generator().manual_seed(self.cfg.seed + self._steps)
        self._steps += 1
        start = time.perf_counter()
        # the drafter's work follows the budget: only as many masks as the deepest cap
        depth = s.for_depth(max(budgets)) if budgets else s
        drafted, forwards = draft(
            self._denoise, contexts, depth, self.drafter.spec.mask_token_id, generator
        )
        if forwards:
            self.drafter_forwards += forwards
            self.drafter_calls += 1
            self.drafter_seconds += time.perf_counter() - start
        chains: list[list[int]] = [[] for _ in sampled_token_ids]
        for i, tokens, budget in zip(rows, drafted, budgets):
            chains[i] = tokens[:budget]
        return chains
