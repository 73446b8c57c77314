"""Patches of vLLM's model runner that let an anyorder proposer see verification logits and
hand its draft probabilities to the rejection sampler (worker processes)."""

from __future__ import annotations

import functools

from vllm_anyorder import _compat
from vllm_anyorder.contract import (DraftProbsSource, RunnerView, VerificationObserver,
                                    implements)

def apply_verification_hook() -> None:
    """Show an anyorder proposer the target's logits of every verified row.

    Why: Jacobi drafts the next iterate from the target's argmax at *every* row of the last
    verification (not only the accepted ones); vLLM's custom_class ``propose`` only receives
    the committed tokens.
    The dLLM methods (``stepwise``, ``ssd``, ``freedave``) decide a whole block at this point
    (their denoising forwards run here) and must make vLLM commit it.
    What: wraps ``GPUModelRunner._sample`` (inherited by the V1 ``CPUModelRunner``): when the
    runner's drafter is a ``contract.VerificationObserver``, it is called with the step's
    ``contract.RunnerView`` (built here, the one place that reads the runner), the logits
    (``[sum(num_draft+1), V]``, request-major in input-batch order) and the spec-decode
    metadata, before vLLM samples. Jacobi and the others only read the logits; the dLLM
    proposer overwrites them in place with one-hot rows of the decided tokens.
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:3437``, called at ``:4340``) and
    0.33.0 (``:3403``, called at ``:4306``).
    Remove: when ``custom_class.propose`` receives the verification logits or argmax.
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls._sample

    @functools.wraps(original)
    def _sample(self, logits, spec_decode_metadata):
        drafter = getattr(self, "drafter", None)
        if logits is not None and implements(drafter, VerificationObserver):
            drafter.observe_verification(RunnerView.of(self), logits, spec_decode_metadata)
        return original(self, logits, spec_decode_metadata)

    cls._sample = _sample


def apply_draft_probs_handover() -> None:
    """Let an anyorder proposer hand its draft probabilities to the rejection sampler.

    Why: ``assd`` samples each draft from a known distribution q (the AS-ARM's query stream
    given the decoded prefix, or the context-bigram counts), and vLLM's rejection rule with
    that q (accept with min(1, p/q), recover from (p - q)+) is exact and accepts more than the
    point-mass rule. vLLM 0.32 only picks up draft probabilities from its own EAGLE /
    draft-model proposers; for ``custom_class`` ``_draft_probs`` stays None.
    What: wraps ``GPUModelRunner.propose_draft_token_ids`` (inherited by the V1
    ``CPUModelRunner``): after it returns, when the runner's drafter is a
    ``contract.DraftProbsSource`` and ``take_draft_probs()`` returns ``(req_ids, probs [R, K, V] float32)``, sets
    ``self._draft_probs`` / ``self._draft_prob_req_ids`` exactly as vLLM does for EAGLE, so
    the next step's ``_get_spec_decode_draft_probs`` gathers row ``req_ids.index(r)`` for each
    request r with drafts. A proposer that returns None leaves vLLM's behaviour unchanged.
    Also wraps ``_get_spec_decode_draft_probs`` (the gather): a request vLLM padded to
    ``[token, -1 x k]`` gets a zero q row instead of turning q off for the whole step
    (its -1 drafts are always rejected; recovery from (p - 0)+ = p, as without q).
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:4748`` dispatch, ``:4778``
    custom_class branch, ``:5019-5023`` EAGLE hand-over, ``:4719`` gather, reset at ``:4356``
    after ``_sample``; padding ``v1/core/sched/scheduler.py:1131-1153,1371``; -1 drafts
    rejected in ``v1/sample/rejection_sampler.py:865``) and 0.33.0 (``:4714``, ``:4744``,
    ``:4958-4962``, ``:4685``, ``:4322``; ``scheduler.py:1308-1330,1578``;
    ``rejection_sampler.py:932``).
    Remove: when ``custom_class`` proposers can return draft probabilities (e.g. vLLM calls
    ``take_last_draft_probs`` for every drafter).
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls.propose_draft_token_ids

    @functools.wraps(original)
    def propose_draft_token_ids(self, *args, **kwargs):
        drafts = original(self, *args, **kwargs)
        drafter = getattr(self, "drafter", None)
        if implements(drafter, DraftProbsSource):
            handed = drafter.take_draft_probs()
            if handed is not None:
                req_ids, probs = handed
                self._draft_probs = probs
                self._draft_prob_req_ids = list(req_ids)
        return drafts

    cls.propose_draft_token_ids = propose_draft_token_ids

    # vLLM pads a request with one token left to compute (a 1-token prompt, a resumed one)
    # that joins running requests to [token, -1 x k] (``v1/core/sched/scheduler.py:1131``);
    # with no probabilities for it, ``_get_spec_decode_draft_probs`` drops q for the WHOLE
    # step (point-mass rule: still exact, but a first draft may be rejected, breaking
    # Theorem 1). Its -1 drafts are always rejected and its recovered token comes from
    # (p - q)+, so a zero q row for it is exactly vLLM's own treatment: hand one.
    original_gather = cls._get_spec_decode_draft_probs

    @functools.wraps(original_gather)
    def _get_spec_decode_draft_probs(self, spec_decode_metadata):
        import torch

        ids = self._draft_prob_req_ids
        if self._draft_probs is not None and ids is not None and \
                implements(getattr(self, "drafter", None), DraftProbsSource):
            drafts = spec_decode_metadata.draft_token_ids.tolist()
            start, padded = 0, []
            for req_id, n in zip(self.input_batch.req_ids,
                                 spec_decode_metadata.num_draft_tokens):
                if n and req_id not in ids and all(t == -1 for t in drafts[start:start + n]):
                    padded.append(req_id)
                start += n
            if padded:
                zeros = self._draft_probs.new_zeros((len(padded),) + self._draft_probs.shape[1:])
                self._draft_probs = torch.cat([self._draft_probs, zeros])
                self._draft_prob_req_ids = list(ids) + padded
        return original_gather(self, spec_decode_metadata)

    cls._get_spec_decode_draft_probs = _get_spec_decode_draft_probs


