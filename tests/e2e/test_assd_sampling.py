"""At temperature > 0 (also with top-k / top-p and n > 1) `assd` samples from exactly the
AS-ARM's sequential distribution: chi-square tests of every generated position against the
exact conditionals of the reference model (same weights), on a 16-token vocabulary.

Both drafters hand their draft distributions q to vLLM's rejection sampler (patch
``draft_probs``): accept d with min(1, p/q), else sample (p - q)+. The model is chosen so that
drafts after the first are often rejected (the first is exact, Lemma 1), so the rule is
really exercised; ``test_the_test_rejects_wrong_rules`` shows that, at this sample size, the
same statistic rejects ASSD with a wrong recovery rule or a wrong q, and passes the right one.
"""

import numpy as np
import pytest
import torch

from e2e.conftest import make_llm, shutdown
from e2e.sampling import (MAX_TOKENS, N_PER_REQ, NUM_REQ, P_MIN, PROMPT, SETTING_IDS, SETTINGS,
                          assert_fits, sample)
from stats import conditional_chisquare, truncated_probs

pytestmark = pytest.mark.e2e

K = 3


@pytest.fixture(scope="module", params=["llama", "xlnet"])
def asarm16(tmp_path_factory, request):
    """Both AS-ARM formats (Llama-based, XLNet). Seed/std picked so q(x_{n+1} | prefix) and
    p(x_{n+1} | prefix, d_1) differ (~20% of second drafts rejected) and the first token is
    far from deterministic."""
    from asarm_models import build_tiny_asarm, build_tiny_xlnet

    path = tmp_path_factory.mktemp(f"asarm16-{request.param}")
    if request.param == "xlnet":  # sharper attention: ~20% of second drafts rejected
        return build_tiny_xlnet(path, vocab_size=16, seed=3, std=0.5, attn_gain=4.0,
                                tokenizer=False)
    return build_tiny_asarm(path, vocab_size=16, seed=3, std=0.5, tokenizer=False)


@pytest.fixture(scope="module")
def exact(asarm16):
    """(generated prefix, query offsets) -> exact probabilities [len(offsets), 16] after
    PROMPT + prefix, each given the prompt and the prefix only (fp64)."""
    from asarm_models import Conditionals

    cond = Conditionals(asarm16)
    cache = {}

    def probs(prefix, offsets=(0,)):
        key = (tuple(prefix), tuple(offsets))
        if key not in cache:
            cache[key] = torch.softmax(cond.logits(PROMPT, list(prefix), offsets), -1).numpy()
        return cache[key]

    return probs


# an infill request on the same model: the PROMPT's tokens visible, 4 masks in 3 spans
INFILL_SEQ = [3, None, 5, 7, None, None, 9, 3, 5, None]
INFILL_SIGMA = [i for i, x in enumerate(INFILL_SEQ) if x is None]  # left to right


@pytest.fixture(scope="module")
def exact_infill(asarm16):
    """Like ``exact`` for INFILL_SEQ: (generated prefix, offsets) -> exact probabilities of
    the masked positions sigma[len(prefix) + offset], each given the visible tokens and the
    prefix (at sigma[:len(prefix)]) only (fp64)."""
    from asarm_models import Conditionals

    model = Conditionals(asarm16).model
    visible = [i for i, x in enumerate(INFILL_SEQ) if x is not None]
    cache = {}

    def probs(prefix, offsets=(0,)):
        key = (tuple(prefix), tuple(offsets))
        if key not in cache:
            g = len(prefix)
            logits = model.content_and_query(
                torch.tensor([INFILL_SEQ[i] for i in visible] + list(prefix)),
                torch.tensor(visible + INFILL_SIGMA[:g]),
                torch.tensor([0] * len(visible) + list(range(1, g + 1))),
                torch.tensor([INFILL_SIGMA[g + o] for o in offsets])).double()
            cache[key] = torch.softmax(logits, -1).numpy()
        return cache[key]

    return probs


def _counters(worker):
    d = worker.model_runner.drafter
    return d.drafted_tokens, d.accepted_tokens, d.rounds, d.rounds_first_accepted


@pytest.fixture(scope="module", params=["self", "ngram"])
def assd_llm(asarm16, request):
    llm = make_llm(asarm16, skip_tokenizer_init=True, max_num_seqs=256,
                   speculative_config={"method": "assd", "num_speculative_tokens": K},
                   additional_config={"anyorder": {"assd": {"drafter": request.param,
                                                                "budget": "fixed"}}})
    yield llm
    shutdown(llm)


