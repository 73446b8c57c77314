"""JacobiProposer against fake engine objects: the vLLM adapter only marshals rows into
JacobiState calls and back, so it must behave exactly like a JacobiState driven by hand.

Fakes (shapes as in vLLM 0.32's runner):
  vllm_config  speculative_config.num_speculative_tokens, model_config.max_model_len,
               additional_config resolved by config.store
  runner       input_batch.req_ids (batch order of every per-request list)
  logits       [sum(k_i + 1), V], request-major; argmax of row j is the value we choose
  metadata     num_draft_tokens [num_reqs], draft_token_ids [sum(k_i)]
  token_ids    numpy [max_reqs, max_len], row i = request i's committed tokens

Constructing the proposer applies the verification_hook patch (imports vLLM's
GPUModelRunner once per module, a few seconds); no engine is started.
"""

from types import SimpleNamespace as NS

import numpy as np
import pytest
import torch

from vllm_anyorder import config
from vllm_anyorder.config import JacobiConfig
from vllm_anyorder.contract import RunnerView
from vllm_anyorder.core.jacobi import JacobiSettings, JacobiState
from vllm_anyorder.proposers.jacobi import JacobiProposer

V = 64  # vocabulary of the fake logits
MAX_LEN = 256
PAD = V - 1  # garbage beyond each request's length in token_ids_cpu


def make_proposer(num_spec=16, max_model_len=MAX_LEN, **options):
    additional = {}
    config.store(additional, "jacobi", JacobiConfig(**{"block_size": 8, "budget": "fixed", **options}))
    vllm_config = NS(
        speculative_config=NS(num_speculative_tokens=num_spec),
        model_config=NS(max_model_len=max_model_len),
        additional_config=additional,
    )
    return JacobiProposer(vllm_config)


def runner(*req_ids):
    return RunnerView.of(NS(input_batch=NS(req_ids=list(req_ids))))


def logits_for(rows):
    """Logits whose argmax at row j is rows[j]."""
    out = torch.zeros(len(rows), V)
    out[torch.arange(len(rows)), torch.tensor(rows, dtype=torch.long)] = 1.0
    return out


def metadata(drafts_per_req):
    flat = [t for d in drafts_per_req for t in d]
    return NS(num_draft_tokens=[len(d) for d in drafts_per_req],
              draft_token_ids=torch.tensor(flat, dtype=torch.int32))


class Batch:
    """The runner's token_ids_cpu / num_tokens_no_spec for a few requests."""

    def __init__(self, *contexts):
        self.tokens = np.full((4, MAX_LEN), PAD, dtype=np.int32)
        self.lens = []
        for i, ctx in enumerate(contexts):
            self.tokens[i, : len(ctx)] = ctx
            self.lens.append(len(ctx))

    def commit(self, i, committed):
        n = self.lens[i]
        self.tokens[i, n : n + len(committed)] = committed
        self.lens[i] = n + len(committed)

    @property
    def num_tokens(self):
        return np.array(self.lens, dtype=np.int32)


def prefill(proposer, run, batch, first_tokens):
    """Step 1: no drafts; one logits row per request; the sampled token is committed."""
    proposer.observe_verification(run, logits_for(first_tokens), None)
    for i, t in enumerate(first_tokens):
        batch.commit(i, [t])
    return proposer.propose([[t] for t in first_tokens], batch.num_tokens, batch.tokens)


def committed_rows(chain, m, salt=0):
    """argmax rows of a verification accepting m drafts, and the committed tokens."""
    m = len(chain) if m is None else m
    rows = chain[:m] + [(30 + 5 * salt + j) % (V - 1) for j in range(len(chain) + 1 - m)]
    return rows, rows[: m + 1]


def drive(p, run, batch, refs, chains, steps, cap=MAX_LEN):
    """Verification steps on the proposer and on reference JacobiStates side by side.

    steps: per step, per request, how many drafts get accepted (None: all, plus a bonus).
    cap: drafts per request the proposer may verify (step_drafts' share).
    Asserts each request keeps its state and every next chain equals the reference's."""
    req_ids = run.input_batch.req_ids
    for accepts in steps:
        greedy, committed = zip(*(committed_rows(c, m, salt=i)
                                  for i, (c, m) in enumerate(zip(chains, accepts))))
        p.observe_verification(run, logits_for(sum(greedy, [])), metadata(chains))
        for i, c in enumerate(committed):
            batch.commit(i, c)
        states = [p._states[r] for r in req_ids]
        new_chains = p.propose(list(committed), batch.num_tokens, batch.tokens)
        assert all(p._states[r] is st for r, st in zip(req_ids, states))  # kept, not restarted
        for i, ref in enumerate(refs):
            ref.advance(chains[i], greedy[i], committed[i])
        assert new_chains == [r.next_chain(min(cap, MAX_LEN - n)) for r, n in zip(refs, batch.lens)]
        chains = new_chains
    return chains


