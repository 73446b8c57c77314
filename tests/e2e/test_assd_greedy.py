"""The AS-ARM model classes in vLLM (both formats: Llama-based ``anyorder_llama`` and
XLNet ``XLNetLMHeadModel``, every test runs on each) and greedy `assd` on them.

* The plain model (no speculation) is the sequential reference: its logits at every
  generated position equal the pure-PyTorch reference (``model_executor/asarm.py``) for the
  same weights, also in batches that mix prompt prefills with decoding requests.
* Greedy `assd` (drafters ``self`` and ``ngram``) is token-for-token identical to it at
  batch 1 and in batches of 8+, with mixed prompt lengths, ``max_tokens`` and EOS.
* The self drafter's forward is the query stream of k future positions given the decoded
  prefix (logits equal the reference's), and no request takes more forwards than tokens.
"""

import pytest
import torch

from e2e.conftest import make_llm, shutdown

pytestmark = pytest.mark.e2e

K = 4
# small token budget: prompts are prefilled a few per step while others decode (mixed batches)
COMMON = dict(max_model_len=160, max_num_batched_tokens=160, max_num_seqs=16, max_logprobs=64)
PROMPTS = [
    "def f(x): return x",
    "a",
    "hello world, hello world, hello",
    "for i in range(10):\n    print(i)\n",
    "the quick brown fox jumps over the lazy dog",
    "x = [1, 2, 3]",
    "import os\nimport sys\n",
    "(((((",
    "def f(x): return x + 1",
    "zzzz zzzz zzzz zzzz",
    "class A:\n    pass\n" * 3,
    "0123456789" * 5,
]


@pytest.fixture(scope="module", params=["llama", "xlnet"])
def asarm64(tmp_path_factory, request):
    from asarm_models import build_tiny_asarm, build_tiny_xlnet

    build = build_tiny_asarm if request.param == "llama" else build_tiny_xlnet
    return build(tmp_path_factory.mktemp(f"asarm64-{request.param}"), vocab_size=64, seed=1,
                 std=0.3)


@pytest.fixture(scope="module")
def cond(asarm64):
    from asarm_models import Conditionals

    return Conditionals(asarm64)


@pytest.fixture(scope="module")
def engines(asarm64):
    made = {}

    def get(name):
        if name not in made:
            kw = {} if name == "base" else {
                "speculative_config": {"method": "assd", "num_speculative_tokens": K},
                "additional_config": {"anyorder": {"assd": {"drafter": name,
                                                                   "budget": "fixed"}}}}
            made[name] = make_llm(asarm64, **kw, **COMMON)
        return made[name]

    yield get
    for llm in made.values():
        shutdown(llm)


def _run(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


def _tokens(outs):
    return [list(o.outputs[0].token_ids) for o in outs]


def test_engine_settings_for_a_bidirectional_prompt(engines):
    cfg = engines("base").llm_engine.vllm_config
    assert cfg.cache_config.enable_prefix_caching is False
    assert cfg.scheduler_config.enable_chunked_prefill is False
    assert type(cfg.model_config.hf_config).__name__ in ("AnyOrderLlamaConfig",
                                                          "XLNetAsArmConfig")


def test_plain_model_logits_match_the_reference(engines, cond):
    """Every generated position's full distribution (logprobs of all 64 tokens) equals the
    reference two-stream model's query at that position given prompt + generated prefix."""
    from vllm import SamplingParams

    llm = engines("base")
    tok = llm.get_tokenizer()
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=64, ignore_eos=True)
    outs = _run(llm, PROMPTS, params)
    worst = 0.0
    for prompt, out in zip(PROMPTS, outs):
        ids = tok.encode(prompt)
        gen = list(out.outputs[0].token_ids)
        for j, (token, lp) in enumerate(zip(gen, out.outputs[0].logprobs)):
            want = torch.log_softmax(cond.logits(ids, gen[:j])[0], -1)
            got = torch.tensor([lp[i].logprob for i in range(64)], dtype=torch.float64)
            worst = max(worst, float((got - want).abs().max()))
            assert int(want.argmax()) == token
    assert worst < 2e-4, worst


@pytest.mark.parametrize("drafter", ["self", "ngram"])
def test_greedy_batch_one(engines, drafter):
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
    for prompt in PROMPTS[:3]:
        assert _tokens(_run(engines(drafter), [prompt], params)) == \
            _tokens(_run(engines("base"), [prompt], params))


