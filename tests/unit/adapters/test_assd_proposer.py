"""AssdProposer, its patches and the AS-ARM attention glue, against fake engine objects.

Fakes (shapes as in vLLM 0.32's V1 runner):
  vllm_config  speculative_config.num_speculative_tokens, model_config (max_model_len,
               get_vocab_size), additional_config resolved by config.store
  runner       input_batch: req_ids, sampling_metadata (temperature [R] with 0 = greedy,
               top_k / top_p [R] or None, generators {row: Generator}, all_greedy),
               block_table[0] (block_size, num_blocks_per_row, get_cpu_tensor);
               requests {req_id: (sampling_params, num_prompt_tokens)};
               attn_groups[0][0].get_metadata_builder() (records what it is asked to build)
  target       query_logits(tokens, positions, query_positions, plan, vllm_config)
No engine is started; constructing the proposer applies two runner patches (imports vLLM's
GPUModelRunner once, a few seconds).
"""

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from vllm_anyorder import config, patches
from vllm_anyorder.contract import RunnerView
from vllm_anyorder.config import AnyOrderConfigError, AssdConfig
from vllm_anyorder.core.assd import BigramDrafter

V = 16
MAX_LEN = 64
BS = 4  # block size of the fake block table


def make_proposer(k=3, drafter="self", seed=0, budget="fixed"):
    from vllm_anyorder.proposers.assd import AssdProposer

    additional = {}
    config.store(additional, "assd", AssdConfig(k=k, drafter=drafter, seed=seed, budget=budget))
    vllm_config = NS(speculative_config=NS(num_speculative_tokens=k),
                     model_config=NS(max_model_len=MAX_LEN, get_vocab_size=lambda: V),
                     additional_config=additional)
    return AssdProposer(vllm_config)


class FakeBuilder:
    def __init__(self):
        self.built = []

    def build(self, common_prefix_len, cm):
        self.built.append(cm)
        return cm


class FakeTarget(torch.nn.Module):
    """query_logits returns fixed per-position logits: row for position p = table[p % 8]."""

    def __init__(self, table):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.table, self.calls = table, []

    def query_logits(self, tokens, positions, query_positions, plan, vllm_config):
        self.calls.append((tokens.tolist(), positions.tolist(), query_positions.tolist(), plan))
        return self.table[query_positions % len(self.table)]


def sp(max_tokens=100, stop=(), min_tokens=0):
    return NS(max_tokens=max_tokens, all_stop_token_ids=set(stop), min_tokens=min_tokens)


def make_runner(reqs, temperature=None, top_k=None, top_p=None, generators=None, blocks=None):
    """reqs: list of (req_id, sampling_params, num_prompt_tokens); rows in that order."""
    n = len(reqs)
    blocks = blocks if blocks is not None else [[10 * (i + 1) + j for j in range(8)] for i in range(n)]
    table = torch.zeros(8, 16, dtype=torch.int32)
    for i, row in enumerate(blocks):
        table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    temp = None if temperature is None else torch.tensor(temperature, dtype=torch.float32)
    md = NS(temperature=temp, all_greedy=temperature is None or all(t == 0 for t in temperature),
            top_k=top_k, top_p=top_p, generators=generators or {})
    builder = FakeBuilder()
    return NS(
        input_batch=NS(
            req_ids=[r[0] for r in reqs], sampling_metadata=md,
            block_table=[NS(block_size=BS, num_blocks_per_row=np.array([len(b) for b in blocks]),
                            get_cpu_tensor=lambda: table)]),
        requests={r[0]: NS(sampling_params=r[1], num_prompt_tokens=r[2]) for r in reqs},
        attn_groups=[[NS(get_metadata_builder=lambda: builder)]],
        builder=builder,
    )


def token_rows(*seqs):
    out = np.full((8, MAX_LEN), V - 1, dtype=np.int32)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = s
    return out


def peaked_table(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, V, generator=g) * 2


