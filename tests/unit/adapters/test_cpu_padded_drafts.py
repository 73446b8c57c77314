"""Patch ``cpu_padded_drafts``: vLLM's CPU rejection kernel must reject a padded (-1) draft
as the Triton kernel does: the request commits the recovered token at the first padded
position and nothing after it; requests without padding and greedy requests are untouched."""

import pytest
import torch

pytest.importorskip("vllm._custom_ops")

V = 8


def _call(kernel, drafts, is_greedy):
    cu = torch.tensor([3, 5])  # request 0: drafts 0..2, request 1: drafts 3..4
    n = drafts.numel()
    uniform = torch.full((V,), 1.0 / V)
    out = torch.full((2, 4), -1, dtype=torch.int64)
    kernel(out, cu, drafts, uniform.repeat(n, 1), uniform.repeat(n, 1),
           torch.tensor([[4], [1]]), torch.tensor([7, 6, 6, 5, 5]),
           torch.full((n,), 0.5, dtype=torch.float64), is_greedy, 3, V)
    return out.tolist()


@pytest.fixture(scope="module")
def kernels():
    from vllm_anyorder import _compat, patches

    patches.apply("cpu_padded_drafts")
    module = _compat.cpu_triton_utils()
    if module is None or not hasattr(module, "_rejection_random_sample_kernel_impl"):
        pytest.skip("no CPU rejection kernel in this vLLM build")
    patched = module._rejection_random_sample_kernel_impl
    return patched, getattr(patched, "__wrapped__", patched)


def test_padded_draft_is_rejected_and_the_recovered_token_committed(kernels):
    patched, original = kernels
    drafts = torch.tensor([3, -1, -1, 2, 5])
    sampled = torch.tensor([False, False])
    # p == q everywhere: every real draft is accepted; the first -1 must be rejected
    assert _call(patched, drafts, sampled) == [[3, 6, -1, -1], [2, 5, 1, -1]]
    # what the unpatched C++ kernel does (the reason for the patch): it "accepts" the -1
    assert _call(original, drafts, sampled)[0] != [3, 6, -1, -1]


def test_batches_without_padding_and_greedy_requests_are_untouched(kernels):
    patched, original = kernels
    drafts = torch.tensor([3, 4, 1, 2, 5])
    sampled = torch.tensor([False, False])
    assert _call(patched, drafts, sampled) == _call(original, drafts, sampled)
    padded = torch.tensor([3, -1, -1, 2, 5])
    greedy = torch.tensor([True, False])
    assert _call(patched, padded, greedy)[0] == \
        _call(original, padded.clamp(min=0), greedy)[0]
