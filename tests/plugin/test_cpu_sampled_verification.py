"""The ``cpu_sampled_verification`` patch (``patches/cpu_kernels``) on fake vLLM classes: which
steps it verifies itself (some request sampled, seeded or not, nothing beyond temperature /
top-k / top-p shaping the distributions, logits on the CPU), how it lays out each row's
distribution for ``core.sampled_verify``, and that every other step goes to vLLM's path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_anyorder import _compat
from vllm_anyorder.patches import cpu_kernels


class MinTokensLogitsProcessor:  # vLLM's class name: a no-op while min_toks is empty
    def __init__(self, min_toks):
        self.min_toks = min_toks


def sampled_meta(**changes):
    meta = dict(all_greedy=False, temperature=torch.tensor([0.5, 0.0]), top_k=None, top_p=None,
                generators={}, max_num_logprobs=None, logprob_token_ids=None, no_penalties=True,
                bad_words_token_ids={}, allowed_token_ids_mask=None,
                logitsprocs=SimpleNamespace(argmax_invariant=[],
                                            non_argmax_invariant=[MinTokensLogitsProcessor({})]),
                thinking_budget_state_holder=None)
    meta.update(changes)
    return SimpleNamespace(**meta)


@pytest.fixture
def calls(monkeypatch):
    class FakeRejectionSampler:
        synthetic_mode = False

        def forward(self, metadata, draft_probs, logits, sampling_metadata):
            return "vllm"

    seen = []

    def fake_rule(drafts, counts, scores, greedy, **kw):
        seen.append(dict(drafts=drafts.tolist(), counts=counts, scores=scores, greedy=greedy,
                         **kw))
        return [[7, -1, -1]] * len(counts)

    monkeypatch.setattr(_compat, "rejection_sampler_cls", lambda: FakeRejectionSampler)
    monkeypatch.setattr(_compat, "sampler_output_cls", lambda: dict)
    cpu_kernels.apply_cpu_sampled_verification(fake_rule)
    return FakeRejectionSampler, seen


# request 0 (T 0.5): drafts [3, 1] at rows 0, 1, bonus row 2; request 1 (greedy): draft [4]
# at row 3, bonus row 4
METADATA = SimpleNamespace(draft_token_ids=torch.tensor([3, 1, 4]), num_draft_tokens=[2, 1],
                           target_logits_indices=torch.tensor([0, 1, 3]),
                           bonus_logits_indices=torch.tensor([2, 4]), max_spec_len=2)


def test_a_sampled_step_gets_each_rows_tempered_logits(calls):
    cls, seen = calls
    logits = torch.randn(5, 6)
    out = cls().forward(METADATA, None, logits, sampled_meta())
    assert out["sampled_token_ids"].tolist() == [[7, -1, -1]] * 2
    assert out["sampled_token_ids"].dtype == torch.int32 and out["logprobs_tensors"] is None
    (call,) = seen
    assert call["drafts"] == [3, 1, 4] and call["counts"] == [2, 1]
    assert call["greedy"] == [False, True]
    assert call["target_rows"] == [0, 1, 3] and call["bonus_rows"] == [2, 4]
    assert call["argmax"] == logits.argmax(dim=-1).tolist()
    torch.testing.assert_close(call["scores"], torch.cat([logits[:3] / 0.5, logits[3:]]))


def test_seeded_requests_hand_their_generators_to_the_rule(calls):
    cls, seen = calls
    generators = {0: torch.Generator()}
    cls().forward(METADATA, None, torch.randn(5, 6), sampled_meta(generators=generators))
    assert seen[0]["generators"] is generators


def test_seeded_requests_without_drafts_are_drawn_by_vllms_bonus_sampler(calls):
    """As on a step where no request drafts, so their generators advance alike either way."""
    cls, seen = calls
    drawn = []

    def topk_topp_sampler(logits, generators, k, p):
        drawn.append((logits, generators, k.tolist(), p))
        return torch.tensor([9] * logits.shape[0]), None

    sampler = cls()
    sampler.sampler = SimpleNamespace(topk_topp_sampler=topk_topp_sampler)
    # request 0 (T 0.5, seeded): no drafts, bonus row 0; request 1 (T 0.25, seeded): draft
    # [2] at row 1, bonus row 2; request 2 (T 0.5, unseeded): no drafts, bonus row 3
    metadata = SimpleNamespace(draft_token_ids=torch.tensor([2]), num_draft_tokens=[0, 1, 0],
                               target_logits_indices=torch.tensor([1]),
                               bonus_logits_indices=torch.tensor([0, 2, 3]), max_spec_len=1)
    logits = torch.randn(4, 6)
    generators = {0: torch.Generator(), 1: torch.Generator()}
    sampler.forward(metadata, None, logits, sampled_meta(
        temperature=torch.tensor([0.5, 0.25, 0.5]), generators=generators,
        top_k=torch.tensor([3, 4, 5])))
    ((rows, keyed, k, p),) = drawn
    torch.testing.assert_close(rows, logits[[0]] / 0.5)  # tempered, not yet truncated
    assert keyed == {0: generators[0]} and k == [3] and p is None
    assert seen[0]["drawn"] == {0: 9} and seen[0]["generators"] is generators


def test_top_k_and_top_p_are_vllms_own_masks(calls, monkeypatch):
    cls, seen = calls
    masked = []
    monkeypatch.setattr(_compat, "apply_top_k_top_p",
                        lambda x, k, p: masked.append((k.tolist(), p)) or x)
    cls().forward(METADATA, None, torch.randn(5, 6), sampled_meta(top_k=torch.tensor([2, 3])))
    assert masked == [([2, 2, 2, 3, 3], None)]  # each row gets its request's k


@pytest.mark.parametrize("change", [
    dict(all_greedy=True), dict(max_num_logprobs=2),
    dict(logprob_token_ids={0: [1]}), dict(no_penalties=False),
    dict(bad_words_token_ids={0: [[5]]}),
    dict(allowed_token_ids_mask=torch.zeros(2, 6, dtype=torch.bool)),
    dict(logitsprocs=SimpleNamespace(argmax_invariant=[object()], non_argmax_invariant=[])),
    dict(logitsprocs=SimpleNamespace(argmax_invariant=[],
                                     non_argmax_invariant=[MinTokensLogitsProcessor({0: 1})])),
    dict(thinking_budget_state_holder=SimpleNamespace(has_tracked_requests=lambda: True)),
])
def test_anything_beyond_temperature_and_truncation_takes_vllms_path(calls, change):
    cls, seen = calls
    assert cls().forward(METADATA, None, torch.zeros(5, 6), sampled_meta(**change)) == "vllm"
    assert not seen


def test_synthetic_acceptance_and_logits_off_the_cpu_take_vllms_path(calls):
    cls, _ = calls
    sampler = cls()
    sampler.synthetic_mode = True
    assert sampler.forward(METADATA, None, torch.zeros(5, 6), sampled_meta()) == "vllm"
    off_cpu = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert cls().forward(METADATA, None, off_cpu, sampled_meta()) == "vllm"