# ----------------------------------------------------------------------------- set-up
def test_settings_come_from_the_resolved_config_and_the_engine_k():
    p = make_proposer(num_spec=16, num_blocks=2, pool_size=3, spawn_ratio=0.5, recycle="off")
    assert p.settings == JacobiSettings(block_size=8, max_blocks=2, pool_size=3, spawn_ratio=0.5,
                                        max_chain=16, recycle="off")
    assert p.max_model_len == MAX_LEN


def test_the_verification_hook_is_installed_by_the_proposer():
    from vllm_anyorder import _compat, patches

    assert "verification_hook" in patches.applied()
    sample = _compat.gpu_model_runner_cls()._sample
    assert sample.__code__.co_filename.endswith("patches/runner.py")  # our wrapper ...
    assert not hasattr(sample.__wrapped__, "__wrapped__")  # ... around vLLM's, once


def test_the_hook_shows_the_drafter_the_logits_before_vllm_samples():
    from vllm_anyorder import _compat

    wrapper = _compat.gpu_model_runner_cls()._sample
    cell = wrapper.__closure__[wrapper.__code__.co_freevars.index("original")]
    original = cell.cell_contents
    assert wrapper.__wrapped__ is original  # vLLM's own _sample, wrapped once
    events = []
    fake_runner = NS(drafter=NS(observe_verification=lambda *a: events.append(("observe", a))),
                     input_batch=NS(req_ids=["a"]))
    logits, meta = logits_for([1, 2]), metadata([[1]])
    cell.cell_contents = lambda *a: events.append(("sample", a)) or "sampled"
    try:  # run the wrapper with vLLM's _sample stubbed for this one call
        assert wrapper(fake_runner, logits, meta) == "sampled"
        assert wrapper(NS(drafter=None), logits, meta) == "sampled"  # no drafter: just sample
    finally:
        cell.cell_contents = original
    args = (fake_runner, logits, meta)
    seen = (RunnerView.of(fake_runner), logits, meta)  # the drafter sees the runner's view
    assert events[:2] == [("observe", seen), ("sample", args)]
    assert [e[0] for e in events[2:]] == ["sample"]


# ----------------------------------------------------------------------------- observe
def test_observe_verification_splits_rows_per_request():
    p = make_proposer()
    drafts = [[11, 12], [21, 22, 23], []]
    greedy = [[11, 40, 41], [21, 50, 51, 52], [60]]
    p.observe_verification(runner("a", "b", "c"), logits_for(sum(greedy, [])), metadata(drafts))
    assert p._verified == {
        "a": ([11, 12], [11, 40, 41]),
        "b": ([21, 22, 23], [21, 50, 51, 52]),
        "c": ([], [60]),
    }
    assert p.batch_req_ids() == ["a", "b", "c"]


@pytest.mark.parametrize("rows,drafts,req_ids", [
    ([1, 2, 3, 4], [[5, 6]], ["a"]),  # one logits row too many
    ([1, 2], [[5, 6]], ["a"]),  # one row too few
    ([1, 2, 3], [[5, 6]], ["a", "b"]),  # metadata for fewer requests than the batch
])
def test_mismatched_logits_layout_is_ignored_safely(rows, drafts, req_ids):
    p = make_proposer()
    p.observe_verification(runner(*req_ids), logits_for(rows), metadata(drafts))
    assert p._verified == {}


def test_a_step_with_a_bad_layout_restarts_the_state():
    p = make_proposer()
    run, batch = runner("a"), Batch([1, 2, 3, 4, 5])
    chain = prefill(p, run, batch, [6])[0]
    old = p._states["a"]
    # verification of the chain with a logits tensor that does not match the metadata
    p.observe_verification(run, logits_for([0] * (len(chain) + 3)), metadata([chain]))
    batch.commit(0, [chain[0], 7])
    out = p.propose([[chain[0], 7]], batch.num_tokens, batch.tokens)
    fresh = JacobiState(p.settings, batch.tokens[0, : batch.lens[0]].tolist())
    assert p._states["a"] is not old
    assert out == [fresh.next_chain(MAX_LEN - batch.lens[0])]


