"""Tensor parallel 2 (mp executor, one core per rank): greedy `assd` equals the
single-process AS-ARM without speculation, and at temperature > 0 both ranks draw the same
drafts and verify them alike (the scheduler only sees rank 0's drafts; each rank samples
with its own copy of the draft probabilities)."""

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = [pytest.mark.e2e, pytest.mark.serial]  # TP ranks: a core each

PROMPTS = ["abc", "hello world", "klmnop\nab", "def f(x):", "zz", "ghij kl", "a b c", "p"]
INFILL = [[None, 20, 21, None, None, 30] + [None] * 9 + [40], [7, 8, None, 9] + [None] * 6]


@pytest.fixture(scope="module", params=["llama", "xlnet"])
def asarm(tmp_path_factory, request):
    """Both AS-ARM formats (XLNet: one of its 2 heads and half the feed-forward per rank)."""
    from asarm_models import build_tiny_asarm, build_tiny_xlnet

    path = tmp_path_factory.mktemp(f"asarm_tp-{request.param}")
    if request.param == "xlnet":
        return build_tiny_xlnet(path, vocab_size=64, attn_gain=2.0)
    return build_tiny_asarm(path, vocab_size=64, kv_heads=2)


def _counters(worker):
    d = worker.model_runner.drafter
    return d.query_forwards, d.rounds, d.drafted_tokens, d.accepted_tokens


def test_tp2_assd_equals_single_process(asarm, monkeypatch):
    """Continuations and infill requests."""
    from vllm import SamplingParams
    from vllm_anyorder import infill

    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    greedy = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    llm = make_llm(asarm)
    try:
        want = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
        want_infill = infill.generate(llm, INFILL, greedy)
    finally:
        shutdown(llm)
    llm = make_llm(asarm, tensor_parallel_size=2,
                   speculative_config={"method": "assd", "num_speculative_tokens": 4},
                   additional_config={"anyorder": {"assd": {"drafter": "self"}}})  # the self drafter: its query forwards
    try:
        got = [list(o.outputs[0].token_ids) for o in llm.generate(PROMPTS, greedy, use_tqdm=False)]
        got_infill = infill.generate(llm, INFILL, greedy)
        sampled = SamplingParams(temperature=1.0, max_tokens=32, ignore_eos=True, n=2)
        llm.generate(PROMPTS, sampled, use_tqdm=False)
        infill.generate(llm, INFILL, sampled)
        counters = llm.collective_rpc(_counters)
    finally:
        shutdown(llm)
    assert got == want and got_infill == want_infill
    assert len(counters) == 2 and counters[0] == counters[1] and counters[0][0] > 0
