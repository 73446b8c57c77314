"""The watch that tells a closed batch (``core/budget_drain.BatchWatch``): from each step's
request ids alone, whether nobody can take a finished request's place, and how old each
request is (the controller's young requests, ``core/budget_accept``)."""

import random

import pytest

from vllm_anyorder.core.budget_drain import BatchWatch


def test_a_batch_that_joined_together_is_closed_until_someone_joins():
    w = BatchWatch(grace=4)
    assert w.observe(["a", "b", "c"]) is False  # the step they join: not yet known
    assert w.observe(["a", "b", "c"]) is True
    assert w.observe(["a", "b", "c", "d"]) is False  # a join: open
    assert w.observe(["a", "b", "c", "d"]) is False  # joined in different steps


def test_a_seat_refilled_within_the_grace_stays_open():
    w = BatchWatch(grace=4)
    w.observe(["a"])
    w.observe(["a", "b"])
    w.observe(["a", "b", "c"])
    assert w.observe(["b", "c"]) is False  # a left
    assert w.observe(["b", "c"]) is False
    assert w.observe(["b", "c", "d"]) is False  # refilled: a server with requests waiting
    for _ in range(10):
        assert w.observe(["b", "c", "d"]) is False


def test_a_seat_left_empty_for_the_grace_closes_the_batch():
    w = BatchWatch(grace=4)
    w.observe(["a"])
    w.observe(["a", "b"])
    w.observe(["a", "b", "c"])
    states = [w.observe(["b", "c"]) for _ in range(6)]
    assert states == [False, False, False, False, True, True]
    assert w.observe(["b", "c", "e"]) is False  # a join reopens it


class _RecountingWatch:
    """BatchWatch's rule recounted from the whole batch every step (the reference)."""

    def __init__(self, grace: int) -> None:
        self.grace, self.joined, self.step, self.left_at = grace, {}, 0, None

    def observe(self, req_ids):
        self.step += 1
        new = [r for r in req_ids if r not in self.joined]
        for r in new:
            self.joined[r] = self.step
        gone = [r for r in self.joined if r not in set(req_ids)]
        for r in gone:
            del self.joined[r]
        if gone and self.left_at is None:
            self.left_at = self.step
        if new:
            self.left_at = None
            return False
        if self.left_at is not None and self.step - self.left_at >= self.grace:
            return True
        return len(set(self.joined.values())) == 1

    def young(self, req_ids, steps):
        return sum(1 for r in req_ids
                   if (self.step - self.joined[r] + 1 if r in self.joined else 0) <= steps)


@pytest.mark.parametrize("seed", range(6))
def test_the_watch_answers_as_recounting_every_step_does(seed):
    """The watch keeps what it derives from the batch until the batch changes (a step's own
    bookkeeping was a loop over every request, twice); its answers must be the recount's,
    through joins, departures, reorderings and long unchanged stretches."""
    rng = random.Random(seed)
    fast, slow = BatchWatch(grace=3), _RecountingWatch(grace=3)
    batch, made = [], 0
    for _ in range(600):
        move = rng.random()
        if move < 0.08 or not batch:
            joining = rng.randint(1, 3)
            batch = batch + [f"r{made + i}" for i in range(joining)]
            made += joining
        elif move < 0.16:
            batch = [r for r in batch if rng.random() > 0.4]
        elif move < 0.2:
            batch = rng.sample(batch, len(batch))
        ids = list(batch)
        assert fast.observe(ids) == slow.observe(ids)
        for steps in (0, 2, 8):
            assert fast.young(ids, steps) == slow.young(ids, steps)
        assert fast.young(ids[:1] + ["never-seen"], 2) == slow.young(ids[:1] + ["never-seen"], 2)
        for r in ids:
            assert fast.age(r) == slow.step - slow.joined[r] + 1