def test_config_options_and_the_k1_refusal():
    assert config.parse("assd", {}, k=5) == AssdConfig(k=5)
    assert config.parse("assd", {}) == AssdConfig(k=8, drafter="ngram")  # the measured best
    assert config.parse("assd", {"drafter": "ngram"}, k=1).drafter == "ngram"
    assert config.parse("assd", {}, k=1).drafter == "ngram"
    with pytest.raises(AnyOrderConfigError, match="k = 1"):
        config.parse("assd", {"drafter": "self"}, k=1)
    with pytest.raises(AnyOrderConfigError, match="drafter"):
        config.parse("assd", {"drafter": "bigram"}, k=4)
    with pytest.raises(AnyOrderConfigError, match="unknown option"):
        config.parse("assd", {"kk": 3}, k=4)
    with pytest.raises(AnyOrderConfigError, match="come from the speculative config"):
        config.parse("assd", {"k": 3}, k=4)


def test_method_table_and_target_check(caplog):
    from vllm_anyorder import methods
    from vllm_anyorder.startup_checks import check_assd_target

    spec = methods.METHODS["assd"]
    assert methods.lookup("custom_class", spec.proposer) is spec
    llama = NS(model="m", hf_config=NS(architectures=["LlamaForCausalLM"], model_type="llama"))
    with pytest.raises(AnyOrderConfigError, match="AS-ARM"):
        check_assd_target(AssdConfig(k=4), llama)
    asarm = NS(model="m", hf_config=NS(architectures=["AnySubsetLlamaForCausalLM"],
                                       model_type="anyorder_llama"))
    check_assd_target(AssdConfig(k=4), asarm)
    with caplog.at_level("WARNING", logger="vllm_anyorder"):
        check_assd_target(AssdConfig(k=2, drafter="self"), asarm)
    assert "k > 2" in caplog.text


def test_budget_stops_at_stop_tokens_and_max_model_len():
    """Tokens left are cut once, in the base class's ``draft_caps`` (test_jacobi_proposer's
    ``test_no_request_is_offered_drafts_past_its_last_token``), not here."""
    prop = make_proposer(k=3)
    r = make_runner([("a", sp(max_tokens=10), 4), ("b", sp(max_tokens=6), 4),
                     ("c", sp(max_tokens=5), 4), ("d", sp(stop=[7]), 4),
                     ("e", sp(stop=[7], min_tokens=5), 4)])
    # n = decoded tokens; output so far = n - 4
    assert prop._budget(r.requests.get("a"), [1], 6) == 3
    assert prop._budget(r.requests.get("c"), [1], 8) == 3  # 1 remaining: the base class cuts
    assert prop._budget(r.requests.get("d"), [7], 6) == 0  # finishing at a stop token
    assert prop._budget(r.requests.get("e"), [7], 6) == 3  # ... unless min_tokens is not reached
    assert prop._budget(r.requests.get("a"), [], 6) == 0  # no new token this step
    assert prop._budget(r.requests.get("d"), [1], MAX_LEN - 2) == 1  # max_model_len


def test_self_drafting_marshals_one_forward_over_the_paged_cache():
    """One forward for the whole batch: the last token of each drafting request as a content
    row at its own slot, then k query rows at the next positions reading the prefix; greedy
    drafts are the argmax, and no q is handed (vLLM's all-greedy path reads none); a request
    whose last slot is not allocated (bonus token at a block boundary) is left out."""
    prop = make_proposer(k=3)
    target = FakeTarget(peaked_table())
    prop.load_model(target)
    # rows: a (n=6), b (n=2, 1-token prompt), c (n=9 but only 2 blocks = 8 slots allocated)
    r = make_runner([("a", sp(), 3), ("b", sp(), 1), ("c", sp(), 5)],
                    blocks=[[11, 12], [21], [31, 32]])
    prop.observe_verification(RunnerView.of(r), torch.zeros(3, V), None)
    toks = token_rows([1, 2, 3, 4, 5, 6], [7, 8], [1, 1, 1, 1, 1, 1, 1, 1, 9])
    chains = prop.propose([[6], [8], [9]], np.array([6, 2, 9]), toks)
    assert len(target.calls) == 1 and prop.query_forwards == 1
    tokens, positions, qpos, plan = target.calls[0]
    assert tokens == [6, 8] and positions == [5, 1]
    assert plan.slots.tolist() == [12 * BS + 1, 21 * BS + 1]  # block of position n-1, offset
    assert qpos == [6, 7, 8, 2, 3, 4]
    want = target.table[torch.tensor(qpos) % 8].argmax(-1).tolist()
    assert chains == [want[:3], want[3:], []]
    content, queries = r.builder.built
    assert content.causal is True and content.query_start_loc_cpu.tolist() == [0, 1, 2]
    assert content.seq_lens.tolist() == [6, 2]
    assert queries.causal is False  # every query row reads the whole prefix
    assert queries.query_start_loc_cpu.tolist() == [0, 3, 6]
    assert queries.seq_lens.tolist() == [6, 2]
    assert queries.block_table_tensor[:, 0].tolist() == [11, 21]
    assert (queries.slot_mapping == -1).all()
    assert prop.take_draft_probs() is None  # every request greedy: no q built


