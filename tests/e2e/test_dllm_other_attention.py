"""The dLLM key equality tests again on the attention implementation ``auto`` does not pick
on this CPU (``conftest.other_attention``; the full matrix runs on the other one):
stepwise / ssd / freedave == the engine-free reference decoder (LLaDA and Dream, greedy at
batch 6 and 1, seeded sampling), node logits over the paged cache == the PyTorch model, and
TP=2. Which implementation ran is read from the workers."""

import pytest

from e2e.conftest import attention_impls, other_attention, other_attention_fixture
from e2e.test_dllm_decoding import (  # noqa: F401  (fixtures and tests collected here again)
    TRACES,
    engine,
    models,
    references,
    test_outputs_equal_the_reference_decoder,
)
from e2e.test_dllm_decoding import (  # noqa: F401  (collected after the test above: its traces)
    test_denoising_logits_equal_the_pytorch_reference,
)
from e2e.test_dllm_tp import test_tp2_dllm_equals_the_reference  # noqa: F401

pytestmark = pytest.mark.e2e
IMPL = other_attention("dllm")
# node logits checked here are this module's ssd runs', not an earlier module's
_attention = other_attention_fixture("dllm", before=TRACES.clear)


def test_the_engine_runs_that_implementation(engine):
    assert attention_impls(engine("llada", "ssd")) == [[IMPL]]
