"""The ``cpu_greedy_verification`` patch (``patches/cpu_kernels``) on fake vLLM classes: which
steps it verifies itself (all greedy, nothing that changes an argmax or asks for logprobs,
logits on the CPU) and what it returns for them; every other step goes to vLLM's path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_anyorder import _compat
from vllm_anyorder.core.greedy_verify import greedy_verify
from vllm_anyorder.patches import cpu_kernels


class MinTokensLogitsProcessor:  # vLLM's class name: a no-op while min_toks is empty
    def __init__(self, min_toks):
        self.min_toks = min_toks


def greedy_meta(**changes):
    meta = dict(all_greedy=True, max_num_logprobs=None, logprob_token_ids=None,
                no_penalties=True, bad_words_token_ids={}, allowed_token_ids_mask=None,
                logitsprocs=SimpleNamespace(non_argmax_invariant=[MinTokensLogitsProcessor({})]),
                thinking_budget_state_holder=None)
    meta.update(changes)
    return SimpleNamespace(**meta)


@pytest.fixture
def sampler_cls(monkeypatch):
    class FakeRejectionSampler:
        synthetic_mode = False

        def forward(self, metadata, draft_probs, logits, sampling_metadata):
            return "vllm"

    monkeypatch.setattr(_compat, "rejection_sampler_cls", lambda: FakeRejectionSampler)
    monkeypatch.setattr(_compat, "sampler_output_cls", lambda: dict)
    cpu_kernels.apply_cpu_greedy_verification(greedy_verify)
    return FakeRejectionSampler


def test_an_all_greedy_step_commits_the_targets_tokens(sampler_cls):
    # request 0: drafts [3, 1] against argmax [3, 2] -> 3 then the correction 2;
    # request 1: draft [4] matches -> 4 and the bonus 0
    logits = torch.full((5, 6), -1.0)
    for row, token in enumerate([3, 2, 1, 4, 0]):
        logits[row, token] = 1.0
    metadata = SimpleNamespace(draft_token_ids=torch.tensor([3, 1, 4]), num_draft_tokens=[2, 1],
                               target_logits_indices=torch.tensor([0, 1, 3]),
                               bonus_logits_indices=torch.tensor([2, 4]), max_spec_len=2)
    out = sampler_cls().forward(metadata, None, logits, greedy_meta())
    assert out["sampled_token_ids"].tolist() == [[3, 2, -1], [4, 0, -1]]
    assert out["sampled_token_ids"].dtype == torch.int32 and out["logprobs_tensors"] is None


@pytest.mark.parametrize("change", [
    dict(all_greedy=False), dict(max_num_logprobs=2), dict(logprob_token_ids=[[1]]),
    dict(no_penalties=False), dict(bad_words_token_ids={0: [[5]]}),
    dict(allowed_token_ids_mask=torch.zeros(1, 6, dtype=torch.bool)),
    dict(logitsprocs=SimpleNamespace(non_argmax_invariant=[MinTokensLogitsProcessor({0: 1})])),
    dict(logitsprocs=SimpleNamespace(non_argmax_invariant=[object()])),
    dict(thinking_budget_state_holder=SimpleNamespace(has_tracked_requests=lambda: True)),
])
def test_anything_that_could_change_the_tokens_takes_vllms_path(sampler_cls, change):
    assert sampler_cls().forward(None, None, torch.zeros(2, 6), greedy_meta(**change)) == "vllm"


def test_synthetic_acceptance_and_logits_off_the_cpu_take_vllms_path(sampler_cls):
    sampler = sampler_cls()
    sampler.synthetic_mode = True
    assert sampler.forward(None, None, torch.zeros(2, 6), greedy_meta()) == "vllm"
    off_cpu = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert sampler_cls().forward(None, None, off_cpu, greedy_meta()) == "vllm"