def test_a_batch_with_a_sampled_request_hands_q_and_one_hot_rows_for_greedy_ones():
    prop = make_proposer(k=3)
    target = FakeTarget(peaked_table())
    prop.load_model(target)
    r = make_runner([("a", sp(), 3), ("b", sp(), 1)], temperature=[0.0, 0.7],
                    blocks=[[11, 12], [21]])
    prop.observe_verification(RunnerView.of(r), torch.zeros(2, V), None)
    chains = prop.propose([[6], [8]], np.array([6, 2]), token_rows([1, 2, 3, 4, 5, 6], [7, 8]))
    req_ids, probs = prop.take_draft_probs()
    assert req_ids == ["a", "b"] and probs.shape == (2, 3, V)
    want_a = target.table[torch.tensor([6, 7, 8]) % 8].argmax(-1)
    assert chains[0] == want_a.tolist() and torch.equal(probs[0].argmax(-1), want_a)
    assert torch.equal(probs[0].sum(-1), torch.ones(3))  # greedy row: one-hot q
    assert torch.allclose(probs[1].sum(-1), torch.ones(3))  # sampled row: a distribution
    assert prop.take_draft_probs() is None  # handed over once


def test_sampled_drafts_are_draws_from_the_q_handed_over():
    """Temperature / top-k as vLLM applies them to targets: q = softmax of the top-k logits
    / T, drafts are independent draws from exactly that q (frequency test)."""
    from scipy.stats import chisquare

    table = peaked_table(1) / 2
    prop = make_proposer(k=3, seed=5)
    prop.load_model(FakeTarget(table))
    r = make_runner([("a", sp(), 3)], temperature=[0.7], top_k=torch.tensor([4]))
    toks = token_rows([1, 2, 3, 4])
    counts = np.zeros((3, V))
    for _ in range(3000):
        prop.observe_verification(RunnerView.of(r), torch.zeros(1, V), None)
        chain = prop.propose([[4]], np.array([4]), toks)[0]
        _, probs = prop.take_draft_probs()
        counts[np.arange(3), chain] += 1
    logits = table[torch.arange(4, 7) % 8] / 0.7
    kth = logits.topk(4, -1).values[:, -1:]
    want = torch.softmax(logits.masked_fill(logits < kth, -float("inf")), -1)
    assert torch.allclose(probs[0], want, atol=1e-6)
    for i in range(3):
        support = want[i] > 0
        assert counts[i][~support.numpy()].sum() == 0
        expected = want[i][support].double().numpy()
        p = chisquare(counts[i][support.numpy()], 3000 * expected / expected.sum()).pvalue
        assert p > 1e-4, (i, p)


def test_seeded_requests_draw_from_their_own_generator():
    def run():
        prop = make_proposer(k=3)
        prop.load_model(FakeTarget(peaked_table(2) / 4))
        gen = torch.Generator().manual_seed(123)
        r = make_runner([("a", sp(), 3)], temperature=[1.0], generators={0: gen})
        prop.observe_verification(RunnerView.of(r), torch.zeros(1, V), None)
        return [prop.propose([[4]], np.array([4]), token_rows([1, 2, 3, 4]))[0]
                for _ in range(5)]

    assert run() == run()