@pytest.mark.parametrize("params_kw", SETTINGS, ids=SETTING_IDS)
def test_assd_sampling_matches_sequential_decoding(assd_llm, exact, params_kw):
    drafted0, accepted0, _, _ = assd_llm.collective_rpc(_counters)[0]
    samples = sample(assd_llm, params_kw)
    assert len(samples) == NUM_REQ * N_PER_REQ and all(len(s) == MAX_TOKENS for s in samples)
    drafted, accepted, _, _ = assd_llm.collective_rpc(_counters)[0]
    drafted, accepted = drafted - drafted0, accepted - accepted0
    # drafts really were accepted (how many rounds the ngram drafter gets depends on how
    # vLLM batches the 2800 sequences: 0.2 * samples was missed once by 5 drafts) ...
    assert accepted > 0.1 * len(samples)
    assert accepted < drafted  # ... and rejected: the rule is exercised

    def cond(prefix):
        return truncated_probs(np.log(exact(prefix)[0]), **params_kw)

    assert_fits(samples, cond, redraw=lambda: sample(assd_llm, params_kw))


def _simulate(exact, rule, n, k=K, seed=0):
    """ASSD on the exact conditionals (temperature 1): each round drafts the next k
    positions independently from q (prefix only), verifies left to right with p."""
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n):
        seq = []
        while len(seq) < MAX_TOKENS:
            d = min(k, MAX_TOKENS - len(seq))
            q = exact(seq, tuple(range(d)))
            drafts = [int(rng.choice(16, p=q[i])) for i in range(d)]
            handed = q if rule != "sharpened_q" else q ** 2 / (q ** 2).sum(-1, keepdims=True)
            for i in range(d):
                p = exact(seq + drafts[:i])[0]
                if rng.random() < min(1.0, p[drafts[i]] / handed[i, drafts[i]]):
                    continue
                residual = p if rule == "recover_from_p" else np.maximum(p - handed[i], 0.0)
                seq += drafts[:i] + [int(rng.choice(16, p=residual / residual.sum()))]
                break
            else:
                seq += drafts
                if len(seq) < MAX_TOKENS:  # bonus token
                    seq.append(int(rng.choice(16, p=exact(seq)[0])))
        samples.append(tuple(seq))
    return samples


@pytest.mark.parametrize("rule", ["correct", "recover_from_p", "sharpened_q"])
def test_the_test_rejects_wrong_rules(exact, rule):
    """Same statistic, same sample size: ASSD recovering from p instead of (p - q)+, or
    handing the verifier a q other than the one drafts were drawn from, fails; ASSD passes."""
    samples = _simulate(exact, rule, NUM_REQ * N_PER_REQ)
    worst = min(conditional_chisquare(samples, pos, lambda pr: exact(pr)[0])[2]
                for pos in range(MAX_TOKENS))
    assert (worst > P_MIN) == (rule == "correct"), f"worst p-value {worst:.2e}"


@pytest.mark.parametrize("params_kw", SETTINGS, ids=SETTING_IDS)
def test_assd_infill_sampling_matches_sequential_infilling(assd_llm, exact_infill, params_kw):
    """Infilling (masks in three spans, filled left to right) samples every masked position
    from sequential infilling's conditionals; drafts are accepted and rejected."""
    from vllm import SamplingParams
    from vllm_anyorder import infill

    drafted0, accepted0, _, _ = assd_llm.collective_rpc(_counters)[0]
    req = infill.make_request(INFILL_SEQ)
    params = infill.sampling_params(SamplingParams(n=N_PER_REQ, seed=None, **params_kw), req)

    def draw_infill():
        outs = assd_llm.generate([req.prompt()] * NUM_REQ, params, use_tqdm=False)
        return [tuple(c.token_ids) for o in outs for c in o.outputs]

    samples = draw_infill()
    assert len(samples) == NUM_REQ * N_PER_REQ and all(len(s) == MAX_TOKENS for s in samples)
    assert all(req.merge(s)[i] == x for s in samples[:50]
               for i, x in enumerate(INFILL_SEQ) if x is not None)
    drafted, accepted, _, _ = assd_llm.collective_rpc(_counters)[0]
    drafted, accepted = drafted - drafted0, accepted - accepted0
    assert 0.1 * len(samples) < accepted < drafted  # the rule is exercised both ways

    def cond(prefix):
        return truncated_probs(np.log(exact_infill(prefix)[0]), **params_kw)

    assert_fits(samples, cond, redraw=draw_infill)


@pytest.mark.parametrize("rule", ["correct", "recover_from_p", "sharpened_q"])
def test_the_infill_test_rejects_wrong_rules(exact_infill, rule):
    """The infill statistic at the same sample size fails ASSD with a wrong rule."""
    samples = _simulate(exact_infill, rule, NUM_REQ * N_PER_REQ)
    worst = min(conditional_chisquare(samples, pos, lambda pr: exact_infill(pr)[0])[2]
                for pos in range(MAX_TOKENS))
    assert (worst > P_MIN) == (rule == "correct"), f"worst p-value {worst:.2e}"