# ----------------------------------------------------------------------------- propose
def test_request_without_sampled_tokens_gets_no_drafts():
    p = make_proposer()
    batch = Batch([1, 2, 3], [4, 5, 6, 7])
    p.observe_verification(runner("a", "b"), logits_for([9, 9]), None)
    batch.commit(1, [8])
    out = p.propose([[], [8]], batch.num_tokens, batch.tokens)
    assert out[0] == [] and len(out[1]) > 0
    assert p.live_request_ids == ["b"]  # a partial prefill gets no state yet


def test_batch_size_mismatch_returns_no_drafts():
    p = make_proposer()
    p.observe_verification(runner("a", "b"), logits_for([9, 9]), None)
    batch = Batch([1, 2], [3, 4])
    assert p.propose([[5]], batch.num_tokens, batch.tokens) == [[]]


def test_state_is_created_from_the_requests_own_row_of_token_ids():
    p = make_proposer(recycle="off")
    batch = Batch([1, 2, 3], [7, 8, 9])
    out = prefill(p, runner("a", "b"), batch, [4, 7])
    # "a": context [1, 2, 3, 4]: the last token never occurred before -> repeat it
    assert out[0] == [4] * 8
    # "b": context [7, 8, 9, 7]: the first iterate continues the earlier occurrence of 7
    assert out[1] == [8, 9, 7] + [7] * 5
    a, b = p._states["a"], p._states["b"]
    assert (a.base, a.last_token, b.base, b.last_token) == (4, 4, 4, 7)
    assert PAD not in out[0] + out[1]  # nothing read past the request's length


def test_steps_match_a_jacobi_state_driven_by_hand():
    p = make_proposer()
    run = runner("a", "b")
    ctx = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]]
    batch = Batch(*ctx)
    chains = prefill(p, run, batch, [5, 1])
    refs = [JacobiState(p.settings, c + [t]) for c, t in zip(ctx, [5, 1])]
    assert chains == [r.next_chain(MAX_LEN - n) for r, n in zip(refs, batch.lens)]
    # partial acceptance, full acceptance (+ bonus), immediate rejection, ...
    drive(p, run, batch, refs, chains, [[3, 1], [None, 0], [0, 2], [None, None], [6, 7]])
    assert [r.base for r in refs] == batch.lens == [p._states[r].base for r in ("a", "b")]


def test_literal_steps_with_recycling_off():
    p = make_proposer(recycle="off")  # n = 8, K = 2, spawn threshold ceil(0.85 * 8) = 7
    run, batch = runner("a"), Batch([1, 2, 3, 4])
    assert prefill(p, run, batch, [5]) == [[5] * 8]  # 5 never occurred before: repeat it
    # 2 drafts accepted, 30 recovered: the next iterate is the argmax of the later rows
    greedy = [5, 5, 30, 31, 32, 33, 34, 35, 36]
    p.observe_verification(run, logits_for(greedy), metadata([[5] * 8]))
    batch.commit(0, [5, 5, 30])
    assert p.propose([[5, 5, 30]], batch.num_tokens, batch.tokens) == [[31, 32, 33, 34, 35]]
    # the rest of the block accepted (+ bonus 40): the block completed with 9 >= 7 tokens
    # committed, so a fresh block opens and a pseudo-active one is spawned behind it
    p.observe_verification(run, logits_for([31, 32, 33, 34, 35, 40]),
                           metadata([[31, 32, 33, 34, 35]]))
    batch.commit(0, [31, 32, 33, 34, 35, 40])
    out = p.propose([[31, 32, 33, 34, 35, 40]], batch.num_tokens, batch.tokens)
    assert out == [[40] * 16]
    assert p._states["a"].block_ends == [batch.lens[0] + 8, batch.lens[0] + 16]


