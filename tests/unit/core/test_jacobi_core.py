"""Jacobi core: literal cases, equality with greedy decoding, bounded state."""

import pytest

from reference.jacobi_reference import (
    greedy_decode, hf_forward, jacobi_decode, recurrence_forward,
)
from vllm_anyorder.core.jacobi import JacobiSettings, JacobiState, RecyclingPool, chain_capacity


def test_pool_keeps_newest_continuations_per_key_and_bounds_keys():
    pool = RecyclingPool(pool_size=2, max_len=3, max_keys=3)
    pool.add_tail([1, 2, 3, 4])  # 1->(2,3,4) 2->(3,4) 3->(4,)
    assert pool.lookup(1) == (2, 3, 4)
    pool.add_tail([1, 9])
    assert pool.lookup(1) == (9,)  # newest first
    pool.add_tail([5, 6, 7])  # adds keys 5, 6 -> the least recently used keys go
    assert len(pool._entries) <= 3 and pool.lookup(2) == ()
    assert pool.lookup(7) == ()


def test_advance_shifts_canvas_and_takes_the_next_iterate():
    s = JacobiSettings(block_size=4, max_blocks=1, recycle="off")
    st = JacobiState(s, [5, 6, 7])
    st.canvas = [10, 11, 12, 13]
    chain = st.next_chain()
    assert chain == [10, 11, 12, 13]
    # rows predict positions 3..7; first draft accepted, second rejected
    greedy = [10, 21, 22, 23, 24]
    st.advance(chain, greedy, committed=[10, 21])
    assert st.base == 5 and st.last_token == 21
    # positions 5, 6 take the new iterate (rows 2, 3); the block ends at 7
    assert st.canvas == [22, 23]
    assert st.block_ends == [7]


def test_full_acceptance_opens_a_fresh_block_and_spawn_respects_threshold():
    s = JacobiSettings(block_size=4, max_blocks=2, spawn_ratio=0.5, recycle="off")
    st = JacobiState(s, [1, 2])
    chain = st.next_chain()
    # reject the first draft: 1 token committed (< s = ceil(0.5 * 4) = 2): no spawn yet
    st.advance(chain, [50, 51, 52, 53, 54], committed=[50])
    assert len(st.block_ends) == 1 and st.block_ends[0] == 2 + 4
    assert st.canvas == [51, 52, 53]  # the next Jacobi iterate
    # the RA block completes with >= s accepted: a fresh RA block opens and, since the
    # threshold was reached, a pseudo-active block is spawned right behind it
    chain = st.next_chain()
    st.advance(chain, chain + [9], committed=chain + [9])
    assert st.base == 2 + 1 + 3 + 1
    assert st.block_ends == [st.base + 4, st.base + 8]
    assert len(st.canvas) == st.block_ends[-1] - st.base
    # K = 2 blocks is the cap
    chain = st.next_chain()
    assert len(chain) == 8
    st.advance(chain, chain[:3] + [7] * 6, committed=chain[:3] + [7])
    assert len(st.block_ends) <= 2


def test_inconsistent_verification_is_rejected():
    st = JacobiState(JacobiSettings(block_size=4), [1])
    with pytest.raises(ValueError):
        st.advance([1, 2], [1], [1])


@pytest.mark.parametrize("recycle", ["pool_first", "jacobi_first", "off"])
@pytest.mark.parametrize("n,k_blocks", [(4, 1), (8, 2), (16, 3)])
def test_reference_jacobi_equals_greedy_on_a_periodic_model(recycle, n, k_blocks):
    fwd = recurrence_forward(vocab=5)  # period-8 greedy sequences
    s = JacobiSettings(block_size=n, max_blocks=k_blocks, pool_size=4, spawn_ratio=0.5,
                       recycle=recycle, max_chain=chain_capacity(n, k_blocks))
    for prompt in ([1], [3, 4, 5], [7, 7, 7, 2, 9]):
        want = greedy_decode(fwd, prompt, 60)
        got, forwards, _ = jacobi_decode(fwd, prompt, 60, s)
        assert got == want
        assert forwards <= len(got)  # never more forwards than tokens
    if recycle != "off":
        assert forwards < 0.8 * len(got)  # recycled n-grams fast-forward the periodic text


def test_multiblock_spawns_pseudo_active_blocks():
    fwd = recurrence_forward(vocab=23)
    s = JacobiSettings(block_size=8, max_blocks=3, spawn_ratio=0.5, max_chain=24)
    _, _, state = jacobi_decode(fwd, [2, 3], 80, s)
    seen = []
    # drive again step by step and record the number of blocks in flight
    st = JacobiState(s, [2, 3])
    ctx = [2, 3]
    for _ in range(20):
        chain = st.next_chain()
        rows = fwd(ctx + chain)[len(ctx) - 1:]
        m = 0
        while m < len(chain) and chain[m] == rows[m]:
            m += 1
        st.advance(chain, rows, chain[:m] + [rows[m]])
        ctx += chain[:m] + [rows[m]]
        seen.append(len(st.block_ends))
    assert max(seen) > 1


def test_reference_jacobi_equals_greedy_on_a_transformers_llama(tiny_llama):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    fwd = hf_forward(model)
    s = JacobiSettings(block_size=6, max_blocks=2, spawn_ratio=0.5, max_chain=12)
    for prompt in ([5, 6, 7], [20, 21, 22, 23, 24, 25, 26]):
        want = greedy_decode(fwd, prompt, 30, eos=0)
        got, forwards, _ = jacobi_decode(fwd, prompt, 30, s, eos=0)
        assert got == want
        assert forwards <= len(got)


def test_core_never_imports_vllm():
    import subprocess
    import sys

    code = ("import sys, vllm_anyorder.core.jacobi; "
            "bad=[m for m in sys.modules if m=='vllm' or m.startswith('vllm.')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_text_ngram_runs_the_chain_past_the_blocks_in_flight():
    """Under the budget the chain's length is the budget's choice: a continuation found in
    the text carries on past the blocks in flight, and accepting into it keeps the state
    consistent (a fresh block opens at the new committed length)."""
    loop = [5, 6, 7, 8, 9, 10] * 4
    st = JacobiState(JacobiSettings(block_size=4, max_blocks=1, max_chain=16), loop)
    chain = st.next_chain(10)
    assert len(st.canvas) == 4 and chain == [5, 6, 7, 8, 9, 10, 5, 6, 7, 8][: len(chain)]
    assert len(chain) == 6 and st.spliced == 6  # the text holds 6 tokens after its last (9, 10)
    greedy = chain[:5] + [0, 0]  # the target keeps 5 drafts, then disagrees
    st.advance(chain, greedy, chain[:5] + [0])
    assert st.base == len(loop) + 6 and st.block_ends[-1] == st.base + len(st.canvas)
    assert st.block_ends == [st.base + 4] and st.last_token == 0