def test_ngram_drafter_follows_algorithm_2_and_forgets_finished_requests():
    prop = make_proposer(k=3, drafter="ngram")
    r = make_runner([("a", sp(), 6), ("b", sp(), 2)])
    seq_a, seq_b = [1, 2, 3, 1, 2, 3], [5, 5]
    prop.observe_verification(RunnerView.of(r), torch.zeros(2, V), None)
    chains = prop.propose([[3], [5]], np.array([6, 2]), token_rows(seq_a, seq_b))
    ref = BigramDrafter(V, dict(enumerate(seq_a)))
    assert chains[0] == ref.draft(range(6, 9), True, None)[0].tolist() == [1, 2, 3]
    assert chains[1] == [5, 5, 5]
    assert prop.take_draft_probs() is None  # all greedy: vLLM reads no q, none is built
    # next step: a grew by two tokens, b left the batch
    r2 = make_runner([("a", sp(), 6)])
    prop.observe_verification(RunnerView.of(r2), torch.zeros(1, V), None)
    seq_a += [1, 4]
    prop.propose([[1, 4]], np.array([8]), token_rows(seq_a))
    assert set(prop._bigrams) == {"a"} and prop._bigrams["a"][1] == 8
    assert dict(prop._bigrams["a"][0].pairs[1]) == {2: 2, 4: 1}
    assert {r for r, _, _ in prop.finished} == {"b"}


def test_forward_accounting_per_request():
    """Target forwards (one per step with a committed token) + drafting forwards joined."""
    prop = make_proposer(k=3)
    prop.load_model(FakeTarget(peaked_table()))
    r = make_runner([("a", sp(), 3)])
    prop.observe_verification(RunnerView.of(r), torch.zeros(1, V), None)  # prefill step
    chain = prop.propose([[4]], np.array([4]), token_rows([1, 2, 3, 4]))[0]
    assert prop.live["a"] == [2, 1]  # prefill + drafting forward, 1 token
    md = NS(num_draft_tokens=[3])
    prop.observe_verification(RunnerView.of(r), torch.zeros(4, V), md)  # verification of 3 drafts
    prop.propose([chain[:2] + [9]], np.array([7]), token_rows([1, 2, 3, 4] + chain[:2] + [9]))
    assert prop.live["a"] == [4, 4]
    assert (prop.rounds, prop.rounds_first_accepted) == (1, 1)
    assert (prop.drafted_tokens, prop.accepted_tokens) == (3, 2)


class FakeRunnerBase:
    """Stands in for GPUModelRunner in the patch tests."""

    def propose_draft_token_ids(self, *args, **kwargs):
        self._draft_probs, self._draft_prob_req_ids = None, None
        return [[1, 2]]

    def _get_spec_decode_draft_probs(self, spec_decode_metadata):
        return self._draft_probs, self._draft_prob_req_ids

    def _build_attention_metadata(self, *args, **kwargs):
        from vllm_anyorder.attention_backends import asarm_attention

        return asarm_attention.PROMPT_LENS.get()


@pytest.fixture
def fake_runner_cls(monkeypatch):
    from vllm_anyorder import _compat

    cls = type("FakeRunner", (FakeRunnerBase,), {})
    monkeypatch.setattr(_compat, "gpu_model_runner_cls", lambda: cls)
    monkeypatch.setattr(patches, "_APPLIED", set())
    return cls


def test_draft_probs_patch_hands_over_only_what_the_drafter_gives(fake_runner_cls):
    patches.apply("draft_probs")
    patches.apply("draft_probs")  # idempotent
    probs = torch.rand(1, 2, V)
    runner = fake_runner_cls()
    runner.drafter = NS(take_draft_probs=lambda: (["x"], probs))
    assert runner.propose_draft_token_ids() == [[1, 2]]
    assert runner._draft_probs is probs and runner._draft_prob_req_ids == ["x"]
    runner.drafter = NS(take_draft_probs=lambda: None)
    runner.propose_draft_token_ids()
    assert runner._draft_probs is None  # vLLM's own behaviour
    runner.drafter = NS()  # another proposer: untouched
    runner.propose_draft_token_ids()
    assert runner._draft_probs is None


def test_draft_probs_patch_gives_padded_requests_a_zero_q_row(fake_runner_cls):
    """vLLM pads a 1-token request joining running ones to [token, -1 x k]; without a q row
    for it vLLM would drop q for the whole step. Its row is zeros (its -1 drafts are always
    rejected, recovery from p); a request with real drafts but no q is left alone."""
    patches.apply("draft_probs")
    probs = torch.rand(1, 2, V)
    runner = fake_runner_cls()
    runner.drafter = NS(take_draft_probs=lambda: (["x"], probs))
    runner.input_batch = NS(req_ids=["x", "pad", "y"])
    runner._draft_probs, runner._draft_prob_req_ids = probs, ["x"]
    md = NS(draft_token_ids=torch.tensor([4, 5, -1, -1]), num_draft_tokens=[2, 2, 0])
    got, ids = runner._get_spec_decode_draft_probs(md)
    assert ids == ["x", "pad"] and torch.equal(got[0], probs[0]) and not got[1].any()
    runner._draft_probs, runner._draft_prob_req_ids = probs, ["x"]
    md = NS(draft_token_ids=torch.tensor([4, 5, 7, 8]), num_draft_tokens=[2, 0, 2])
    assert runner._get_spec_decode_draft_probs(md)[1] == ["x"]  # vLLM's fallback decides