def test_states_of_requests_that_left_the_batch_are_dropped():
    p = make_proposer()
    batch = Batch([1, 2, 3], [4, 5, 6], [7, 8, 9])
    chains = prefill(p, runner("a", "b", "c"), batch, [10, 11, 12])
    assert p.live_request_ids == ["a", "b", "c"]
    state_b = p._states["b"]
    # "a" and "c" finished; vLLM condenses the batch: "b" is now row 0
    rows, committed = committed_rows(chains[1], 2)
    p.observe_verification(runner("b"), logits_for(rows), metadata([chains[1]]))
    solo = Batch(batch.tokens[1, : batch.lens[1]].tolist())
    solo.commit(0, committed)
    p.propose([committed], solo.num_tokens, solo.tokens)
    assert p.live_request_ids == ["b"] and p._states["b"] is state_b
    assert state_b.base == solo.lens[0]  # advanced, not restarted
    # a request id that comes back (preempted, rescheduled) starts from scratch
    again = Batch(solo.tokens[0, : solo.lens[0]].tolist(), [1, 2, 3, 10, 20])
    p.observe_verification(runner("b", "a"), logits_for([0, 0]), None)
    again.commit(0, [21])
    again.commit(1, [22])
    p.propose([[21], [22]], again.num_tokens, again.tokens)
    assert p.live_request_ids == ["a", "b"] and p._states["a"].base == 6


def test_chain_never_exceeds_num_speculative_tokens():
    # 4 blocks of 8 can hold 32 drafts, but the engine verifies at most 16 per step
    p = make_proposer(num_spec=16, num_blocks=4, recycle="off")
    run, batch = runner("a"), Batch([1, 2, 3, 4])
    chains = prefill(p, run, batch, [5])
    ref = [JacobiState(p.settings, [1, 2, 3, 4, 5])]
    assert chains == [ref[0].next_chain(MAX_LEN - 5)]
    longest_canvas = 0
    for m in (7, 6, 6, 5, None, 6):
        chains = drive(p, run, batch, ref, chains, [[m]])
        assert 0 < len(chains[0]) <= 16
        longest_canvas = max(longest_canvas, len(p._states["a"].canvas))
    assert longest_canvas > 16  # so the cap, not the iterate, bounded the chain


def test_chain_never_runs_past_max_model_len():
    p = make_proposer(max_model_len=MAX_LEN)
    run, batch = runner("a"), Batch([(7 * i) % 50 + 1 for i in range(251)])
    chains = prefill(p, run, batch, [60])  # 252 tokens: room for 4 more, the iterate has 8
    assert len(p._states["a"].canvas) == 8 and len(chains[0]) == MAX_LEN - 252 == 4
    for m, room in ((2, 1), (0, 0)):  # commit 3 -> 255 tokens, then 1 -> 256 = max_model_len
        rows, committed = committed_rows(chains[0], m)
        p.observe_verification(run, logits_for(rows), metadata(chains))
        batch.commit(0, committed)
        chains = p.propose([committed], batch.num_tokens, batch.tokens)
        assert MAX_LEN - batch.lens[0] == room and len(chains[0]) == room


def test_inconsistent_committed_length_restarts_the_state():
    p = make_proposer()
    run, batch = runner("a"), Batch([1, 2, 3, 4])
    chain = prefill(p, run, batch, [5])[0]
    old = p._states["a"]
    rows, committed = committed_rows(chain, 2)
    p.observe_verification(run, logits_for(rows), metadata([chain]))
    batch.commit(0, committed + [44])  # the runner holds one token more than committed
    out = p.propose([committed], batch.num_tokens, batch.tokens)
    new = p._states["a"]
    assert new is not old and new.base == batch.lens[0] and new.last_token == 44
    fresh = JacobiState(p.settings, batch.tokens[0, : batch.lens[0]].tolist())
    assert out == [fresh.next_chain(MAX_LEN - batch.lens[0])]


def test_more_committed_tokens_than_drafts_restarts_the_state():
    p = make_proposer()
    run, batch = runner("a"), Batch([1, 2, 3, 4])
    chain = prefill(p, run, batch, [5])[0]
    old = p._states["a"]
    p.observe_verification(run, logits_for([9] * 3), metadata([chain[:2]]))  # k = 2 seen
    committed = [9, 9, 9, 9]  # 4 > k + 1
    batch.commit(0, committed)
    out = p.propose([committed], batch.num_tokens, batch.tokens)
    assert p._states["a"] is not old and p._states["a"].base == batch.lens[0]
    assert len(out[0]) > 0


def test_propose_without_an_observation_restarts_instead_of_crashing():
    p = make_proposer()
    run, batch = runner("a"), Batch([1, 2, 3, 4])
    chain = prefill(p, run, batch, [5])[0]
    old = p._states["a"]
    batch.commit(0, [chain[0], 6])
    p.propose([[chain[0], 6]], batch.num_tokens, batch.tokens)  # observation was consumed
    assert p._states["a"] is not old and p._states["a"].base == batch.lens[0]


