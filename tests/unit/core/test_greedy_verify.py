"""The greedy verification rule (``core/greedy_verify``) against plain greedy decoding: a
step commits exactly the tokens that decoding the target one token at a time would."""

from __future__ import annotations

import random

from vllm_anyorder.core.greedy_verify import PLACEHOLDER, greedy_verify


def one_at_a_time(drafts: list[int], target: list[int], bonus: int) -> list[int]:
    """The reference: decode position by position; the target's token is committed, and
    decoding goes on past a position only while the draft there was that token."""
    committed = []
    for position, draft in enumerate(drafts):
        committed.append(target[position])
        if draft != target[position]:
            return committed
    return committed + [bonus]


def test_each_request_commits_what_plain_greedy_decoding_would():
    rng = random.Random(0)
    for _ in range(500):
        batch, width = rng.randint(1, 6), rng.randint(1, 9)
        num = [rng.randint(0, width - 1) for _ in range(batch)]
        target = [rng.randint(0, 3) for _ in range(sum(num))]
        # drafts that mostly match, sometimes not, sometimes padded (-1)
        drafts = [t if rng.random() < 0.7 else rng.choice([PLACEHOLDER, rng.randint(0, 3)])
                  for t in target]
        bonus = [rng.randint(0, 3) for _ in range(batch)]
        out = greedy_verify(drafts, num, target, bonus, width)
        start = 0
        for i, n in enumerate(num):
            want = one_at_a_time(drafts[start:start + n], target[start:start + n], bonus[i])
            assert out[i] == want + [PLACEHOLDER] * (width - len(want))
            start += n


def test_the_edges():
    # no drafts: the bonus token alone; a padded draft is rejected (its correction kept)
    assert greedy_verify([], [0], [], [7], 3) == [[7, -1, -1]]
    assert greedy_verify([-1, -1], [2], [5, 6], [7], 3) == [[5, -1, -1]]
    # every draft matched: all of them and the bonus; a mismatch at the last position
    assert greedy_verify([1, 2], [2], [1, 2], [9], 3) == [[1, 2, 9]]
    assert greedy_verify([1, 3], [2], [1, 2], [9], 3) == [[1, 2, -1]]
    # requests are read from their own slices of the flat lists
    assert greedy_verify([4, 5, 6], [1, 2], [4, 5, 0], [8, 9], 3) == [[4, 8, -1], [5, 0, -1]]