def test_prompt_lengths_patch_scopes_the_batch_prompt_lengths(fake_runner_cls):
    from vllm_anyorder.attention_backends import asarm_attention

    patches.apply("asarm_prompt_lens", prompt_lens=asarm_attention.PROMPT_LENS)
    lens = torch.tensor([3, 1])
    runner = fake_runner_cls()
    runner.input_batch = NS(num_prompt_tokens_cpu_tensor=lens)
    assert runner._build_attention_metadata() is lens
    assert asarm_attention.PROMPT_LENS.get() is None


def _cm(query_lens, seq_lens):
    from vllm_anyorder import _compat

    qsl = torch.tensor([0] + list(np.cumsum(query_lens)), dtype=torch.int32)
    return _compat.common_attention_metadata_cls()(
        query_start_loc=qsl, query_start_loc_cpu=qsl,
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=len(query_lens),
        num_actual_tokens=int(qsl[-1]), max_query_len=max(query_lens),
        max_seq_len=max(seq_lens), block_table_tensor=torch.arange(len(query_lens))[:, None] * 10,
        slot_mapping=torch.zeros(int(qsl[-1]), dtype=torch.int64))


def test_prompt_rows_bidirectional_later_rows_causal():
    from vllm_anyorder.attention_backends.asarm_attention import _prompt_bidirectional

    # all decoding: unchanged
    cm = _cm([1, 4], [9, 12])
    assert _prompt_bidirectional(cm, torch.tensor([3, 5])) is cm
    # whole prompts only: causal off
    assert _prompt_bidirectional(_cm([3, 5], [3, 5]), torch.tensor([3, 5])).causal is False
    # a prefill next to a verification: per-request flags
    out = _prompt_bidirectional(_cm([3, 4], [3, 12]), torch.tensor([3, 5]))
    assert out.causal.tolist() == [0, 1]
    # vLLM's padded 1-token prompt [t, -1, -1, -1] and a recomputed preempted request
    # (prompt 3 + 2 outputs): prompt rows over the prompt, the rest causal, same block row
    out = _prompt_bidirectional(_cm([4, 5], [4, 5]), torch.tensor([1, 3]))
    assert out.query_start_loc_cpu.tolist() == [0, 1, 4, 7, 9]
    assert out.seq_lens.tolist() == [1, 4, 3, 5]
    assert out.causal.tolist() == [0, 1, 0, 1]
    assert out.block_table_tensor[:, 0].tolist() == [0, 0, 10, 10]
    assert out.num_reqs == 4 and out.max_query_len == 3
    # without prompt lengths: a request starting at position 0 is a whole prompt
    assert _prompt_bidirectional(_cm([3, 1], [3, 9]), None).causal.tolist() == [0, 1]


def test_query_rows_skip_rows_that_would_predict_prompt_positions():
    """A query row predicts the next position: rows before the last prompt token would
    predict visible (prompt) tokens, so vLLM's forward plans query rows only from the last
    prompt token on; decoding rows all get one; the plan is causal over the cache."""
    from vllm_anyorder.attention_backends.asarm_attention import _query_rows

    # whole prompt (5 of 5), verification (ctx 9, 4 rows), padded 1-token prompt (4 rows),
    # recompute of prompt 3 + 2 outputs
    cm = _cm([5, 4, 4, 5], [5, 13, 4, 5])
    rows, qcm = _query_rows(cm, torch.tensor([5, 6, 1, 3]))
    assert rows.tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 15, 16, 17]
    assert qcm.query_start_loc_cpu.tolist() == [0, 1, 5, 9, 12]
    assert qcm.seq_lens.tolist() == [5, 13, 4, 5] and qcm.causal is True
    assert qcm.num_actual_tokens == 12 and qcm.max_query_len == 4
