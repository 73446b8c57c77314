"""The dLLM key equality tests again on the attention implementation ``auto`` does not pick
on this CPU (``conftest.other_attention``; the full matrix runs on the other one): ssd (LLaDA
and Dream) and freedave (LLaDA) == the engine-free reference decoder (greedy at batch 6 and 1,
seeded sampling) and node logits over the paged cache == the PyTorch model. Which
implementation ran is read from the workers. ``stepwise`` is the one-node case of the same
forward, and TP=2 runs on the implementation ``auto`` picks (test_dllm_tp.py, and over Ray in
test_ray_tp.py), so neither is run again here."""

import pytest

from e2e import test_dllm_decoding as decoding
from e2e.conftest import attention_impls, other_attention, other_attention_fixture
from e2e.test_dllm_decoding import TRACES, engine, models, references  # noqa: F401  (fixtures)

pytestmark = pytest.mark.e2e
IMPL = other_attention("dllm")
# node logits checked here are this module's ssd runs', not an earlier module's
_attention = other_attention_fixture("dllm", before=TRACES.clear)


@pytest.mark.parametrize("kind,method", [("llada", "ssd"), ("llada", "freedave"),
                                         ("dream", "ssd")])
def test_outputs_equal_the_reference_decoder(engine, references, kind, method):
    assert attention_impls(engine(kind, method)) == [[IMPL]]  # the engine runs IMPL
    decoding.test_outputs_equal_the_reference_decoder(engine, references, kind, method)


@pytest.mark.parametrize("kind", ["llada", "dream"])
def test_denoising_logits_equal_the_pytorch_reference(models, kind):
    decoding.test_denoising_logits_equal_the_pytorch_reference(models, kind)