def test_step_drafts_shares_the_drafts_of_a_step_across_the_batch():
    # step_drafts 6 over 2 drafting requests: at most 3 drafts each; the iterates beyond the
    # cap stay in the states and steps still match JacobiStates driven by hand with that cap
    p = make_proposer(step_drafts=6)
    run = runner("a", "b")
    ctx = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8]]
    batch = Batch(*ctx)
    chains = prefill(p, run, batch, [5, 1])
    refs = [JacobiState(p.settings, c + [t]) for c, t in zip(ctx, [5, 1])]
    assert chains == [r.next_chain(3) for r in refs] and all(len(c) == 3 for c in chains)
    assert len(p._states["a"].canvas) == 8
    drive(p, run, batch, refs, chains, [[1, 3], [None, 0], [0, None], [2, 2]], cap=3)
    assert p._per_request_cap(1) == 6 and p._per_request_cap(8) == 1  # never below 1
    assert make_proposer()._per_request_cap(8) == p.max_chain  # 0: no limit


# ----------------------------------------------------------------------------- budget
def test_the_budget_cuts_chains_and_keeps_the_iterate_warm():
    """``cycle:3,0,5`` (the test hook): chains of 3, 0, 5 drafts in turn; the state advances
    through the steps without drafts and equals a reference fed the same (cut) chains."""
    p = make_proposer(budget="cycle:3,0,5")
    run, batch = runner("a"), Batch([1, 2, 3, 4, 5])
    ref = JacobiState(p.settings, [1, 2, 3, 4, 5, 6])
    chain = prefill(p, run, batch, [6])[0]
    lengths = [len(chain)]
    for step in range(5):
        greedy, committed = committed_rows(chain, min(1, len(chain)), salt=step)
        p.observe_verification(run, logits_for(greedy), metadata([chain]))
        batch.commit(0, committed)
        ref.advance(chain, greedy, committed)
        state = p._states["a"]
        chain = p.propose([committed], batch.num_tokens, batch.tokens)[0]
        assert p._states["a"] is state  # never restarted by a step without drafts
        assert chain == ref.next_chain(len(chain))
        lengths.append(len(chain))
    assert lengths == [3, 0, 5, 3, 0, 5]


def _plain_stretch(p, steps):
    """Drive request "a" through ``steps`` verifications (1 draft accepted where any); returns
    the proposer's chains, its state's base before and after each propose, and the reference
    JacobiState advanced through every step by hand."""
    run, batch = runner("a"), Batch([1, 2, 3, 4, 5])
    ref = JacobiState(p.settings, [1, 2, 3, 4, 5, 6])
    chain = prefill(p, run, batch, [6])[0]
    out = [(chain, None, None)]
    for step in range(steps):
        greedy, committed = committed_rows(chain, min(1, len(chain)), salt=step)
        p.observe_verification(run, logits_for(greedy), metadata([chain]) if chain else None)
        batch.commit(0, committed)
        ref.advance(chain, greedy, committed)
        before = p._states["a"].base
        chain = p.propose([committed], batch.num_tokens, batch.tokens)[0]
        out.append((chain, before, p._states["a"].base))
    return out, ref, batch


def test_plain_steps_leave_the_state_alone_and_drafting_folds_them_in():
    """``cycle:3,0,0,0,4``: steps without drafts before and after do not touch the state (a
    plain step costs what vLLM's does: no argmax, no state update); the next drafting step
    folds their tokens in, and its chain equals a reference advanced through every step."""
    p = make_proposer(budget="cycle:3,0,0,0,4")
    steps, ref, batch = _plain_stretch(p, 4)
    assert [len(c) for c, _, _ in steps[:4]] == [3, 0, 0, 0] and steps[4][0]
    assert steps[2][1] == steps[2][2] and steps[3][1] == steps[3][2]  # untouched
    assert steps[4][2] == batch.lens[0]  # caught up: 3 plain tokens folded in
    assert steps[4][0] == ref.next_chain(4)
    assert p._states["a"].canvas == ref.canvas and p._states["a"].block_ends == ref.block_ends


