"""The speculation budget never changes outputs: with the test hook ``budget: "cycle:..."``
each method's draft sizes switch mid-request every step (full, none, one, a few), and greedy
outputs stay token-for-token those of the same engine without speculation, at batch 1 and in
a batch of mixed lengths. (``auto``, the default, runs in every other e2e module, and here
with a drafter that is never right.)"""

import pytest

from e2e.conftest import make_llm, shutdown

pytestmark = pytest.mark.e2e

CYCLE = "cycle:5,0,1,3,0,8"
COMMON = dict(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=256)
PROMPTS = ["abc", "hello world", "klmnop\nab", "def f(x):", "zz", "ghij kl", "a b c", "p"]
LENGTHS = [40, 3, 17, 64, 1, 29, 50, 8]


def _greedy(llm, prompts, lengths):
    from vllm import SamplingParams

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in lengths]
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


_PLAIN: dict[str, tuple] = {}  # model path -> the same engine's outputs without speculation


def _plain(model):
    """Greedy outputs of ``model`` without speculation (one engine per model per module)."""
    if str(model) not in _PLAIN:
        base = make_llm(model, **COMMON)
        try:
            _PLAIN[str(model)] = (_greedy(base, PROMPTS[:1], [64]), _greedy(base, PROMPTS, LENGTHS))
        finally:
            shutdown(base)
    return _PLAIN[str(model)]


def _check(model, spec, method, options=None, budget=CYCLE):
    want_one, want = _plain(model)
    opts = {"anyorder": {method: {**(options or {}), "budget": budget}}}
    llm = make_llm(model, speculative_config=spec, additional_config=opts, **COMMON)
    try:
        assert _greedy(llm, PROMPTS[:1], [64]) == want_one
        assert _greedy(llm, PROMPTS, LENGTHS) == want
        caps = llm.collective_rpc(lambda w: w.model_runner.drafter.budget.stats())[0]
    finally:
        shutdown(llm)
    assert caps["mode"] == budget.split(":")[0]
    assert 0 < caps["steps_without_drafts"] < caps["steps"]
    return caps


def test_jacobi_switching_sizes(cyclic_llama):
    _check(cyclic_llama, {"method": "jacobi", "num_speculative_tokens": 8}, "jacobi")


def test_specdiff_switching_sizes(cyclic_llama, cyclic_drafter):
    _check(cyclic_llama, {"method": "specdiff", "model": str(cyclic_drafter),
                          "num_speculative_tokens": 8}, "specdiff", {"steps": 2})


@pytest.fixture(scope="module")
def asarm(tmp_path_factory):
    from asarm_models import build_tiny_asarm

    return build_tiny_asarm(tmp_path_factory.mktemp("asarm-budget"), vocab_size=64, seed=1,
                            std=0.3)


@pytest.mark.parametrize("drafter", ["self", "ngram"])
def test_assd_switching_sizes(asarm, drafter):
    _check(asarm, {"method": "assd", "num_speculative_tokens": 8}, "assd",
           {"drafter": drafter})


@pytest.mark.parametrize("method", ["ssd", "freedave"])
def test_dllm_switching_draft_nodes(tmp_path_factory, method):
    """Diffusion LLMs: the cap is the drafted nodes per denoising round (0 = one node, the
    stepwise forward), switched round by round; greedy and seeded sampling stay the
    engine-free stepwise decoder's."""
    from e2e.test_dllm_decoding import BLOCK, PROMPTS as IDS, STEPS, _generate, _params, _reference
    from tiny_models import build_tiny_dllm

    model = build_tiny_dllm(tmp_path_factory.mktemp(f"llada-budget-{method}"), "llada", seed=3)
    greedy, sampled = _params(), _params(0.9, seeds=[5 * i + 3 for i in range(len(IDS))])
    opts = {"block_length": BLOCK, "steps_per_block": STEPS, "budget": CYCLE}
    llm = make_llm(model, speculative_config={"method": method, "num_speculative_tokens": 4},
                   additional_config={"anyorder": {method: opts}}, max_model_len=256,
                   max_num_batched_tokens=256, max_num_seqs=8)
    try:
        got = [_generate(llm, IDS, greedy), _generate(llm, IDS[:1], greedy[:1]),
               _generate(llm, IDS, sampled)]
        caps = llm.collective_rpc(lambda w: w.model_runner.drafter.budget.stats())[0]
    finally:
        shutdown(llm)
    want = _reference(model, "llada", IDS, greedy)
    assert got == [want, want[:1], _reference(model, "llada", IDS, sampled)]
    assert caps["mode"] == "cycle" and 0 < caps["steps_without_drafts"] < caps["steps"]


def test_specdiff_auto_with_a_drafter_that_is_never_right(tiny_llama, random_drafter):
    """``auto`` where drafts are almost never accepted: outputs unchanged, and most steps
    run without drafts (the controller stops drafting and probes now and then)."""
    caps = _check(tiny_llama, {"method": "specdiff", "model": str(random_drafter),
                               "num_speculative_tokens": 8}, "specdiff", {"steps": 2}, "auto")
    assert caps["steps_without_drafts"] > caps["steps"] // 2