def apply_plain_decode_steps() -> None:
    """Run an engine step in which no request has drafts on vLLM's plain decoding path.

    Why: with any speculative config vLLM builds spec-decode metadata for every step, drafts
    or not (``_prepare_inputs``: ``use_spec_decode = self.speculative_config is not None``),
    so a step whose requests all have zero drafts still samples through the rejection sampler
    (target probabilities, expand kernels, per-request bookkeeping). The speculation budget
    makes such steps common (it drafts nothing wherever drafts do not pay), and they must
    cost what a step of an engine without speculation costs.
    What: wraps ``GPUModelRunner._prepare_inputs`` (inherited by the V1 ``CPUModelRunner``):
    when the runner's drafter is a ``contract.VerificationObserver`` (an anyorder proposer),
    the model is not hybrid (vLLM keeps per-step recurrent state only for those) and
    ``scheduler_output.scheduled_spec_decode_tokens`` is empty, the original runs with
    ``self.speculative_config`` hidden (``None``; restored in ``finally``): logits indices are
    each request's last row, ``spec_decode_metadata`` is None and ``_sample`` takes vLLM's
    plain sampler, the path of an engine without speculation. The drafter's attention
    metadata is built afterwards in ``_build_attention_metadata`` with the config in place.
    Checked: vLLM 0.32.0 (``v1/worker/gpu_model_runner.py:1920`` ``_prepare_inputs``, its
    only ``speculative_config`` read at ``:2184``; called at ``:4022``; the plain path's
    bookkeeping ``:3517``); vLLM 0.33.0 (``:1924``, the read at ``:2188``).
    Remove: when vLLM skips spec-decode metadata for steps without drafts.
    """
    cls = _compat.gpu_model_runner_cls()
    original = cls._prepare_inputs

    @functools.wraps(original)
    def _prepare_inputs(self, scheduler_output, *args, **kwargs):
        spec = self.speculative_config
        if spec is None or scheduler_output.scheduled_spec_decode_tokens or \
                not implements(getattr(self, "drafter", None), VerificationObserver) or \
                getattr(self.model_config, "is_hybrid", False):
            return original(self, scheduler_output, *args, **kwargs)
        self.speculative_config = None
        try:
            return original(self, scheduler_output, *args, **kwargs)
        finally:
            self.speculative_config = spec

    cls._prepare_inputs = _prepare_inputs
