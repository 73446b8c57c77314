"""A request's acceptance after a burst ends (``core/budget_accept.Acceptance``, issue 22).

Drafts are accepted in bursts (a loop found, a Jacobi iterate converged). When a burst ends,
the chain is cut near its head, so its deep positions are not judged; their counts from the
burst must still fade step by step, or every row of a long chain keeps the head's rate and the
chains stay deep for dozens of steps at a fraction of a draft accepted (jacobi, the tail of
a closed batch: 12-21 drafts a step for 2.2 accepted)."""

from vllm_anyorder.core.budget_accept import Acceptance


def _burst(acc: Acceptance, steps: int = 4) -> None:
    for _ in range(steps):
        acc.observe("r", 16, 16)  # every draft of the chain accepted


def test_counts_past_the_cut_fade_like_a_step_without_drafts():
    acc = Acceptance(16, request_decay=0.25)
    _burst(acc)
    deep = [list(c) for c in acc.requests["r"]]
    acc.observe("r", 16, 0)  # the burst ends: position 0 rejected, 1-15 never judged
    own = acc.requests["r"]
    assert own[0] == [deep[0][0] * 0.75, deep[0][1] * 0.75 + 1.0]
    for j in range(1, 16):
        assert own[j] == [deep[j][0] * 0.75, deep[j][1] * 0.75]
    relaxed = Acceptance(16, request_decay=0.25)
    _burst(relaxed)
    relaxed.relax("r")  # the same fade a step without drafts gives
    assert [c for c in own[1:]] == relaxed.requests["r"][1:]


def test_a_long_chain_is_priced_lower_each_step_after_the_burst():
    acc = Acceptance(16, request_decay=0.25)
    for other in range(40):  # an engine-wide rate that falls with depth
        acc.observe(f"o{other}", 8, other % 4)
    _burst(acc)
    tail = []
    for _ in range(4):
        acc.observe("r", 16, 0)
        gains = acc.gains("r", 16)
        tail.append(gains[15] / gains[0])  # a deep row against the first, given the head
    # the deep rows lean back on the engine-wide rate: each step lower, not the burst's 1.0
    assert all(b < a for a, b in zip(tail, tail[1:]))
    assert tail[-1] < 0.5 * tail[0]
