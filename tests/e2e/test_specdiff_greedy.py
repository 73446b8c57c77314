"""Greedy `specdiff` in vLLM is token-for-token identical to the same engine without
speculation: batch 1, batch 10 with mixed prompt lengths and max_tokens, EOS, stop strings,
prefix caching and chunked prefill on; on a random drafter (drafts mostly rejected) and on a
drafter trained on the looping model's text (drafts mostly accepted)."""

import pytest

from e2e.conftest import make_llm, shutdown, spec_metrics

pytestmark = pytest.mark.e2e

COMMON = dict(enable_prefix_caching=True, enable_chunked_prefill=True,
              max_num_batched_tokens=96, max_num_seqs=16)
GAMMA, STEPS = 8, 3

PROMPTS = [
    "def f(x): return x",
    "a",
    "hello world, hello world, hello",
    "for i in range(10):\n    print(i)\n" * 4,  # 132 chars: prefilled in chunks, > window
    "the quick brown fox jumps over the lazy dog",
    "abcdefghij klm",
    "import os\nimport sys\n",
    "(((((",
    "def f(x): return x + 1",  # shares a cached prefix with prompt 0
    "fghij klmnop\nabc",
]


@pytest.fixture(scope="module", params=["random", "cyclic"])
def pair(request):
    names = {"random": ("tiny_llama", "random_drafter"), "cyclic": ("cyclic_llama", "cyclic_drafter")}
    model, drafter = (request.getfixturevalue(n) for n in names[request.param])
    spec = {"method": "specdiff", "model": str(drafter), "num_speculative_tokens": GAMMA}
    # budget fixed: the tests below count the drafter's forwards and acceptance per step
    # (the budget's own e2e tests: test_budget_switching.py; greedy equality holds for both)
    options = {"anyorder": {"specdiff": {"steps": STEPS, "context_window": 40,
                                         "budget": "fixed"}}}
    base = make_llm(model, **COMMON)
    sd = make_llm(model, speculative_config=spec, additional_config=options, **COMMON)
    yield base, sd
    shutdown(sd)
    shutdown(base)


def _tokens(outs):
    return [list(o.outputs[0].token_ids) for o in outs]


def test_batch_one(pair):
    from vllm import SamplingParams

    base, sd = pair
    params = SamplingParams(temperature=0.0, max_tokens=64)
    for prompt in PROMPTS[:3] + PROMPTS[5:6]:
        assert _tokens(sd.generate([prompt], params, use_tqdm=False)) == _tokens(
            base.generate([prompt], params, use_tqdm=False))


def test_batch_mixed_lengths_and_max_tokens(pair):
    from vllm import SamplingParams

    base, sd = pair
    params = [SamplingParams(temperature=0.0, max_tokens=n) for n in (1, 2, 7, 9, 16, 33, 64, 80, 5, 17)]
    want = base.generate(PROMPTS, params, use_tqdm=False)
    got = sd.generate(PROMPTS, params, use_tqdm=False)
    assert _tokens(got) == _tokens(want)
    assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in want]


def test_eos_and_stop_strings(pair):
    from vllm import SamplingParams

    base, sd = pair
    free = base.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=120), use_tqdm=False)
    got = sd.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=120), use_tqdm=False)
    assert _tokens(got) == _tokens(free)
    stops = []
    for o in free:
        text = o.outputs[0].text
        stops.append(text[len(text) // 2: len(text) // 2 + 2] if len(text) > 6 else "#@")
    params = [SamplingParams(temperature=0.0, max_tokens=120, stop=[s]) for s in stops]
    want = base.generate(PROMPTS, params, use_tqdm=False)
    got = sd.generate(PROMPTS, params, use_tqdm=False)
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in want]


def test_long_generation_metrics_and_one_drafter_forward_per_step(pair, request):
    from vllm import SamplingParams

    base, sd = pair
    counts = lambda w: (w.model_runner.drafter.drafter_forwards,  # noqa: E731
                        w.model_runner.drafter.drafter_calls)
    before, (fwd_before, calls_before) = spec_metrics(sd), sd.collective_rpc(counts)[0]
    params = SamplingParams(temperature=0.0, max_tokens=150, ignore_eos=True)
    assert _tokens(sd.generate(PROMPTS, params, use_tqdm=False)) == _tokens(
        base.generate(PROMPTS, params, use_tqdm=False))
    now = spec_metrics(sd)
    drafts = now["vllm:spec_decode_num_drafts"] - before.get("vllm:spec_decode_num_drafts", 0)
    accepted = (now["vllm:spec_decode_num_accepted_tokens"]
                - before.get("vllm:spec_decode_num_accepted_tokens", 0))
    per_pos = [a - b for a, b in zip(now["vllm:spec_decode_num_accepted_tokens_per_pos"],
                                     before.get("vllm:spec_decode_num_accepted_tokens_per_pos",
                                                [0] * GAMMA))]
    assert drafts > 0 and len(per_pos) == GAMMA and sum(per_pos) == accepted
    # one drafter call per engine step for the whole batch, not per request: at most T
    # forwards each (fewer where every request's cap is under gamma, e.g. its last tokens:
    # ceil(T * depth / gamma)), and at least one
    fwd_after, calls_after = sd.collective_rpc(counts)[0]
    calls, forwards = calls_after - calls_before, fwd_after - fwd_before
    assert 0 < calls < drafts and calls <= forwards <= STEPS * calls
    assert forwards > (STEPS - 1) * calls  # most steps draft the full gamma in T forwards
    if request.node.callspec.params["pair"] == "cyclic":
        assert accepted / drafts > 4  # the trained drafter's drafts are mostly accepted