@pytest.mark.parametrize("drafter", ["self", "ngram"])
def test_one_token_prompt_padded_by_vllm(engines, drafter):
    """With speculation vLLM schedules a 1-token prompt next to other requests as
    ``[token, -1 x k]``; its prompt row must not attend to the placeholders (regression:
    the first token after "a" was wrong in exactly this batch)."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for batch in (PROMPTS[:2], PROMPTS[:6]):
        assert _tokens(_run(engines(drafter), batch, params)) == \
            _tokens(_run(engines("base"), batch, params))


@pytest.mark.parametrize("drafter", ["self", "ngram"])
def test_greedy_batch_mixed_lengths_max_tokens_and_eos(engines, drafter):
    from vllm import SamplingParams

    lengths = (1, 2, 3, 7, 9, 16, 33, 48, 80, 5, 17, 64)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=i % 3 == 0)
              for i, n in enumerate(lengths)]
    want, got = _run(engines("base"), PROMPTS, params), _run(engines(drafter), PROMPTS, params)
    assert _tokens(got) == _tokens(want)
    assert [o.outputs[0].finish_reason for o in got] == [o.outputs[0].finish_reason for o in want]


def _request_stats(worker):
    drafter = worker.model_runner.drafter
    rows = list(drafter.finished) + [(r, f, t) for r, (f, t) in drafter.live.items()]
    return rows, drafter.query_forwards, drafter.rounds, drafter.rounds_first_accepted


@pytest.mark.parametrize("drafter", ["self", "ngram"])
def test_never_more_forwards_than_tokens(engines, drafter):
    """Per request: target forwards it was part of + drafting forwards it was part of <=
    tokens it generated (Theorem 1; Lemma 1 makes every drafting round commit >= 2)."""
    from vllm import SamplingParams

    llm = engines(drafter)
    _, forwards0, rounds0, first0 = llm.collective_rpc(_request_stats)[0]
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, max_tokens=n, ignore_eos=True)
              for i, n in enumerate((1, 2, 3, 5, 8, 13, 21, 34, 55, 40, 30, 20))]
    outs = _run(llm, PROMPTS, params)
    rows, query_forwards, rounds, first = llm.collective_rpc(_request_stats)[0]
    by_id = {r.rsplit("-", 1)[0]: (f, t) for r, f, t in rows}  # engine ids: "<id>-<salt>"
    for out in outs:
        forwards, tokens = by_id[out.request_id]
        assert tokens == len(out.outputs[0].token_ids)
        assert forwards <= tokens, (out.request_id, forwards, tokens)
    assert rounds > rounds0
    if drafter == "self":
        assert query_forwards > forwards0
        # Lemma 1: the first draft of every round is accepted (p_1 and q_1 are the same
        # conditional; only float rounding could separate them)
        assert first - first0 == rounds - rounds0


def test_self_drafts_are_the_query_stream_given_the_prefix(engines, cond):
    """The drafting forward's logits for positions n..n+k-1 equal the reference AS-ARM's
    queries at those positions given the decoded prefix only (each row independently)."""
    from vllm import SamplingParams

    llm = engines("self")

    def trace_on(worker):
        worker.model_runner.drafter.trace = []

    def trace_off(worker):
        trace, worker.model_runner.drafter.trace = worker.model_runner.drafter.trace, None
        return trace

    llm.collective_rpc(trace_on)
    _run(llm, PROMPTS[:6], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True))
    trace = llm.collective_rpc(trace_off)[0]
    assert len(trace) > 6
    worst = 0.0
    for entry in trace:
        prefix, plen = entry["prefix"], entry["num_prompt"]
        d = entry["logits"].shape[0]
        want = cond.logits(prefix[:plen], prefix[plen:], tuple(range(d)))
        worst = max(worst, float((torch.log_softmax(entry["logits"].double(), -1)
                                  - torch.log_softmax(want, -1)).abs().max()))
    assert worst < 2e-4, worst


# ---------------------------------------------------------------- infilling (any subset)
# sequences with masks (None): two spans; leading / long (> k) / trailing spans; a
# continuation-shaped one; many single masks; one visible token (vLLM pads it to
# [token, -1 x k] next to other requests)
INFILL = [
    [5, 6, None, None, 9, 10, None, 12],
    [None] * 3 + [7, 8, 9] + [None] * 12 + [4, 4] + [None] * 5,
    [3] * 5 + [None] * 9,
    [None if i % 3 == 1 else 10 + i for i in range(30)],
    [None, 17, None, None, None],
]


def _reference_infill(cond, seq, order=None):
    from reference.assd_reference import sequential_decode

    masked = list(order) if order is not None else [i for i, x in enumerate(seq) if x is None]
    visible = [i for i, x in enumerate(seq) if x is not None]
    out, _ = sequential_decode(cond.model, [seq[i] for i in visible], visible, masked, 0.0)
    filled = list(seq)
    for pos, tok in zip(masked, out):
        filled[pos] = tok
    return filled


@pytest.mark.parametrize("engine", ["base", "self", "ngram"])
def test_greedy_infill_equals_the_sequential_reference(engines, cond, engine):
    """Batch 1 and a batch mixing infill and continuation requests (plain AS-ARM, assd
    self and ngram): every mask is filled as sequential decoding of the reference AS-ARM
    fills it, visible tokens untouched; continuations are unchanged by the infill
    neighbours. A custom generation order (right to left) too."""
    from vllm import SamplingParams
    from vllm_anyorder import infill

    llm = engines(engine)
    want = [_reference_infill(cond, s) for s in INFILL]
    greedy = SamplingParams(temperature=0.0)
    for seq, w in zip(INFILL[:2], want):  # batch 1
        assert infill.generate(llm, [seq], greedy) == [[w]]
    reqs = [infill.make_request(s) for s in INFILL]
    reqs.append(infill.make_request(INFILL[0], order=[6, 3, 2]))
    cont = PROMPTS[:6]
    cont_params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    outs = _run(llm, [r.prompt() for r in reqs] + cont,
                [infill.sampling_params(greedy, r) for r in reqs] + [cont_params] * len(cont))
    got = [r.merge(o.outputs[0].token_ids) for r, o in zip(reqs, outs)]
    assert got == want + [_reference_infill(cond, INFILL[0], order=[6, 3, 2])]
    assert _tokens(outs[len(reqs):]) == _tokens(_run(engines("base"), cont, cont_params))


def test_infill_positions_matter(engines, cond):
    """The test above can fail: the masks' true positions change the fill. Serving the same
    visible tokens as a plain continuation (no position table) gives other tokens, and a
    continuation-shaped request is exactly the plain continuation (the special case)."""
    from vllm import SamplingParams
    from vllm_anyorder import infill

    reqs = [infill.make_request(s) for s in INFILL]
    outs = _run(engines("base"), [r.prompt() for r in reqs],
                [SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True)
                 for r in reqs])
    naive = [r.merge(o.outputs[0].token_ids) for r, o in zip(reqs, outs)]
    want = [_reference_infill(cond, s) for s in INFILL]
    assert naive[2] == want[2]  # [3] * 5 + 9 masks is a continuation
    assert sum(n != w for n, w in zip(naive, want)) >= 3


@pytest.mark.parametrize("drafter", ["self", "ngram"])
def test_infill_never_more_forwards_than_tokens(engines, drafter):
    """Theorem 1 for infill requests (greedy and sampled): per request, forwards <= masks
    filled; with ``self`` every round's first draft is accepted (Lemma 1)."""
    from vllm import SamplingParams
    from vllm_anyorder import infill

    llm = engines(drafter)
    _, _, rounds0, first0 = llm.collective_rpc(_request_stats)[0]
    reqs = [infill.make_request(s) for s in INFILL] * 2
    params = [infill.sampling_params(SamplingParams(temperature=0.0 if i % 2 else 0.8), r)
              for i, r in enumerate(reqs)]
    outs = _run(llm, [r.prompt() for r in reqs], params)
    rows, _, rounds, first = llm.collective_rpc(_request_stats)[0]
    by_id = {r.rsplit("-", 1)[0]: (f, t) for r, f, t in rows}
    for req, out in zip(reqs, outs):
        forwards, tokens = by_id[out.request_id]
        assert tokens == len(out.outputs[0].token_ids) == req.max_tokens
        assert forwards <= tokens, (out.request_id, forwards, tokens)
    assert rounds > rounds0
    if drafter == "self":
        assert first - first0 == rounds - rounds0


@pytest.mark.parametrize("extra, kw, match", [
    ([1, 1, 2], {}, "distinct"),
    ([1, 2, 9], {}, "outside the sequence"),
    ([1, 2, 3], {"max_tokens": 5}, "max_tokens"),
    ([1, 2, 3], {"ignore_eos": False}, "ignore_eos"),
    ([1, 2, 3], {"stop": ["x"]}, "stop"),
    ([1, 2, 300], {}, "outside the sequence"),
    ("1,2", {}, "list of integer"),
])
def test_malformed_infill_requests_are_refused(engines, extra, kw, match):
    """A ValueError before the request reaches the engine; the engine keeps serving."""
    from vllm import SamplingParams

    llm = engines("self")
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 3, "ignore_eos": True, **kw},
                            extra_args={"anyorder_infill": extra})
    with pytest.raises(ValueError, match=match):
        _run(llm, [{"prompt_token_ids": [4, 5, 6]}], params)
    ok = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True,
                        extra_args={"anyorder_infill": [0, 2, 5]})
    assert len(_run(llm, [{"prompt_token_ids": [4, 5, 6]}], ok)[0].outputs[0].token_ids) == 3