def test_a_long_plain_stretch_restarts_the_state_from_the_text(monkeypatch):
    from vllm_anyorder.proposers import jacobi as jacobi_proposer

    monkeypatch.setattr(jacobi_proposer, "CATCH_UP_MAX", 2)
    p = make_proposer(budget="cycle:3,0,0,0,4")
    steps, _, batch = _plain_stretch(p, 4)
    fresh = JacobiState(p.settings, batch.tokens[0, : batch.lens[0]].tolist())
    assert steps[4][0] == fresh.next_chain(4)  # 3 plain tokens > 2: restarted


def test_the_budget_hears_how_much_of_each_chain_was_spliced_from_the_text():
    """Positions a text n-gram was spliced over count for the budget like refined ones
    (core.jacobi_refined): the proposer reports each chain's spliced length."""
    p = make_proposer()
    batch = Batch([5, 6, 7, 5, 6, 7, 5, 6], [1, 2, 3])
    chains = prefill(p, runner("a", "b"), batch, [7, 4])
    assert p.budget.counting.fresh == {"a": p._states["a"].spliced, "b": 0}
    assert p._states["a"].spliced > 0 and chains[0][:3] == [5, 6, 7]


def test_draft_caps_hand_each_requests_tokens_left_to_an_auto_budget():
    """The base class's tokens_left: max_tokens less the output so far (closed batches,
    core/budget_drain), handed over as a callable the controller asks only for a closed batch;
    None when any request is unbounded; no callable for a fixed budget."""
    p = make_proposer(budget="auto")
    states = {"a": NS(sampling_params=NS(max_tokens=128), output_token_ids=[1] * 28),
              "b": NS(sampling_params=NS(max_tokens=16), output_token_ids=[2] * 16)}
    p.view = RunnerView.of(NS(input_batch=NS(req_ids=["a", "b"]), requests=states))
    seen = []
    p.budget.caps = lambda req_ids, limits, remaining=None: seen.append(remaining) or limits
    p.draft_caps([4, 0])
    assert seen[-1]() == [100, 0]
    states["b"].sampling_params.max_tokens = None
    p.draft_caps([4, 0])
    assert seen[-1]() is None
    fixed = make_proposer(budget="fixed")
    fixed.view = p.view
    fixed.budget.caps = lambda req_ids, limits, remaining=None: seen.append(remaining) or limits
    fixed.draft_caps([4, 0])
    assert seen[-1] is None and len(seen) == 3


def test_no_request_is_offered_drafts_past_its_last_token():
    """A request with n tokens left commits at most n in a step (n - 1 drafts and the sampled
    token): the base class cuts every limit there, in every budget mode, before the budget
    sees it (unbounded or unknown requests keep their limits)."""
    for mode in ("auto", "fixed", "cycle:16"):
        p = make_proposer(budget=mode)
        states = {"a": NS(sampling_params=NS(max_tokens=128), output_token_ids=[1] * 124),
                  "b": NS(sampling_params=NS(max_tokens=16), output_token_ids=[2] * 15),
                  "c": NS(sampling_params=NS(max_tokens=None), output_token_ids=[3] * 99)}
        p.view = RunnerView.of(NS(input_batch=NS(req_ids=["a", "b", "c", "d"]),
                                  requests=states))
        seen = []
        p.budget.caps = lambda req_ids, limits, remaining=None: seen.append(limits) or limits
        assert p.draft_caps([16, 16, 16, 16]) == [3, 0, 16, 16]
        assert seen == [[3, 0, 16, 16]]


def test_a_request_joining_a_plain_stretch_gets_its_state():
    """Plain steps skip the per-request loop only while every request holds a state: one
    that joins during them starts its own from its row of the text, and drafts from it."""
    p = make_proposer(budget="cycle:0,0,3")
    batch = Batch([1, 2, 3], [4, 5, 6, 7])
    prefill(p, runner("a"), batch, [9])  # cycle step 0: plain
    assert p.live_request_ids == ["a"]
    p.observe_verification(runner("a", "b"), logits_for([10, 11]), None)
    batch.commit(0, [10])
    batch.commit(1, [11])
    assert p.propose([[10], [11]], batch.num_tokens, batch.tokens) == [[], []]  # step 1
    assert p.live_request_ids == ["a", "b"]
    assert p._states["b"].base == batch.lens[1]  # started from its own committed row
    p.observe_verification(runner("a", "b"), logits_for([12, 13]), None)
    batch.commit(0, [12])
    batch.commit(1, [13])
    chains = p.propose([[12], [13]], batch.num_tokens, batch.tokens)  # step 2: 3 drafts each
    assert [len(c) for c in chains] == [3, 3]
