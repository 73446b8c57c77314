"""The ``assd`` key equality tests again on the attention implementation ``auto`` does not
pick on this CPU for the Llama-based AS-ARM (``conftest.other_attention``; the XLNet AS-ARM
has one implementation, PyTorch, and runs the full matrix on it): the plain model's logits
== the reference two-stream model, greedy ``assd`` == no speculation (batch 1, mixed
batches, 1-token prompts), infill == the sequential reference. TP=2 runs on the
implementation ``auto`` picks (test_assd_tp.py, and over Ray in test_ray_tp.py), so it is not
run again here (94 s on an AVX2 CI machine)."""

import pytest

from e2e.conftest import attention_impls, other_attention, other_attention_fixture
from e2e.test_assd_greedy import (  # noqa: F401  (fixtures and tests collected here again)
    cond,
    engines,
    test_greedy_batch_mixed_lengths_max_tokens_and_eos,
    test_greedy_batch_one,
    test_greedy_infill_equals_the_sequential_reference,
    test_one_token_prompt_padded_by_vllm,
    test_plain_model_logits_match_the_reference,
)

pytestmark = pytest.mark.e2e
IMPL = other_attention("asarm")
_attention = other_attention_fixture("asarm")


@pytest.fixture(scope="module")
def asarm64(tmp_path_factory):
    from asarm_models import build_tiny_asarm

    return build_tiny_asarm(tmp_path_factory.mktemp("asarm64-other"), vocab_size=64, seed=1,
                            std=0.3)


def test_the_engine_runs_that_implementation(engines):
    assert attention_impls(engines("ngram")) == [[IMPL]]
